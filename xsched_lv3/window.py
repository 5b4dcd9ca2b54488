"""Progressive launching with a window sized by estimated GPU time.

XSched bounds in-flight work by command *count* (threshold 16, batch 8), so a preemption waits for
up to `threshold` commands of unknown length (~8T in its paper). Here the window is GPU *time*: a
sync point is placed every `sync_every_us` of estimated work and no more than `window_us` is ever
in flight. The per-command estimate is learned from the spacing of completed sync points, so the
window adapts to kernels of any length without a per-kernel profile.

Sync points cost CPU time, which a launch-bound client (the CPU is its bottleneck) cannot spare and
does not need (its GPU keeps up, so little is ever in flight). So the GPU time per command is learned
only where the GPU is seen behind: a sync point still incomplete when the window is full is waited
for, and two such waits in a row, the second segment queued before the first completed, time one
segment of pure GPU work. Until then sync points start a few commands apart and double while the
GPU keeps up, up to MAX_COMMANDS_PER_SYNC; completed ones are retired by a non-blocking query.
"Keeping up" is judged half a window of CPU time after each sync point (`look_after`, `look_back`):
a segment that ends at a synchronize is always complete by the next sync point, so that alone cannot
tell a launch-bound client from one whose GPU falls behind a little with every command. For the same
reason, the GPU found past a sync point proves it keeps up only where that is seen within a window of
it: later, the client's own synchronize (or a hold) may have drained it.

One loop for every client: `WindowedLaunches` counts a client's commands and places its sync points
and look-backs through `ProgressiveWindow.sync_point` and `look_back`, on whichever thread launches
them: the XQueue's launch worker (buffered mode), or the launching thread itself (inline mode:
`XQueue(inline=True)`, and the gate, which is that mode for frameworks that launch by themselves,
PyTorch eager and the simulated HIP runtime). The XQueue may also know each command's GPU time.
"""
import threading
import time
from collections import deque
from dataclasses import dataclass

# The one default for every window (the inline gate, XQueue, `xsched-lv3 run`): the most GPU time a
# held-back client may leave in flight, i.e. what a higher-priority arrival waits for at worst (Lv1).
# docs/measurements.md, *Choosing the window*: kept at the HP-side bound; a sweep (results/diagnostics/window_sweep_*)
# was too small to move it.
DEFAULT_WINDOW_US = 500.0
# The widest window (1 s of GPU time in flight, already unbounded in effect; 0 says so): beyond it the
# sync-point spacing derived from it overflows.
MAX_WINDOW_US = 1e6


def check_window_us(value):
    """A window bound from a user (the CLI, the environment): 0 (unbounded) up to MAX_WINDOW_US."""
    if not 0 <= value <= MAX_WINDOW_US:
        raise ValueError(f"the window must be between 0 (unbounded) and {MAX_WINDOW_US:g} µs, got {value!r}")
    return value
# The most commands between two sync points: where a client's GPU keeps up (it is launch-bound, its
# in-flight work small), sync points are this far apart; a launch-bound phase turning GPU-bound
# overshoots the window by at most two such segments, once, before the window learns. A sync point
# costs a launch-bound client far more than its CPU time (an event recorded and queried amid its
# launches): on an H100, ResNet-50 b16 lost 12 % at one every 32 leaves and 7 % at one every 128
# (scripts/bench_gate_overhead.py, results/diagnostics/sync_cost_*.json).
MAX_COMMANDS_PER_SYNC = 128
# A learned estimate is forgotten after this many sync points in a row that found the GPU keeping up:
# the client is launch-bound (now), its in-flight work small whatever the estimate says, and a sync
# point every half window of estimated GPU time costs it CPU time it lacks. Seen on an H100: a
# launch-bound ResNet-50 b16 LP that learned ~30 us a command while another process's kernels slowed
# its own (an exposed request of a service) placed 3x as many sync points for the rest of its run.
FORGET_AFTER_KEPT_UP = 8


# While every higher-priority client on the device runs its requests beside ours (its protection
# judged us harmless: `exposing` on the board), the window is this many times wider. Those requests
# already share the GPU with whatever we queue; the window then bounds only what a request that does
# hold us (a protected one, or an exposed one its guard protects mid-way) waits for, and such waits
# are what the protection's overrun test judges. A GPU-bound client keeps its GPU fed that way: on an
# H100, a ViT-B/16 b32 LP at 500 us placed a sync point after nearly every leaf and waited at half of
# them (0.87 of alone while held under 1 s of 26 s; docs/measurements.md, *A wider window while the service exposes*).
EXPOSED_WINDOW_SCALE = 4


