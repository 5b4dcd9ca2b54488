"""Process liveness, as every pid-keyed registry here needs it."""
import os
import selectors


def _stat(pid, tid=None):
    """/proc/PID/stat's fields after "(comm)" (which may hold spaces and ')'), or None; with `tid`,
    those of that thread of PID (/proc/PID/task/TID/stat)."""
    try:
        with open(f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat", "rb") as f:
            data = f.read()
        return data[data.rindex(b")") + 2:].split()
    except (OSError, ValueError):
        return None


def state_and_start(pid, tid=None):
    """(state letter, start time in clock ticks since boot) of `pid` (or of its thread `tid`) from
    one read of /proc/PID/stat, or (None, None) where this /proc does not show it."""
    fields = _stat(pid, tid)
    try:
        return fields[0].decode(), int(fields[19])
    except (TypeError, IndexError, ValueError):
        return None, None


def process_state(pid):
    """The state letter from /proc/PID/stat ('R', 'S', 'D', 'T' stopped, 't' stopped by a tracer,
    'Z' zombie, ...), or None where this /proc does not show the process."""
    return state_and_start(pid)[0]


def start_time(pid, tid=None):
    """When `pid` (or its thread `tid`) started, in clock ticks since boot (/proc/PID/stat field
    22), or None: with the id, it names one process (thread) even after the id is reused."""
    return state_and_start(pid, tid)[1]


def alive(pid):
    """True if `pid` exists and has not exited (even if it belongs to another user). A zombie has
    exited: its memory, fds and GPU queues are gone, only its exit status waits for its parent."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return process_state(pid) not in ("Z", "X")


def stopped(pid):
    """True while `pid` is stopped (SIGSTOP, SIGTSTP, or held by a tracer)."""
    return process_state(pid) in ("T", "t")


class ExitWatch:
    """pidfds of watched processes in a selector: the selector wakes when one exits (kill -9
    included). Events carry ("pidfd", pid)."""

    def __init__(self, selector):
        self.sel = selector
        self.fds = {}

    def __contains__(self, pid):
        return pid in self.fds

    def watch(self, pid):
        """Start watching `pid`; False if it no longer exists."""
        if pid in self.fds:
            return True
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return False
        self.fds[pid] = fd
        self.sel.register(fd, selectors.EVENT_READ, ("pidfd", pid))
        return True

    def exited(self, pid):
        """Forget `pid` after its exit event."""
        fd = self.fds.pop(pid)
        self.sel.unregister(fd)
        os.close(fd)
