"""The inline gate: XSched's XQueue semantics run on the launching thread itself, for frameworks
whose launches we cannot cheaply buffer (PyTorch eager). Before each command: may this client run
now (the policy over the shared board)? is its in-flight work within the progressive window?
After each command: place a sync point when the window says so. No worker thread, no per-command
copy: a few microseconds per gated call."""
import os
import threading
import time

from .board import Board
from .policy import make_policy
from .window import ProgressiveWindow

POLL_MIN_S, POLL_MAX_S = 50e-6, 500e-6     # held back: poll the board with backoff (GIL-friendly)
REAP_EVERY_S = 0.05


class Gate:
    def __init__(self, recorder, priority=0, policy="hpf", window_us=300.0, board=None, name=None, **hints):
        self.recorder = recorder              # record(blocking=False) -> handle; wait(handle)
        self.board = board or Board()
        self.slot = self.board.allocate(os.getpid(), priority, threading.get_native_id())
        for key, value in hints.items():
            self.board.set_hint(self.slot, key, value)
        self.policy = make_policy(policy) if isinstance(policy, str) else policy
        # the top priority has nobody to make room for: window_us=None disables the window
        self.window = ProgressiveWindow(window_us) if window_us else None
        self.name = name or f"pid{os.getpid()}"
        self._seqs = None
        self._may_run = True
        self._wake_at = None
        self._requests = 0
        self._last_done_at = None
        self.waits = 0                        # times this client was held back (for reports)
        self.held_s = 0.0
        self._lock = threading.Lock()
        self._watch = []
        self._watch_cv = threading.Condition()
        self._watcher = threading.Thread(target=self._idle_watcher, daemon=True, name=f"xsched-gate-{self.slot}")
        self._watcher.start()

    # --- requests (a top-level forward) -----------------------------------------------------------
    def begin_request(self):
        with self._lock:
            self._requests += 1
        self.board.set_active(self.slot, True)

    def end_request(self):
        """Work of this request is launched; the client is idle once it completes on the GPU."""
        handle = self.recorder.record(blocking=True)       # waited on by the watcher, off the hot path
        with self._watch_cv:
            self._watch.append((self._requests, handle))
            self._watch_cv.notify()

    def _idle_watcher(self):
        while True:
            with self._watch_cv:
                while not self._watch:
                    self._watch_cv.wait()
                request, handle = self._watch.pop(0)
            self.recorder.wait(handle)
            with self._lock:
                if request == self._requests:       # no new request began meanwhile
                    self.board.set_active(self.slot, False)

    # --- per command --------------------------------------------------------------------------------
    def _decide(self, now):
        board_policy = self.board.policy()          # set by the daemon: it wins over our own
        if board_policy and board_policy != self.policy.name:
            self.policy = make_policy(board_policy)
        decision = self.policy.decide(self.board.states(), now)
        self._may_run = self.slot in decision.run
        self._wake_at = decision.wake_at
        self._seqs = self.board.seqs()

    def before_launch(self):
        # hot path (every leaf module): one 128-byte compare unless something changed
        if self._seqs != self.board.seqs() or (self._wake_at is not None and time.monotonic() >= self._wake_at):
            self._decide(time.monotonic())
        if not self._may_run:
            self._wait_turn(time.monotonic())
        window = self.window
        if window is None or not window.pending:
            return
        handle = window.must_wait()
        if handle is not None:
            self.recorder.wait(handle)
            done = time.monotonic()
            self.window.completed(done, self._last_done_at)
            self._last_done_at = done

    def _wait_turn(self, start):
        self.waits += 1
        last_reap = start
        poll = POLL_MIN_S
        while not self._may_run:
            time.sleep(poll)
            poll = min(POLL_MAX_S, poll * 2)
            now = time.monotonic()
            if now - last_reap > REAP_EVERY_S:
                self.board.reap()                 # a dead client must not hold us back forever
                last_reap = now
            self._decide(now)
        self.held_s += time.monotonic() - start

    def after_launch(self):
        if self.window is not None and self.window.after_launch():
            self.window.recorded(self.recorder.record(), time.monotonic())

    def close(self):
        self.board.release(self.slot)
