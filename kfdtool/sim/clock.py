"""The simulated KFD's clock: CLOCK_MONOTONIC, except while the server applies a request, when it
reads the moment the request's caller made it.

Why: the real kernel runs an ioctl in its caller's context as the syscall is made, and the command
processor sees a doorbell as it is written, concurrently for every process. The simulator has one
Python thread, so a request may wait its turn behind other processes' and then take a few hundred
µs of Python to handle. Stamped with the moment it is applied, a suspend would take effect that much
later than the kernel's would, a simulator artefact charged to whoever preempts (measured on a
2-vCPU host: p50 ~0.4 ms of a SUSPEND_QUEUES call were the server's turn and its Python). So each
ioctl and dispatch carries the moment its caller made it (protocol.py), and the server applies it
then: no earlier than the model has already been played (it never goes back), no later than now, and
no more than MAX_LATE_NS ago (a caller whose clock differs, in another time namespace, is off by at
most that).
"""
import contextlib
import time

# Far above the server's turn and handling (p99 ~3 ms measured under four busy processes on 2 vCPUs)
MAX_LATE_NS = 20_000_000
_applying_at = [None]          # the moment the request being applied was made, while one is


def now_ns():
    """The simulated present: the moment of the request being applied, else CLOCK_MONOTONIC."""
    at = _applying_at[0]
    return time.monotonic_ns() if at is None else at


def is_stamp(made_at):
    """A moment a caller says it made its request: a positive whole number of ns (0: none)."""
    return not isinstance(made_at, bool) and isinstance(made_at, int) and made_at > 0


def applied_at(made_at, played_ns, now):
    """When a request its caller made at `made_at` takes effect, the model having been played to
    `played_ns`: see above. 0, or anything but a whole number of ns: now."""
    if not is_stamp(made_at):
        return now
    return min(now, max(made_at, played_ns, now - MAX_LATE_NS))


@contextlib.contextmanager
def applying_at(moment_ns):
    """Inside, now_ns() reads `moment_ns` (the server handles one request at a time)."""
    _applying_at[0] = moment_ns
    try:
        yield moment_ns
    finally:
        _applying_at[0] = None
