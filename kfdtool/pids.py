"""Process liveness, as every pid-keyed registry here needs it."""
import os


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
