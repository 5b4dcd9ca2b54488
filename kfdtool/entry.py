"""Where the `kfdtool` and `xsched-lv3` commands (and `python -m` of either package) start.

Ctrl-C ends a command with exit status 130 and no traceback, also in the tens of milliseconds while
its modules are still being imported (a console script imports its `main` before calling it, outside
any handler in there). This module imports nothing of either package, so what is left uncovered is
the interpreter's own start-up and, for `python -m xsched_lv3`, that package's `__init__`, which
Python imports before its `__main__` (the console scripts do not).
"""
import importlib
import os
import sys

# A reader that went away (`kfdtool queues | head -1`): no message, and status 1, as rich's console
# ends a command whose table could not be written (Console.on_broken_pipe, after Python's own advice
# in the signal module's "Note on SIGPIPE"): one status whichever way the output was written
CLOSED_PIPE_STATUS = 1


def run(module, argv=None):
    """`module`.main(argv), its import included; 130 if interrupted; quietly 1 if its standard
    output is a pipe whose reader has gone."""
    try:
        code = importlib.import_module(module).main(argv)
        if sys.stdout is not None:
            sys.stdout.flush()         # a closed pipe shows here, not in the interpreter's exit
        return code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # what is still buffered would raise again when the interpreter exits: it goes nowhere
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return CLOSED_PIPE_STATUS


def kfdtool():
    sys.exit(run("kfdtool.cli"))


def xsched_lv3():
    sys.exit(run("xsched_lv3.cli"))
