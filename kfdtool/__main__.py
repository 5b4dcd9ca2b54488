from .entry import kfdtool

kfdtool()
