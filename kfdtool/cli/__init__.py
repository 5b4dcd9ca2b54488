"""kfdtool command line: `kfdtool [--sim NAME | --sysfs-root DIR] COMMAND ...`.

Every failure a user can cause ends as one line on stderr and a non-zero exit code.
"""
import argparse
import importlib
import sys

from .. import __version__
from ..errors import Error
from .argtypes import non_empty, parse_command_line
from .commands import COMMANDS
from .context import Context

DESCRIPTION = "Inspect and control AMD GPU queues through the Linux KFD driver (/dev/kfd)."
EPILOG = """examples:
  kfdtool demo                          # everything below, on a simulated 8x MI308X host
  kfdtool topology                      # GPUs as KFD sees them
  kfdtool queues                        # KFD processes and their queues (no privileges needed)
  kfdtool cwsr --probe --pid 1234       # can its queues be preempted with their waves saved?
  kfdtool preempt --pid 1234 --for 1s   # suspend them for a second (CWSR), then resume
  kfdtool --sim mi308x queues           # the same against a simulated machine

environment:
  KFDTOOL_SYSFS_ROOT   read sysfs here instead of /sys (as --sysfs-root)
  KFDTOOL_SIM_DIR      where simulated machines keep their trees and sockets
                       (default $XDG_RUNTIME_DIR/kfdtool-sim, else /dev/shm/kfdtool-sim-UID)
  KFDTOOL_RUN_DIR      where `preempt` records which queues it holds, read by `queues`
                       (default /run/kfdtool as root, else /tmp/kfdtool-run-UID)
"""
GLOBAL_OPTIONS_WITH_VALUE = ("--sim", "--sysfs-root")


def command_module(name):
    return importlib.import_module(f".{COMMANDS[name][0]}", __name__)


def _chosen_command(argv):
    """The first positional argument that is not a global option's value, if it names a command."""
    tokens = iter(argv)
    for token in tokens:
        if token in GLOBAL_OPTIONS_WITH_VALUE:
            next(tokens, None)
        elif not token.startswith("-"):
            return token if token in COMMANDS else None
    return None


def build_parser(argv=None):
    """The parser, with only the command named in `argv` (default sys.argv) built in full: the
    others are listed with their help, their modules not imported (~40 ms of start-up, an eighth
    of a 1,000-process `kfdtool queues --json`). With no command named, all are built."""
    chosen = _chosen_command(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="kfdtool", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"kfdtool {__version__}")
    parser.add_argument("--wide", action="store_true",
                        help="every table column, however wide the terminal (narrow terminals drop the least "
                             "important columns; identifiers are never cut)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--sim", metavar="NAME", type=non_empty, help="use the simulated machine NAME (see `kfdtool sim list`)")
    where.add_argument("--sysfs-root", metavar="DIR", type=non_empty,
                       help="read sysfs from DIR instead of /sys (also: KFDTOOL_SYSFS_ROOT)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")    # required: see parse_command_line
    built = set()
    for name, (module, help_text) in COMMANDS.items():
        if chosen is None or name == chosen or module == COMMANDS[chosen][0]:
            if module not in built:
                command_module(name).add_parser(sub)
                built.add(module)
        else:
            sub.add_parser(name, help=help_text)
    return parser


def main(argv=None):
    if sys.stdout is None:                    # started with stdout closed (`>&-`): nowhere to answer
        print("kfdtool: standard output is closed", file=sys.stderr)
        return 1
    parser = build_parser(argv)
    args = parse_command_line(parser, argv)
    if args.wide:
        from . import render
        render.WIDE = True
    try:
        ctx = Context.from_args(args)
        return args.run(args, ctx)
    except (Error, ValueError) as e:
        print(f"kfdtool: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        raise                                 # our output's reader went away: entry.run, quietly
    except OSError as e:                      # an unreadable or looping directory in a sysfs tree, ...
        where = f"{e.filename}: " if e.filename else ""
        print(f"kfdtool: {where}{e.strerror or e}", file=sys.stderr)
        return 1
