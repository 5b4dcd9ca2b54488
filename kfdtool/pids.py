"""Process liveness, as every pid-keyed registry here needs it."""
import os
import selectors


def alive(pid):
    """True if `pid` exists (even if it belongs to another user)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
