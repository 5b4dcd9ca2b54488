"""Where the `kfdtool` and `xsched-lv3` commands (and `python -m` of either package) start.

Ctrl-C ends a command with exit status 130 and no traceback, also in the tens of milliseconds while
its modules are still being imported (a console script imports its `main` before calling it, outside
any handler in there). This module imports nothing of either package, so what is left uncovered is
the interpreter's own start-up and, for `python -m xsched_lv3`, that package's `__init__`, which
Python imports before its `__main__` (the console scripts do not).
"""
import importlib
import sys


def run(module, argv=None):
    """`module`.main(argv), its import included; 130 if interrupted."""
    try:
        return importlib.import_module(module).main(argv)
    except KeyboardInterrupt:
        return 130


def kfdtool():
    sys.exit(run("kfdtool.cli"))


def xsched_lv3():
    sys.exit(run("xsched_lv3.cli"))
