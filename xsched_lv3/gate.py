"""The inline gate: the XQueue's inline mode (`xqueue.py`) for frameworks that launch by themselves
and whose launches we cannot cheaply buffer (PyTorch eager, the simulated HIP runtime): a command is
a leaf module call, counted after it ran by the same window loop (`window.WindowedLaunches`) that
an XQueue's launches go through, on the launching thread itself. Where a LocalScheduler suspends an
XQueue, a gate reads its turn from the board (the policy over every client there), since the
programs under `xsched-lv3 run` have no scheduler thread of their own.

A gate costs only what its position on the board requires (the fast path is the common case):
  * registered at once (so clients below it make room before its first request), with its GPU
    filled in at the first request that finds the GPU in use (until then it counts as sharing
    every GPU);
  * **free** while no client of higher priority shares its device: no window, no checks on each
    module, nothing but one 128-byte board comparison per request. The top-priority client on a
    device is never windowed or held;
  * **tracking** (marks itself active/idle per request) only while a lower-priority client shares
    its device, since only those clients read that state; and only for requests that need it: a
    client measures its request latency and holds lower clients back only while they endanger it
    (`protection.py`; strict priority with `latency_slack=0`). What it marks and measures is a busy
    period: from a request's start until the GPU has done all its requests' work, across the short
    idle gaps of a client that comes straight back (`RELEASE_COST_S`: a token-by-token generation is
    one busy period, not one per model call);
  * **guarded** while a higher-priority client shares its device (or the policy is not strict
    priority) and this process uses a GPU: before each module and after each leaf module it asks the policy whether it may run
    (one board comparison), and every few leaves it places a sync point that keeps its in-flight GPU
    work within the progressive window, so a higher-priority arrival waits for at most about one
    window of its work (Lv1: launched kernels cannot be stopped).
The state is re-read whenever the board changes. The per-module test is kept to one shared-memory
integer comparison and one attribute (`may_pass`), inlined in the PyTorch wrapper: a launch-bound
client makes hundreds of module calls per iteration, and each microsecond there costs it percents.
"""
import os
import queue
import threading
import time
from collections import deque
from functools import partial

from . import daemon_link
from .board import Board, excuse, register_client, stopped_activations
from .gil import short_switch
from .policy import GAP_HISTORY, check_hint, hold_for, make_policy, shares_device
from .protection import DEFAULT_LATENCY_SLACK, Protection
from .window import (DEFAULT_WINDOW_US, EXPOSED_WINDOW_SCALE, LaunchTotals, ProgressiveWindow, WindowedLaunches,
                     check_window_us)

POLL_MIN_S, POLL_MAX_S = 20e-6, 100e-6     # held back by another process: poll the board with backoff
# Held back only by clients of this same process (threads): they wake us when they write the board
# (`_LOCAL_WRITES`), so we sleep instead of polling. Polling there is not free: each wake-up takes the
# GIL from the very thread that is serving the latency-critical request. Still bounded, for writes
# from other processes (the daemon, `xsched-lv3 hint`).
LOCAL_WAIT_MAX_S = 5e-3
_LOCAL_WRITES = threading.Condition()
# Threads waiting on _LOCAL_WRITES (changed under it): a write wakes them only where there are any, so
# that a service alone in its process does not take the condition twice a request for nobody
_local_waiters = [0]
# A process's only launching thread spins (yielding the GIL each turn) for the first part of a hold:
# a sleeping thread on an idle CPU wakes late, and a launch-bound client then runs slowly for a while.
PROCESS_SPIN_S = 2e-3
REAP_EVERY_S = 0.05                        # held: look for dead clients this often
REAP_IDLE_EVERY_S = 1.0                    # otherwise, at a request's start at most this often
DAEMON_CHECK_S = 0.05                      # is the daemon (our Lv3) still there? At most this often
WATCHER_JOIN_S = 10.0                      # close(): the last request's GPU work may take this long
BACKWARD_COMMANDS = 2                      # a leaf module's backward, in forward commands (before_backward)
# A busy period (what lower clients are held for, and what the protection judges) goes on across a
# short idle gap between requests, by the ski-rental rule over the recent gaps (policy.hold_for): a
# service that comes straight back (a text generation: one model call per token, a moment of CPU work
# between) keeps lower clients held through the gap instead of letting them queue work ahead of its
# next call, and its protection judges the whole burst, the request its user waits for, not each call.
# A release costs the service about what a lower client may queue meanwhile: a window of work, plus
# the command it is running (two default windows).
RELEASE_COST_S = 2 * DEFAULT_WINDOW_US * 1e-6
# ... but a busy period that has run this long ends at its next gap however short: a client that never
# pauses longer than that (a batch job in a loop above another, a service with a standing queue) would
# otherwise be one busy period for good, never judged, its lower clients held throughout
KEPT_OPEN_MAX_S = 1.0