class ProgressiveWindow:
    def __init__(self, window_us=DEFAULT_WINDOW_US, sync_fraction=0.5, initial_cmd_us=50.0, min_commands=2,
                 calibration_commands=4):
        self.window_us = float(window_us)
        self.sync_fraction = sync_fraction
        self.sync_every_us = self.window_us * sync_fraction
        self.cmd_us = float(initial_cmd_us)      # EMA of GPU time per command
        self.min_commands = min_commands
        # until one sync point has completed, the estimate is a guess: bound by count instead
        self.calibration_commands = calibration_commands
        self.calibrated = False
        self.pending = deque()                   # (handle, est_us, n_commands)
        self.pending_us = 0.0                    # sum of est_us over pending (kept, not recomputed)
        self.since_sync_us = 0.0
        self.since_sync_n = 0
        self._chain_at = None                    # when the last waited-for sync point completed
        self._kept_up_in_row = 0                 # sync points in a row that found the GPU keeping up
        self.per_sync = self.commands_per_sync()  # commands to launch before the next sync point
        self._recorded_at = None                 # when the latest sync point was recorded (None: paused)
        self._cpu_us = None                      # CPU time per command between sync points, latest measured
        self._looked = None                      # this segment's look-back: True (caught up), False (behind)
        self.look_after = 0                      # commands after the latest sync point to look back (0: no)

    def resize(self, window_us):
        """A new bound from the next sync point on (what is in flight stays)."""
        if window_us == self.window_us:
            return
        self.window_us = float(window_us)
        self.sync_every_us = self.window_us * self.sync_fraction
        if self.calibrated:
            self.per_sync = self._learned_spacing()

    @property
    def in_flight_us(self):
        return self.pending_us + self.since_sync_us

    def sync_point(self, handle, n, is_done, wait, est_us=None, changed=None):
        """The one window loop: a sync point (`handle`) recorded after `n` commands. Retires what the
        GPU has passed (`is_done(handle)` never blocks); while launching more would exceed the window,
        waits (`wait(handle)`) for the oldest, and an interval waited back to back teaches the GPU
        time per command. `est_us`: the commands' GPU time where the caller knows it, else they weigh
        the learned time. `changed()`: whether another client's activity changed during the wait (its
        kernels may then be in the interval, which is not learned). Returns whether it waited; the
        commands to launch before the next sync point are then in `per_sync`."""
        # read once: another thread of the client may pause() the window meanwhile (the gate does so
        # without the window's lock)
        recorded_at = self._recorded_at
        segment_us = None if recorded_at is None else (time.monotonic() - recorded_at) * 1e6
        if segment_us is not None and n:         # launching only since the last one (no wait, no hold)
            self._cpu_us = segment_us / n
        self.look_after = 0                      # (a look due and not made: unlooked, below)
        self.segment(handle, n, est_us)
        # kept up: the previous segment is done by now (the very first sync point proves nothing), and
        # half a window after the latest one the GPU had caught up with it, where that was looked at.
        # Unlooked, "done by now" proves it only if this segment took at most a window to launch:
        # longer, and the client's own synchronize (or a hold) may have drained the GPU meanwhile.
        retired = self.retire(is_done)
        if self._looked is None:
            kept_up = retired > 0 and (self.calibrated or self._within_window(segment_us))
        else:
            kept_up = self._looked
        kept_up = kept_up and len(self.pending) <= 1
        self._looked = None
        waited = self.over()
        if waited:                               # the GPU is behind by more than the window
            wait(self.pending[0][0])
            waited_at = time.monotonic()
            if changed is not None and changed():
                self.others_changed()
            self.retire(is_done, waited_at=waited_at, launched_from=recorded_at)
        self.per_sync = self.commands_per_sync(self.per_sync, kept_up, behind=waited)
        self._recorded_at = time.monotonic()
        self.look_after = self._look_after()
        return waited

    def _look_after(self, launched=0, elapsed_us=0.0):
        """After how many commands the latest sync point is looked at (0: not at all): once half a
        window of CPU time has passed at the measured time per command, counting `launched` commands
        that took `elapsed_us` since it, where that comes before the next sync point and nothing was
        learned (a learned window bounds its work by time and waits)."""
        if self.calibrated or not self._cpu_us:
            return 0
        after = launched + int((self.sync_every_us - elapsed_us) / self._cpu_us) + 1
        return after if after < self.per_sync else 0

    def look_back(self, is_done):
        """`look_after` commands after the latest sync point (half a window of CPU time): if the GPU
        has not reached it yet, more than half a window of work was queued ahead of it when it was
        recorded. The spacing halves, and does not double at the next sync point. Why: a client whose
        GPU time per command is a little above its CPU time falls behind all through a long segment
        (40 us of GPU against 30 us of CPU, 128 commands: ~1.3 ms queued by its end, against a 500 us
        window), yet if it synchronizes each iteration, every sync point finds the one before it
        complete, and the spacing would never come down. A look that comes more than a window after
        the sync point (its own synchronize, just after the sync point, drained the GPU first) proves
        nothing either way: the spacing then stays. So does that of a client that takes more than a
        window of CPU time to launch one command (rare: PyTorch leaves take tens of µs), which then
        keeps a sync point every few commands: a few % of its CPU time, and nothing queued."""
        looked_at, self.look_after = self.look_after, 0
        recorded_at = self._recorded_at          # read once, as in sync_point
        if recorded_at is None or not self.pending or not looked_at:
            return
        elapsed_us = (time.monotonic() - recorded_at) * 1e6
        if elapsed_us < self.sync_every_us:
            # launched faster than the last interval suggested (it may have held a synchronize of
            # the client's own): too early to tell; look again once half a window has passed at
            # the rate seen since the sync point
            self._cpu_us = elapsed_us / looked_at
            self.look_after = self._look_after(looked_at, elapsed_us)
            return
        # in order, so the latest sync point is left pending exactly when the GPU has not reached it
        # (done handles leave the window, and may be reused)
        self.retire(is_done)
        if self.pending:
            self._looked = False
            self.per_sync = max(1, self.per_sync // 2)
        else:
            # reached: at most `elapsed_us` of work was queued ahead of it
            self._looked = self._within_window(elapsed_us)

    def _within_window(self, elapsed_us):
        """Whether the GPU found past a sync point `elapsed_us` after it was recorded (None: not
        known) proves that it keeps up: only within a window of it. Later, the client's own
        synchronize (or a hold) may have drained it."""
        return elapsed_us is not None and elapsed_us <= self.window_us

    def segment(self, handle, n, est_us=None):
        """A sync point after `n` commands counted by the caller: each weighs the learned GPU time
        (nothing while none was learned), unless the caller knows their time (`est_us`)."""
        self.since_sync_n += n
        if est_us is not None:
            self.since_sync_us += est_us
        elif self.calibrated:
            self.since_sync_us += n * self.cmd_us
        self._recorded(handle)

    def sync_due(self, n, est_us):
        """For a caller that knows its commands' GPU time: is half a window of it launched since the
        last sync point? (Otherwise `per_sync` commands are the rule.)"""
        return n >= self.per_sync or (est_us is not None and est_us >= self.sync_every_us and n >= self.min_commands)

    def backlog(self, handle):
        """A sync point after work launched before the window existed, of unknown length: it counts
        as two windows, so the next sync point waits for it to drain."""
        self.since_sync_n += 1
        self.since_sync_us += 2 * self.window_us
        self._recorded(handle)

    def _recorded(self, handle):
        self.pending.append((handle, self.since_sync_us, self.since_sync_n))
        self.pending_us += self.since_sync_us
        self.since_sync_us, self.since_sync_n = 0.0, 0

    def commands_per_sync(self, current=None, kept_up=False, behind=False):
        """How many commands to launch before the next sync point: half a window of the learned GPU
        time (at least one command). Before anything was learned: few at first (a GPU-bound client
        is seen behind within a few commands and learns), doubling up to MAX_COMMANDS_PER_SYNC each
        time the GPU was found to keep up (`kept_up`: every sync point but the newest done, no wait)
        and halving each time it was found `behind` (a whole segment queued behind another: waited
        for). A learned time is forgotten once FORGET_AFTER_KEPT_UP sync points in a
        row found the GPU keeping up.

        Why halve: "kept up" is also what a GPU-bound client shows at its first sync point after it
        drained the GPU itself (a synchronize each iteration), and learning may never succeed (every
        wait overlaps another client's activity, `changed`). Doubling alone then ratchets the spacing
        up to MAX_COMMANDS_PER_SYNC, past a whole iteration of its work, and the window bounds nothing:
        seen in the simulator, a batch job of 20 x 8 ms kernels a call, held at Lv1 next to a service
        that wrote the board 40 times a second, kept all 160 ms of a call queued, and the service ran
        at native latency."""
        if self.calibrated:
            self._kept_up_in_row = self._kept_up_in_row + 1 if kept_up else 0
            if self._kept_up_in_row < FORGET_AFTER_KEPT_UP:
                return self._learned_spacing()
            # launch-bound now: back to spacing by doubling; a GPU-bound phase is seen behind and learned anew
            self.calibrated, self._kept_up_in_row, self._chain_at = False, 0, None
        if current is None:
            return self.calibration_commands
        if behind:
            return max(1, current // 2)
        return min(MAX_COMMANDS_PER_SYNC, 2 * current) if kept_up else current

    def _learned_spacing(self):
        """Commands in half a window of the learned GPU time (at least one)."""
        return max(1, min(MAX_COMMANDS_PER_SYNC, int(self.sync_every_us / max(self.cmd_us, 1e-3))))

    def over(self):
        """True when launching more would exceed the window (the caller then retires or waits).
        Before anything was learned: when a whole segment is still queued behind another."""
        if not self.pending:
            return False
        if self.in_flight_us > self.window_us:
            return True
        return not self.calibrated and len(self.pending) >= 2

    def retire(self, is_done, waited_at=None, launched_from=None):
        """Drop the sync points that already completed (`is_done(handle)` must not block).
        `waited_at`: the oldest was just waited for and completed then (the GPU was behind). When
        the one before it also completed under a wait, with this one already queued, the GPU ran
        this segment back to back: the interval is its GPU time, and the estimate learns from it.

        A segment waited for alone (nothing queued behind it) teaches nothing that way, and once the
        estimate is above the window every segment is waited for alone: a single command is over the
        window by itself. The estimate would then stay where it is for good, whatever the client does
        next (a job whose commands shrink after a phase of 800 us ones went on waiting for every
        command, the GPU idle while it launched the next: 0.63-0.77 of its GPU time on a scripted
        GPU). So there a segment waited for alone bounds its GPU time from above, launched no earlier
        than the sync point before it and done when waited for, and a bound below the estimate is
        learned. Only there: the bound is one segment's, and below the window, where segments of
        several commands are waited for alone too, the light ones' bounds pulled the one estimate
        under the mean of a mixed job and let it queue more than the window (a review's scripted
        clients: 57 of 600 worse, none better). `launched_from`: when the newest segment's commands
        began to be launched (the sync point before it was recorded; None: not known), which is the
        one waited for alone. Returns how many it dropped."""
        pending = self.pending
        first, retired = True, 0
        while pending and is_done(pending[0][0]):
            handle, est, n = pending.popleft()
            self.pending_us = max(0.0, self.pending_us - est)
            if first and waited_at is not None:
                chain_at = self._chain_at        # read once: another thread may clear it meanwhile (gate)
                if chain_at is not None and n:
                    self._learn((waited_at - chain_at) * 1e6 / n)
                elif not pending and launched_from is not None and n and self.cmd_us > self.window_us:
                    at_most_us = (waited_at - launched_from) * 1e6 / n
                    if at_most_us < self.cmd_us:
                        self._learn(at_most_us)
                self._chain_at = waited_at if pending else None     # the next segment is queued behind
            else:
                self._chain_at = None
            first = False
            retired += 1
        return retired

    def new_phase(self):
        """The client's launching changes pace: autograd's C++ engine takes over from Python's forward
        pass. A spacing that grew by doubling while the GPU kept up with the slower phase would let
        the faster one queue a whole segment of it at once (a training ResNet-50 b32 on an H100: 128
        commands, ~8 ms of backward, ahead of a service's request), so an unlearned spacing starts
        over; a learned one is in GPU time and holds."""
        self.paused()
        if not self.calibrated:
            self.per_sync = min(self.per_sync, self.calibration_commands)

    def paused(self):
        """The client was held back (or stopped launching for another reason): an interval reaching
        across this point is not (only) this client's GPU work, and is not learned from; nor is it
        CPU time per command, and the GPU may have drained meanwhile, so no look back is made."""
        self.others_changed()
        self._recorded_at = None
        self.look_after = 0

    def others_changed(self):
        """Another client's activity changed while this one launches on: an interval reaching across
        this point may hold its GPU work (its kernels between ours), and is not learned from. The
        look back stays due: our launching went on, and another client's kernels can only make ours
        look further behind, never ahead (cancelled, a launch-bound training client on a scripted
        clock placed 6.4 sync points an iteration instead of 6.0 while the board changed 400 times a
        second)."""
        self._chain_at = None

    def _learn(self, measured_us):
        first = not self.calibrated
        self.cmd_us = measured_us if first else 0.8 * self.cmd_us + 0.2 * measured_us
        self.calibrated = True
        if first:           # segments recorded before anything was learned weighed nothing: weigh them now
            weighed = [(h, est or n * self.cmd_us, n) for h, est, n in self.pending]
            self.pending.clear()                 # in place: retire() is walking this deque
            self.pending.extend(weighed)
            self.pending_us = sum(p[1] for p in self.pending)

    def clear(self):
        self._chain_at = None
        self._recorded_at, self.look_after, self._looked = None, 0, None
        self.pending.clear()
        self.pending_us = 0.0
        self.since_sync_us, self.since_sync_n = 0.0, 0


@dataclass
class LaunchTotals:
    """What a client's launch loops counted, over every window it had (a client keeps one across
    the windows it drops and makes again)."""
    sync_points: int = 0
    blocked: int = 0                             # sync points that waited: the GPU behind by more than the window


class WindowedLaunches:
    """One client's launches under its window, counted on whichever thread makes them: after each
    launch (`launched`), a sync point where the window's spacing says (recorded with `record()`,
    which may wait while the window is full), else a look back where one is due. `done(handle)`
    never blocks, `wait(handle)` does (an HwQueue's sync_point_done and wait_sync_point, or a
    recorder's done and wait); `changed()`, if given, tells whether another client's activity changed
    during a wait (what the window then does not learn from). `totals`: the LaunchTotals to count
    into.

    The count is kept outside the lock: threads of one client that launch at once may race on it (a
    sync point a command early or late). A sync point is recorded, and the count taken, under `lock`,
    so the window's pending sync points stay in the order they were recorded; the window itself is
    changed under `lock` only, except for `paused` and `others_changed`, which any thread may call
    (they only forget state)."""

    def __init__(self, window, record, done, wait, changed=None, totals=None):
        self.window = window
        self.record, self.done, self.wait, self.changed = record, done, wait, changed
        self.lock = threading.Lock()
        self.count = 0                           # commands launched since the last sync point
        self.est_us = 0.0                        # ... their GPU time where every one's is known, else None
        self.per_sync = window.per_sync          # the window's, copied: read after every launch
        self.look_after = 0
        self.totals = LaunchTotals() if totals is None else totals

    @property
    def sync_points(self):
        return self.totals.sync_points

    def launched(self, commands=1, est_us=None):
        """`commands` were launched (`est_us`: their GPU time, if known): a sync point or a look
        back where due. Returns whether a sync point was placed. On every launch of a guarded
        client (PyTorch: every leaf module), so kept to a few attribute reads."""
        before = self.count
        self.count = count = before + commands
        known = self.est_us
        if known is not None:
            self.est_us = known = None if est_us is None else known + est_us
        if count >= self.per_sync or known is not None and self.window.sync_due(count, known):
            self.sync_point()
            return True
        if before < self.look_after <= count:
            self.look_back()
        return False

    def sync_point(self):
        """A sync point after the commands counted since the last one (waits while the window is full)."""
        with self.lock:
            handle = self.record()
            n, est_us = self.count, self.est_us
            self.count, self.est_us = 0, 0.0
            window = self.window
            self.totals.sync_points += 1
            self.totals.blocked += window.sync_point(handle, n, self.done, self.wait, est_us, self.changed)
            self.per_sync, self.look_after = window.per_sync, window.look_after

    def look_back(self):
        with self.lock:
            window = self.window
            window.look_back(self.done)
            self.per_sync, self.look_after = window.per_sync, window.look_after

    def new_phase(self):
        """The client's launching changes pace (ProgressiveWindow.new_phase)."""
        with self.lock:
            window = self.window
            window.new_phase()
            self.per_sync, self.look_after = window.per_sync, window.look_after

    def resize(self, window_us):
        with self.lock:
            self.window.resize(window_us)
            self.per_sync = self.window.per_sync

    def clear(self):
        """Everything launched is known complete (the client drained, or went idle). The count goes
        on: the commands since the last sync point are a segment's start all the same."""
        with self.lock:
            self.window.clear()
            self.per_sync, self.look_after = self.window.per_sync, 0
