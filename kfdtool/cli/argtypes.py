"""argparse types for numbers and names that must make sense: a bad one is a usage error (one line,
exit code 2) at parse time, before any command does anything."""
import argparse
import math
import sys


def _number(kind, text, low, inclusive, high=None):
    if not text.isascii():                       # int() takes "２５０２" (full-width): an admin never means it
        raise argparse.ArgumentTypeError(f"not a number: {text!r} (ASCII digits only)")
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    if value < low or (value == low and not inclusive):
        raise argparse.ArgumentTypeError(f"must be {'>=' if inclusive else '>'} {low}, got {text}")
    if high is not None and value > high:
        raise argparse.ArgumentTypeError(f"must be <= {high if isinstance(high, int) else f'{high:g}'}, got {text}")
    return value


def positive_int(text):
    return _number(int, text, 0, inclusive=False)


def non_negative_int(text):
    return _number(int, text, 0, inclusive=True)


def queue_id(text):
    """A KFD queue id: the kernel gives a process ids below KFD_MAX_NUM_OF_QUEUES_PER_PROCESS
    (kfd_process_queue_manager.c: find_available_queue_slot), so a larger one names no queue (and
    would wrap in the ioctl's 32-bit queue array, naming another)."""
    from kfdtool.ioctls.constants import KFD_MAX_NUM_OF_QUEUES_PER_PROCESS
    return _number(int, text, 0, inclusive=True, high=KFD_MAX_NUM_OF_QUEUES_PER_PROCESS - 1)


def positive_float(text):
    return _number(float, text, 0.0, inclusive=False)


def interval_seconds(text):
    """A watch interval: above zero, at most a day (time.sleep's range, and any sane refresh)."""
    return _number(float, text, 0.0, inclusive=False, high=86400.0)


def process_count(text):
    """Simulated processes to start one by one: a few hundred is a big machine."""
    return _number(int, text, 0, inclusive=False, high=512)


def non_empty(text):
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def grace_period(text):
    """DBG_TRAP's grace period: 8 bits of 1K GPU clocks."""
    value = non_negative_int(text)
    if value > 255:
        raise argparse.ArgumentTypeError(f"the grace period is 0-255 (1K GPU clocks), got {text}")
    return value


def parse_command_line(parser, argv=None):
    """`parser.parse_args(argv)`, except that an option the command does not take is reported by that
    command's parser (its usage line, not the whole program's), as `kfdtool queues --frob` should be:
    the deepest command chosen (`kfdtool sim start --frob` is `sim start`'s). The program's COMMAND
    is required here, after that: argparse's own check (a required subparser) comes before unknown
    options, and `kfdtool --frob` then said a COMMAND was missing instead of naming the option."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        tokens = sys.argv[1:] if argv is None else list(argv)
        command = getattr(args, "command", None)
        before_command = command in tokens and unknown[0] in tokens and tokens.index(unknown[0]) < tokens.index(command)
        owner = parser if before_command else _chosen_parser(parser, args)     # `kfdtool --frob queues`: the program's
        owner.error(f"unrecognized arguments: {' '.join(unknown)}")
    if getattr(args, "command", None) is None:
        parser.error(f"a COMMAND is required ({parser.prog} --help lists them)")
    return args


def _chosen_parser(parser, args):
    """The parser of the command that `args` chose, following its subcommands down (argparse keeps
    a command's parser only in the action that chose it)."""
    while True:
        choosing = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        chosen = getattr(args, choosing.dest, None) if choosing is not None else None
        if chosen not in getattr(choosing, "choices", {}):
            return parser
        parser = choosing.choices[chosen]
