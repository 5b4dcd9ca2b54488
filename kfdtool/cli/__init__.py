"""kfdtool command line: `kfdtool [--sim NAME | --sysfs-root DIR] COMMAND ...`.

Every failure a user can cause ends as one line on stderr and a non-zero exit code.
"""
import argparse
import sys

from .. import __version__
from ..errors import Error
from . import cwsr_cmd, demo_cmd, monitor_cmd, preempt_cmd, queues_cmd, sim_cmd, topology_cmd
from .context import Context

DESCRIPTION = "Inspect and control AMD GPU queues through the Linux KFD driver (/dev/kfd)."
EPILOG = """examples:
  kfdtool demo                          # everything below, on a simulated 8x MI308X host
  kfdtool topology                      # GPUs as KFD sees them
  kfdtool queues                        # KFD processes and their queues (no privileges needed)
  kfdtool cwsr --probe --pid 1234       # can its queues be preempted with their waves saved?
  kfdtool preempt --pid 1234 --for 1s   # suspend them for a second (CWSR), then resume
  kfdtool --sim mi308x queues           # the same against a simulated machine
"""
COMMANDS = (topology_cmd, queues_cmd, monitor_cmd, cwsr_cmd, preempt_cmd, sim_cmd, demo_cmd)


def build_parser():
    parser = argparse.ArgumentParser(prog="kfdtool", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"kfdtool {__version__}")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--sim", metavar="NAME", help="use the simulated machine NAME (see `kfdtool sim list`)")
    where.add_argument("--sysfs-root", metavar="DIR",
                       help="read sysfs from DIR instead of /sys (also: KFDTOOL_SYSFS_ROOT)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        ctx = Context.from_args(args)
        return args.run(args, ctx)
    except (Error, ValueError) as e:
        print(f"kfdtool: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
