"""kfdtool: pure-Python tools for the Linux AMD KFD driver (/dev/kfd)."""
__version__ = "0.1.0"
