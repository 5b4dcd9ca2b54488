"""The interpreter's GIL switch interval, shortened while part of the scheduler needs a thread to get
the GIL soon, and given back when nothing does.

A thread that comes back from C wanting the GIL (a gate's watcher whose request just completed on the
GPU, a service thread of `xt.client` woken for a request) gets it from a thread that is running Python
only once the interpreter forces a hand-over: after the switch interval, 5 ms by default. A watcher
that waits that long keeps the service's lower clients held 5 ms after its work is done, at every
request whose thread runs Python right after its result (a reply to serialise).

One process-wide count: the interval is shortened while anyone holds it, and restored when the last
holder lets go, unless the program set one of its own meanwhile (then that stays).
"""
import os
import sys
import threading

# At most this long for a waiting thread to get the GIL. Short enough that a release of lower clients
# is late by about a launch, not by a window (xsched_lv3.window.DEFAULT_WINDOW_US); the interpreter's
# cost is a hand-over (a few µs) per interval where two threads both run Python, and none where only
# one does.
SHORT_SWITCH_S = 0.5e-3


class ShortSwitch:
    """`with short_switch:` (or hold() / release()): the switch interval is at most `seconds` inside."""

    def __init__(self, seconds=SHORT_SWITCH_S):
        self.seconds = seconds
        self._lock = threading.Lock()
        self._holders = 0
        self._restore = None                     # (the program's interval, the one we set)

    def hold(self):
        with self._lock:
            if not self._holders:
                before = sys.getswitchinterval()
                if before > self.seconds:
                    sys.setswitchinterval(self.seconds)
                    self._restore = (before, sys.getswitchinterval())
            self._holders += 1

    def release(self):
        with self._lock:
            if not self._holders:                # (a forked child's holder that was its parent's)
                return
            self._holders -= 1
            if not self._holders:
                self._give_back()

    def _give_back(self):
        if self._restore is not None:
            before, ours = self._restore
            self._restore = None
            if sys.getswitchinterval() == ours:  # not changed by the program meanwhile
                sys.setswitchinterval(before)

    def after_fork_in_child(self):
        """A forked child (a DataLoader worker) has none of the threads that held the interval, and
        would keep it short for good: it gets the program's back. The lock may have been held by
        one of those threads at the fork: a new one."""
        self._lock = threading.Lock()
        self._holders = 0
        self._give_back()

    def __enter__(self):
        self.hold()
        return self

    def __exit__(self, *exc):
        self.release()


short_switch = ShortSwitch()
os.register_at_fork(after_in_child=short_switch.after_fork_in_child)
