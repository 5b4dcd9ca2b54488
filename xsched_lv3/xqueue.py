"""XQueue: a schedulable queue of commands over one HwQueue.

Two modes, one launch step (`_launch_next`) and one window loop (`window.WindowedLaunches`):
  * buffered (the default): submitting never blocks. A launch worker moves commands to the hardware
    queue in submission order under the progressive window, and stops at once when the queue is
    suspended;
  * inline (`inline=True`): the submitting thread launches its own command, in submission order,
    after the commands submitted before it; it waits while the queue is suspended, and where the window
    is full. No worker thread: the mode for a caller that must not run ahead of its launches (XSched's
    shim on a framework's launch call). `xsched_lv3.gate.Gate` is this mode for frameworks that launch by
    themselves (PyTorch eager, the simulated HIP runtime), where a command is a module call.

Suspend at Lv1 lets in-flight work drain (at most one window); at Lv3 it also interrupts the hardware
queue, whose in-flight commands are saved and finish after restore. No command is ever launched twice
or skipped, whatever the sequence of suspends and resumes.
"""
import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from .levels import Level, pick_level
from .window import DEFAULT_WINDOW_US, ProgressiveWindow, WindowedLaunches

_ids = itertools.count(1)


@dataclass(eq=False)
class Command:
    fn: object                    # what the HwQueue runs (backend-specific payload)
    est_us: float | None = None   # estimated GPU time, if the caller knows it
    seq: int = 0
    launched: threading.Event = field(default_factory=threading.Event)   # handed to the HwQueue


class XQueue:
    def __init__(self, hwq, priority=0, level=None, window_us=DEFAULT_WINDOW_US, name=None, on_state=None,
                 inline=False):
        self.hwq = hwq
        self.level, self.level_reason = pick_level(hwq, level)
        self.id = next(_ids)
        self.name = name or f"xq{self.id}"
        self.hints = {"priority": priority}
        self.inline = inline
        # two commands a segment until a GPU time is learned: at most 4 in flight before that
        self.window = ProgressiveWindow(window_us, calibration_commands=2)
        self.launches = WindowedLaunches(self.window, hwq.record_sync_point, hwq.sync_point_done, hwq.wait_sync_point)
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
        # a marker is out: the idle watcher waits on one (a queue that drains again meanwhile places
        # none: one CUDA event and one wake-up per drain would be the cost of every inline command)
        self._watching = False
        threading.Thread(target=self._watch_idle, name=f"xsched-{self.name}-idle", daemon=True).start()
        self._worker = None
        self._made_by = threading.get_native_id()
        if not inline:
            self._worker = threading.Thread(target=self._run, name=f"xsched-{self.name}", daemon=True)
            self._worker.start()

    # --- submission -----------------------------------------------------------------------------
    def submit(self, fn, est_us=None):
        """Queue a command. Buffered: returns at once. Inline: returns once this thread has launched
        it (after every command submitted before it), which waits while the queue is suspended."""
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
        if self.inline:
            self._launch_next(until=cmd)
        return cmd

    @property
    def worker_tid(self):
        """The thread id of its launch worker (the thread a board slot names for this queue); inline,
        the thread that made it."""
        return self._worker.native_id if self._worker is not None else self._made_by

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
        self.launches.clear()

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
        if self._worker is not None:
            self._worker.join()

    # --- launching: the worker's loop, or the submitting thread (inline) ------------------------------
    def _run(self):
        while self._launch_next():
            pass

    def _launch_next(self, until=None):
        """Launch the next command in order under the window: the same sync points and waits as the
        gate (`WindowedLaunches`), counted in commands, weighed by their estimates where the caller
        gave them. Waits happen outside the queue's lock, so suspend() never waits on the GPU.
        Inline, `until` is the caller's own command, launched once it is at the head of the buffer
        (what a failed launch raises goes to its own caller). Threads launching at once may each put
        about one command more in flight than the window allows (as the gate's threads do).
        Returns False once the queue is closed and empty (the worker's end)."""
        with self._cv:
            if until is None:
                while not self._closed and (self._suspended or not self._buf):
                    self._cv.wait()
                if not self._buf:
                    return False
            else:
                while self._buf[0] is not until or self._suspended and not self._closed:
                    self._cv.wait()
            cmd = self._buf.popleft()
            try:
                self.hwq.launch(cmd.fn)          # under the lock: suspend() cannot slip in between
            finally:
                if self.inline:
                    self._cv.notify_all()         # the next thread's command is at the head now
            self._launched += 1
            self._busy = True
            marker = None
            if not self._buf and not self._watching:     # drained: watch for the end of it (_watch_idle)
                self._watching = True
                marker = (self._launched, self.hwq.record_sync_point())
            cmd.launched.set()                    # launched in order; completion is the hw queue's
        if marker:
            with self._idle_cv:
                self._idle_q.append(marker)
                self._idle_cv.notify()
        self.launches.launched(1, cmd.est_us)     # a sync point (and the wait) where due, as the gate's
        return True

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
                if self._buf:                     # more to launch: its drain places the next marker
                    self._watching = False
                    continue
                if self._launched != launched:    # launched since, and drained (no marker meanwhile):
                    self._idle_q.append((self._launched, self.hwq.record_sync_point()))   # the latest
                    continue
                self._watching = False
                self._busy = False
                self.ready_since = None
                self.launches.clear()
            if self.on_state:
                self.on_state(self)

    @property
    def launched(self):
        return self._launched
