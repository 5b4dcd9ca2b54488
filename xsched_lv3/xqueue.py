"""XQueue: a schedulable queue of commands over one HwQueue.

Submitting never blocks. A launch worker moves commands to the hardware queue in submission order
under the progressive window, and stops at once when the queue is suspended. Suspend at Lv1 lets
in-flight work drain (at most one window); at Lv3 it also interrupts the hardware queue, whose
in-flight commands are saved and finish after restore. No command is ever launched twice or
skipped, whatever the sequence of suspends and resumes.
"""
import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from .levels import Level, pick_level
from .window import DEFAULT_WINDOW_US, ProgressiveWindow

_ids = itertools.count(1)


@dataclass(eq=False)
class Command:
    fn: object                    # what the HwQueue runs (backend-specific payload)
    est_us: float | None = None   # estimated GPU time, if the caller knows it
    seq: int = 0
    launched: threading.Event = field(default_factory=threading.Event)   # handed to the HwQueue


class XQueue:
    def __init__(self, hwq, priority=0, level=None, window_us=DEFAULT_WINDOW_US, name=None, on_state=None):
        self.hwq = hwq
        self.level, self.level_reason = pick_level(hwq, level)
        self.id = next(_ids)
        self.name = name or f"xq{self.id}"
        self.hints = {"priority": priority}
        # two commands a segment until a GPU time is learned: at most 4 in flight before that
        self.window = ProgressiveWindow(window_us, calibration_commands=2)
        self._window_lock = threading.Lock()     # the worker's sync points, drain() and the idle watcher
        self._buf = deque()
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._suspended = False
        self._interrupted = False
        self._closed = False
        self._launched = 0
        self.on_state = on_state              # callback(xqueue) when ready/idle changes
        self.ready_since = None
        self._busy = False                    # launched work not yet known complete
        self._idle_q = deque()
        self._idle_cv = threading.Condition()
        threading.Thread(target=self._watch_idle, name=f"xsched-{self.name}-idle", daemon=True).start()
        self._worker = threading.Thread(target=self._run, name=f"xsched-{self.name}", daemon=True)
        self._worker.start()

    # --- submission -----------------------------------------------------------------------------
    def submit(self, fn, est_us=None):
        cmd = Command(fn, est_us, next(self._seq))
        with self._cv:
            if self._closed:
                raise RuntimeError(f"{self.name} is closed")
            was_idle = not self._buf and not self.window.pending
            self._buf.append(cmd)
            if was_idle and self.ready_since is None:
                self.ready_since = time.monotonic()
            self._cv.notify_all()
        if was_idle and self.on_state:
            self.on_state(self)
        return cmd

    @property
    def worker_tid(self):
        """The thread id of its launch worker (the thread a board slot names for this queue)."""
        return self._worker.native_id

    @property
    def ready(self):
        """Has buffered commands or launched work not yet seen to complete."""
        return bool(self._buf) or self._busy

    @property
    def suspended(self):
        return self._suspended

    # --- suspend / resume -------------------------------------------------------------------------
    def suspend(self, sync=False):
        """Stop launching. Lv2 also deactivates the hardware queue and Lv3 interrupts it (waves
        saved): either stops at once. With sync=True at Lv1 return only when in-flight work has
        drained, the preemption latency (a deactivated queue's work would never drain)."""
        with self._cv:
            if self._suspended:
                return
            self._suspended = True
        if self.level >= Level.INTERRUPT:
            self.hwq.interrupt()
            self._interrupted = True
        elif self.level >= Level.DEACTIVATE:
            self.hwq.deactivate()
        if sync and self.level == Level.BLOCK:
            self.drain()

    def resume(self):
        with self._cv:
            if not self._suspended:
                return
            # time across the suspension is neither our CPU nor our GPU time. Before the queue runs
            # again: a worker waiting on a sync point would otherwise learn the whole suspension as GPU
            # time if its wait returned first. Not under the window's lock: the worker may hold it
            # waiting on a sync point that only this resume lets complete
            self.window.paused()
            if self._interrupted:
                self.hwq.restore()
                self._interrupted = False
            elif self.level == Level.DEACTIVATE:
                self.hwq.reactivate()
            self._suspended = False
            self._cv.notify_all()

    def drain(self):
        """Wait for everything already launched (not the buffered commands)."""
        self.hwq.synchronize()
        with self._window_lock:
            self.window.clear()

    def wait_all(self, timeout=None):
        """Wait until every submitted command has completed (it must be resumed to get there)."""
        with self._cv:
            last = self._buf[-1] if self._buf else None
        if last is not None and not last.launched.wait(timeout):
            return False
        self.hwq.synchronize()
        return True

    def close(self):
        """Launch what was submitted, then stop. A suspended queue is resumed first: its worker may
        be waiting on work that runs only then, and no submitted command is ever skipped."""
        with self._cv:                        # a re-entrant lock: resume() runs under the same hold,
            self._closed = True               # so the worker never sees a closed queue still suspended
            self.resume()
            self._cv.notify_all()
        self._worker.join()

    # --- the launch worker --------------------------------------------------------------------------
    def _run(self):
        """Launch in order under the window: the same sync points and waits as the inline gate
        (`ProgressiveWindow.sync_point`), counted in commands, weighed by their estimates where the
        caller gave them. Waits happen outside the queue's lock, so suspend() never waits on the GPU."""
        n, est_us = 0, 0.0                       # launched since the last sync point; None: some unknown
        while True:
            with self._cv:
                while not self._closed and (self._suspended or not self._buf):
                    self._cv.wait()
                if self._closed and not self._buf:
                    return
                cmd = self._buf.popleft()
                self.hwq.launch(cmd.fn)          # under the lock: suspend() cannot slip in between
                self._launched += 1
                self._busy = True
                n += 1
                est_us = None if est_us is None or cmd.est_us is None else est_us + cmd.est_us
                handle = self.hwq.record_sync_point() if self.window.sync_due(n, est_us) else None
                drained = not self._buf
                marker = (self._launched, self.hwq.record_sync_point()) if drained else None
            cmd.launched.set()                    # launched in order; completion is the hw queue's
            if marker:
                with self._idle_cv:
                    self._idle_q.append(marker)
                    self._idle_cv.notify()
            if handle is not None:
                with self._window_lock:
                    self.window.sync_point(handle, n, self.hwq.sync_point_done, self.hwq.wait_sync_point, est_us)
                n, est_us = 0, 0.0
            elif n == self.window.look_after:
                with self._window_lock:
                    self.window.look_back(self.hwq.sync_point_done)

    def _watch_idle(self):
        """When the buffer empties, wait for the last launch to complete; if nothing was launched
        since, the queue is idle: tell the scheduler (XSched's XQueueIdle event)."""
        while True:
            with self._idle_cv:
                while not self._idle_q:
                    self._idle_cv.wait()
                launched, handle = self._idle_q.popleft()
            self.hwq.wait_sync_point(handle)
            with self._cv:
                if self._launched != launched or self._buf:
                    continue
                self._busy = False
                self.ready_since = None
                with self._window_lock:
                    self.window.clear()
            if self.on_state:
                self.on_state(self)

    @property
    def launched(self):
        return self._launched