_GAP_OUTLASTED = object()                  # the watcher's wake-up: no request came back within the gap


def _wake_local_waiters():
    """After a board write that threads of this process held back on _LOCAL_WRITES should see."""
    if _local_waiters[0]:
        with _LOCAL_WRITES:
            _LOCAL_WRITES.notify_all()


class Gate:
    def __init__(self, recorder, priority=0, policy="hpf", window_us=DEFAULT_WINDOW_US, board=None, spin_s=0.0,
                 whole_process=False, latency_slack=DEFAULT_LATENCY_SLACK, **hints):
        # recorder: record() -> handle, done(handle) (never blocks; once True the gate never uses the
        #           handle again, so the recorder may reuse it), wait(handle), device_key() -> an
        #           int naming the GPU in use, or None while this process has not used a GPU
        self.recorder = recorder
        self.priority = check_hint("priority", priority)
        self.hints = {k: check_hint(k, v) for k, v in hints.items()}
        self.policy = make_policy(policy) if isinstance(policy, str) else policy
        self.protection = Protection(latency_slack)
        self.window_us = window_us and check_window_us(window_us)   # None or 0: never windowed (unbounded)
        self.spin_s = spin_s                       # held: poll without sleeping this long, then back off
        self.board = board or Board()
        self.device = recorder.device_key() or 0   # 0: not known yet
        self.guarded = False                       # read on every module call
        self.awaiting_device = False               # ... and would be, once this process uses a GPU (notice_device)
        self.tracking = False
        self.launches = None                       # the window's launch loop (window.WindowedLaunches): None, none
        # the GPU time per command the last window dropped had learned: a batch job that outlives the
        # service above it has no window left when it reports at exit
        self._dropped_cmd_us = None
        self._exposing = False                     # what our slot says of our protection's verdict
        self._below = None                         # (slot, pid) of the lower clients on our GPU, last seen
        self._backward_begun = False               # backward hooks have run since the last request began
        self.trains = False                        # a backward pass reached one of its requests' outputs
        self.hooked_node = None                    # id of the autograd node hooked last (pytorch._hook_backward)
        self.unhooked_leaves = 0                   # ... and the guarded leaves since, in this forward pass
        self._backward_hooks = {}                  # leaves a hook counts for -> that hook (backward_hook)
        self.board_generation = self.board.generation   # changes with every write to the board
        self.seen_generation = None                # the generation the mode and decision were read at
        self.clear_to_run = True                   # guarded, allowed to run, and no policy timer pending
        self._may_run = True
        self._wake_at = None
        self._requests = 0
        self._active = False
        self.waits = 0                             # times this client was held back (for reports)
        self.held_s = 0.0
        self._window_totals = LaunchTotals()       # over every window we had
        self._unwindowed_leaves = 0                # leaves counted while guarded without a window
        self.active_s = 0.0                        # marked active (lower clients held), in total
        self._active_since = 0.0
        self._lock = threading.Lock()              # request bookkeeping (launching threads, watcher)
        self._open = 0                             # requests begun and not yet ended (all threads)
        self._busy_since = None                    # when the current busy period (requests open or in flight) began
        self._protecting = False                   # the current busy period holds lower clients
        self._exposed = False                      # ... it began without holding them (a probe, or harmless)
        self._period = 0                           # busy periods begun
        self._work_done_at = None                  # the GPU finished all our requests then, none began since
        self._gaps = deque(maxlen=GAP_HISTORY)     # recent idle gaps: from work done to the next request
        # An exposed busy period that runs past its deadline (protection.guard_deadline_s) is protected
        # for the rest of it: lower clients are held once they endanger this request, not before
        self._guard_cv = threading.Condition()
        self._protect_at = None                    # (deadline, period) of the exposed busy period, if any
        self._guard = None
        self._guard_stop = False
        self._pid = os.getpid()
        self._others_here = False                  # every other active client is in this process
        # (slot, ready_since) of activations whose process was found stopped (SIGSTOP, a debugger): they
        # hold nobody, or a stopped high-priority process would hold every lower one for as long as it
        # stays stopped. Keyed by the activation, so the same client's next request counts again.
        self._excused = set()
        self._last_reap = time.monotonic()
        # (request, end handle) for the watcher; None closes it. A C queue: putting one costs a request's
        # end a single call, where a Condition took several of Python's (_idle_watcher takes them)
        self._watch = queue.SimpleQueue()
        self._watcher = None
        self.level = 1                             # 3 while the daemon preempts us through KFD (no gating)
        self._daemon_wake = None                   # where to poke the daemon when our activity changes
        self._daemon, self._daemon_checked = 0, -1.0
        self.board.reap()                          # clients that died since: they guard nobody
        tid = 0 if whole_process else threading.get_native_id()
        self.slot = register_client(self.board, self.priority, tid, self.hints, self.device)
        self._refresh(time.monotonic())

    # --- the board's view ----------------------------------------------------------------------------

    def _refresh(self, now):
        """Re-read the board: which mode this client is in, and whether it may run now."""
        board = self.board
        board_policy = board.policy()               # set by the daemon: it wins over our own
        if board_policy and board_policy != self.policy.name:
            self.policy = make_policy(board_policy)
        self.seen_generation = self.board_generation[0]   # before the states: a write during the read shows next time
        slots = board.slots()                       # one read: the states and our level come from it
        states = board.states(slots)
        states = excuse(states, self._excused)
        self._others_here = all(q.pid == self._pid for q in states if q.ready and q.id != self.slot)
        me = next((q for q in states if q.id == self.slot), None)
        if me is None:                              # our slot was released under us (a daemon restart)
            self.slot = None
            self._set_mode(False, False)
            return
        if now - self._daemon_checked > DAEMON_CHECK_S:
            self._daemon_checked = now
            self._daemon = board.daemon_pid()
            self._daemon_wake = daemon_link.wake_path(daemon_link.default_socket()) if self._daemon else None
        # Lv3: the daemon suspends our queues when we must yield; a dead daemon's word no longer holds
        slot_of = dict(slots)
        self.level = 3 if self._daemon and slot_of[self.slot].level == 3 else 1
        mine = me.hints.get("priority", 0)
        peers = [q for q in states if q.id != self.slot and shares_device(q.device, me.device)]
        if self.policy.strict_priority:
            above = [slot_of[q.id] for q in peers if q.hints.get("priority", 0) > mine]
            below = frozenset((q.id, q.pid) for q in peers if q.hints.get("priority", 0) < mine)
            guarded, tracking = bool(above), bool(below)
            exposed = guarded and all(s.exposing for s in above)
            if self._below is not None and below - self._below:
                self._new_company()
            self._below = below
        else:                                       # shares, deadlines: everyone may have to yield
            guarded, tracking, exposed = bool(peers), bool(peers), False
        # A process that has not used a GPU yet (self.device unknown) is neither held nor windowed: its
        # module calls run on the CPU (a CPU-only job, a spawned DataLoader worker whose transforms are
        # modules), nothing of it is queued on any GPU, and a sync point would initialise CUDA in it (or
        # raise, with a torch built without CUDA). Where it starts using one (a request's start, or
        # notice_device within a request), the device is announced and the board's change brings it
        # back here, before that work.
        held_on_gpu = guarded and self.level < 3
        self.awaiting_device = held_on_gpu and not self.device
        self._set_mode(held_on_gpu and bool(self.device), tracking, EXPOSED_WINDOW_SCALE if exposed else 1)
        window = self.window
        if window is not None:
            # another client started or ended work: an interval across this change may hold its GPU
            # time (its kernels between ours), which would inflate the learned time per command
            window.others_changed()
        if self.guarded:
            decision = self.policy.decide(states, now)
            self._may_run = self.slot in decision.run
            self._wake_at = decision.wake_at
        else:
            self._may_run, self._wake_at = True, None
        self.clear_to_run = self._may_run and self._wake_at is None

    def _new_company(self):
        """A lower client joined: our verdict on the others does not cover it (protection.py)."""
        with self._lock:
            self.protection.new_company()
            self._publish_exposing()                # its window is not widened on another's verdict

    def _publish_exposing(self):
        """Put our protection's verdict on the board when it changed (lower clients size their window
        by it). Under self._lock; the slot is read once: a request thread may drop it (daemon restart)."""
        slot = self.slot
        if self.protection.exposing != self._exposing and slot is not None:
            self._exposing = self.protection.exposing
            self.board.write(slot, exposing=int(self._exposing))

    def _set_mode(self, guarded, tracking, window_scale=1):
        window_us = self.window_us * window_scale if self.window_us else self.window_us
        windowed = guarded and window_us           # guarded implies a GPU in use (_refresh)
        window = self.window
        if windowed and window is None:
            window = ProgressiveWindow(window_us)
            window.backlog(self.recorder.record())     # what we launched before is in flight too
            recorder = self.recorder
            self.launches = WindowedLaunches(window, recorder.record, recorder.done, recorder.wait,
                                             changed=self._board_changed, totals=self._window_totals)
        elif not windowed:
            if window is not None and window.calibrated:
                self._dropped_cmd_us = window.cmd_us
            self.launches = None
        elif window.window_us != window_us:
            self.launches.resize(window_us)
        self.guarded = guarded
        if tracking and not self.tracking and self._watcher is None:
            self._watcher = threading.Thread(target=self._idle_watcher, daemon=True, name=f"xsched-gate-{self.slot}")
            self._watcher.start()
        if not tracking:
            with self._lock:                       # the watcher reads the busy period under it
                self._busy_since = None
                if self._active:
                    self._mark(False)
        self.tracking = tracking

    # --- requests (a top-level module call) -------------------------------------------------------------
    def begin_request(self):
        self._backward_begun = False               # a forward pass: the next backward is a new phase
        self.hooked_node, self.unhooked_leaves = None, 0
        if self.slot is None:
            return                                 # closed, or released by a daemon restart
        now = time.monotonic()
        if not self.device:
            self._find_device()
        reaped = now - self._last_reap > REAP_IDLE_EVERY_S
        if reaped:
            self._last_reap = now
            self.board.reap()                      # a dead client must not keep us guarded
        if reaped or self.seen_generation != self.board_generation[0] or (
                self.level == 3 and now - self._daemon_checked > DAEMON_CHECK_S):
            self._refresh(now)                     # ... or our Lv3 daemon may have died: gate again
        if self.tracking and self.device:          # no GPU in use yet: nothing to wait for
            with self._lock:
                self._open += 1
                self._requests += 1
                if self._work_done_at is not None:
                    # (`now` may predate it: the watcher may have taken the lock first)
                    self._gaps.append(max(0.0, time.monotonic() - self._work_done_at))
                    self._work_done_at = None      # (a busy period kept open across this gap goes on)
                elif self._busy_since is not None and self._open == 1:
                    self._gaps.append(0.0)         # back before the GPU had done the last one: no gap at all
                if self._busy_since is None:       # a new busy period: protect it, or not
                    self._busy_since = now
                    self._period += 1
                    # only strict priority lets a client waive its own precedence: other policies
                    # (shares, deadlines) read every client's activity
                    self._protecting = not self.policy.strict_priority or self.protection.protect_next()
                    self._exposed = not self._protecting
                    if self._exposed:
                        self._guard_exposure(now + self.protection.guard_deadline_s(), self._period)
                if self._protecting:
                    self._mark(True)

    def _find_device(self):
        """Whether this process has started using a GPU since we last looked: if so, announce it (the
        board's change makes every client re-read its mode, this one included)."""
        self.device = self.recorder.device_key() or 0
        if self.device and self.slot is not None:
            self.board.set_device(self.slot, self.device)
        return bool(self.device)

    def notice_device(self):
        """Where this process may have just started using a GPU within a request (a launch, a module
        call, while `awaiting_device`): announce the GPU and re-read the mode, so that this very
        work is gated, and held now, where a higher client shares that GPU."""
        if not self.device and self._find_device():
            self.check()

    def end_request(self):
        """Work of this request is launched; the client is idle once it completes on the GPU and
        no other thread's request is open. Called from a `finally`: a request that raises ends too."""
        with self._lock:
            if not self._open:
                return
            self._open -= 1
            if self._open:
                return                             # another thread's request still runs
            request = self._requests
        handle = self.recorder.record()            # waited on by the watcher, off the hot path
        self._watch.put((request, handle))

    def _mark(self, active):
        now = time.monotonic()
        if active and not self._active:
            self._active_since = now
        elif not active and self._active:
            self.active_s += now - self._active_since
        self._active = active
        slot = self.slot
        if slot is not None:
            # Our own mark changes nothing an unguarded client reads from the board (its mode comes from
            # the others), so it is no reason to re-read the whole board at the next request's start: that
            # cost a service 50-200 us a request on the critical path (a 2-vCPU sandbox). Where no other
            # write was announced since we last read (the board says so as it announces ours), the new
            # generation is taken as seen. Another's write landing in the few instructions between the
            # board's read and its write of the generation is overwritten: seen at the latest with the
            # reap, REAP_IDLE_EVERY_S later.
            mine = self.board.set_active(slot, active, expect=None if self.guarded else self.seen_generation)
            if mine is not None:
                self.seen_generation = mine
            if self._daemon_wake:
                daemon_link.poke(self._daemon_wake)     # Lv3: suspend or resume the clients below now
        _wake_local_waiters()                      # threads of this process held back by us

    def _idle_watcher(self):
        keep = None                                # (until, request): a busy period kept open across a gap
        # The switch interval is short (gil.py) from a request's arrival here until we go back to
        # waiting with nothing kept open: through its GPU work, and through a kept gap, whose end (our
        # wake-up from the queue) ends the busy period.
        held = False
        try:
            while True:
                if held and keep is None:
                    short_switch.release()
                    held = False
                try:
                    item = self._watch.get(timeout=None if keep is None else max(0.0, keep[0] - time.monotonic()))
                except queue.Empty:
                    item = _GAP_OUTLASTED
                if item is None:                   # closed
                    return
                if item is _GAP_OUTLASTED:
                    with self._lock:
                        if keep[1] == self._requests and not self._open and self._busy_since is not None:
                            self._end_busy_period()
                    keep = None
                    continue
                if not held:
                    short_switch.hold()
                    held = True
                keep = self._request_done(*item) or keep
        finally:
            if held:
                short_switch.release()

    def _request_done(self, request, handle):
        """The watcher: wait for a request's GPU work; if it was our last, the busy period ends, or
        is kept open across the gap it returns, (until, request). A wait that begins while the
        switch interval is short: where the client's thread runs Python as the work completes (a
        reply to serialise), the watcher gets the GIL after that interval, not the default 5 ms."""
        try:
            self.recorder.wait(handle)
            self.recorder.done(handle)             # (True by now) the recorder may reuse its event
        except Exception:   # noqa: BLE001  a GPU error: the service meets it in its own synchronize, and
            pass            # the work will not complete any better; its lower clients must not stay held
        # No pause here to let the client's own thread (waiting for the same work: its result) take
        # the GIL first. Tried (a 50 µs sleep) before the short switch interval held here (gil.py): its
        # wait for the result came down at the P90 on an H100 (0.17-0.19 ms against 0.22-0.26), but where
        # that thread then runs Python (a reply to serialise), the watcher got the GIL back only at the
        # interpreter's 5 ms switch, and lower clients were released 5.5 ms after the GPU was done at the
        # median instead of 0.3 ms (docs/measurements.md, *What tracking its requests costs a service*).
        # With the interval at 0.5 ms that price would be ~0.5 ms: not tried again.
        with self._lock:
            if request == self._requests and not self._open and self._busy_since is not None:
                # none began meanwhile: the GPU has done all our work, and the busy period ends
                # here unless the next request comes back within the gap we keep it open for
                self._work_done_at = now = time.monotonic()
                gap = hold_for(RELEASE_COST_S, self._gaps) if now - self._busy_since < KEPT_OPEN_MAX_S else 0.0
                if gap:
                    return (now + gap, request)
                self._end_busy_period()
        return None

    def _end_busy_period(self):
        """Under self._lock: the busy period's latency is known (to the moment its work was done)."""
        self.protection.finished(not self._exposed, self._work_done_at - self._busy_since)
        self._publish_exposing()
        self._busy_since = None
        if self._exposed:
            self._guard_exposure(None, None)
        if self._active:
            self._mark(False)

    def _guard_exposure(self, deadline, period):
        """Protect busy period `period` at `deadline` if it is still running exposed (None: cancel).
        Exposure follows a baseline of protected requests, so the deadline is always finite."""
        with self._guard_cv:
            self._protect_at = None if deadline is None else (deadline, period)
            if self._guard is None and deadline is not None:
                self._guard = threading.Thread(target=self._exposure_guard, daemon=True,
                                               name=f"xsched-guard-{self.slot}")
                self._guard.start()
            self._guard_cv.notify()

    def _exposure_guard(self):
        while True:
            with self._guard_cv:
                while not self._guard_stop and (self._protect_at is None or self._protect_at[0] > time.monotonic()):
                    self._guard_cv.wait(None if self._protect_at is None else self._protect_at[0] - time.monotonic())
                if self._guard_stop:
                    return
                _, period = self._protect_at
                self._protect_at = None
            with self._lock:
                if period == self._period and self._busy_since is not None and not self._protecting:
                    self._protecting = True        # past the guard deadline: hold them after all ...
                    if self._work_done_at is None:
                        self._mark(True)           # ... from now, or (in a gap kept open) from its next request

    # --- per module call, while guarded ------------------------------------------------------------------
    def check(self):
        """Before a module's work and after a leaf's: hold here while the policy says so. Callers on
        the hot path first test `board_generation[0] != seen_generation or not clear_to_run`, and call
        this only when that holds (the same test opens this method)."""
        now = time.monotonic()
        if self.seen_generation != self.board_generation[0] or (self._wake_at is not None and now >= self._wake_at):
            self._refresh(now)
        if not self._may_run and self.guarded:
            self._wait_turn(now)

    def after_leaf(self, commands=1):
        """A leaf module launched its work (`commands` of it): the window's launch loop (a sync point
        where due), then a check."""
        launches = self.launches                   # read once: a board refresh may drop the window
        if launches is not None:
            launches.launched(commands)
        else:
            self._unwindowed_leaves += commands
        if self.seen_generation != self.board_generation[0] or not self.clear_to_run:
            self.check()                           # kernels a parent launches after this child are gated too

    @property
    def window(self):
        """Our progressive window while we are windowed, else None (the launch loop's)."""
        launches = self.launches
        return None if launches is None else launches.window

    def leaves_counted(self):
        """Changes whenever a leaf is counted (the count since the last sync point, the leaves counted
        without a window, and sync points)."""
        launches = self.launches
        return (0 if launches is None else launches.count), self._unwindowed_leaves, self._window_totals.sync_points

    @property
    def sync_points(self):
        """Sync points placed, in total (for reports)."""
        return self._window_totals.sync_points

    @property
    def blocked_syncs(self):
        """Window waits that found the GPU behind, in total."""
        return self._window_totals.blocked

    def backward_reached(self, grad_outputs):
        """A pre-hook on a request's output (pytorch._watch_for_backward): this client trains."""
        self.trains = True
        return None

    def backward_hook(self, leaves):
        """The pre-hook for the autograd node behind a guarded leaf that counts for `leaves` leaves (it
        and those since the previous hooked one: pytorch._hook_backward); one per count, made once."""
        hook = self._backward_hooks.get(leaves)
        if hook is None:
            hook = self._backward_hooks[leaves] = partial(self.before_backward, BACKWARD_COMMANDS * leaves)
        return hook

    def before_backward(self, commands, grad_outputs):
        """A pre-hook on the autograd node that made a guarded leaf's output: autograd calls it on its
        own thread once that output's gradient is ready, i.e. after the backward work of the modules
        that used it and before the leaf's own (the engine has set the stream that work runs on).
        Usually the launching thread waits inside backward() meanwhile; where another thread of
        the client launches at the same time, the leaf counts race (a sync point comes a little
        early or late) and the window itself is under its lock. A leaf's backward is counted as
        BACKWARD_COMMANDS: for the weighted layers that dominate it (convolutions, linear layers)
        it computes both the input's and the weights' gradients, about twice the forward's work,
        and the window sizes its segments by commands."""
        if self.guarded:
            if not self._backward_begun:
                self._backward_begun = True
                self._new_phase()
            self.after_leaf(commands)
        return None                                    # the gradients are left as they are

    def _new_phase(self):
        launches = self.launches
        if launches is not None:
            launches.new_phase()

    def _board_changed(self):
        return self.board_generation[0] != self.seen_generation

    def _wait_turn(self, start):
        self.waits += 1
        slot = self.slot
        if slot is not None:
            self.board.write(slot, held=1, announce=False)       # for `xsched-lv3 status`
        last_reap = start
        poll = POLL_MIN_S
        spin_until = start + self.spin_s
        while not self._may_run and self.guarded:
            now = time.monotonic()
            if now < spin_until:
                time.sleep(0)                     # stay runnable: an idle vCPU is slow to wake
            elif self._others_here:
                with _LOCAL_WRITES:               # a write between our read and this wait is seen here
                    # counted before the test: a writer that finds no waiter has bumped the generation already
                    _local_waiters[0] += 1
                    try:
                        if self.seen_generation == self.board_generation[0]:
                            timeout = LOCAL_WAIT_MAX_S if self._wake_at is None else \
                                min(LOCAL_WAIT_MAX_S, max(0.0, self._wake_at - now))
                            _LOCAL_WRITES.wait(timeout)
                    finally:
                        _local_waiters[0] -= 1
            else:
                time.sleep(poll)
                poll = min(POLL_MAX_S, poll * 2)
            now = time.monotonic()
            if now - last_reap > REAP_EVERY_S:
                self.board.reap()                 # a dead (or zombie) client must not hold us back forever
                self._excused = stopped_activations(self.board.states())
                last_reap = now
            self._refresh(now)
        self.held_s += time.monotonic() - start
        if slot is not None and slot == self.slot:
            self.board.write(slot, held=0, held_s=self.held_s, announce=False)
        window = self.window
        if window is not None:
            window.paused()

    def stats(self):
        """What this client went through, for reports (`XSCHED_LV3_REPORT`, benchmarks)."""
        window = self.window
        return {"priority": self.priority, "device": self.device, "level": self.level, "guarded": self.guarded,
                "tracking": self.tracking, "requests": self._requests, "busy_periods": self._period,
                "waits": self.waits,
                "held_s": self.held_s, "active_s": self.active_s, "sync_points": self.sync_points,
                "blocked_syncs": self.blocked_syncs, **self.protection.stats(),
                "window_cmd_us": window.cmd_us if window is not None and window.calibrated else self._dropped_cmd_us}

    def close(self):
        if os.getpid() != self._pid:
            # a forked child leaving (a DataLoader worker; atexit and `with` blocks run in it too): the
            # slot, the threads and the GPU work are its parent's, which goes on using them
            return
        with self._lock:
            if self._active:
                self._mark(False)
            slot, self.slot = self.slot, None
        if slot is not None:
            self.board.release(slot, self._pid)
            _wake_local_waiters()
        self._watch.put(None)                      # stops the watcher
        with self._guard_cv:
            self._guard_stop = True
            self._guard_cv.notify()
        if self._guard is not None and self._guard is not threading.current_thread():
            self._guard.join(WATCHER_JOIN_S)
        watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            # Wait for it: a daemon thread still inside a GPU wait when the interpreter finalizes is
            # killed as it takes the GIL back, and a C++ runtime aborts the process on that ("terminate
            # called without an active exception": seen at exit of a scheduled HP process).
            watcher.join(WATCHER_JOIN_S)
