from kfdtool.entry import xsched_lv3

xsched_lv3()
