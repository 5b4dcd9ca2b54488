"""Progressive launching with a window sized by estimated GPU time.

XSched bounds in-flight work by command *count* (threshold 16, batch 8), so a preemption waits for
up to `threshold` commands of unknown length (~8T in its paper). Here the window is GPU *time*: a
sync point is placed every `sync_every_us` of estimated work and no more than `window_us` is ever
in flight. The per-command estimate is learned from the spacing of completed sync points, so the
window adapts to kernels of any length without a per-kernel profile.

Sync points that already completed are retired by a non-blocking query (`retire`), so a client whose
GPU keeps up (the CPU is the bottleneck) never stalls on a sync point its GPU has passed; given the
GPU timestamps of consecutive sync points, `retire` also learns the GPU time per command from them.
That span includes GPU idle gaps when the CPU is the bottleneck, an over-estimate that costs only
a few more sync points, never a wait.
"""
from collections import deque

# The one default for every window (the inline gate, XQueue, `xsched-lv3 run`): the most GPU time a
# held-back client may leave in flight, i.e. what a higher-priority arrival waits for at worst (Lv1).
# Chosen from the window sweep in results/bench_window_sweep.json (README, "Choosing the window").
DEFAULT_WINDOW_US = 500.0


class ProgressiveWindow:
    def __init__(self, window_us=DEFAULT_WINDOW_US, sync_fraction=0.5, initial_cmd_us=50.0, min_commands=2,
                 calibration_commands=4):
        self.window_us = float(window_us)
        self.sync_every_us = self.window_us * sync_fraction
        self.cmd_us = float(initial_cmd_us)      # EMA of GPU time per command
        self.min_commands = min_commands
        # until one sync point has completed, the estimate is a guess: bound by count instead
        self.calibration_commands = calibration_commands
        self.calibrated = False
        self.pending = deque()                   # (handle, est_us, n_commands, t_recorded)
        self.pending_us = 0.0                    # sum of est_us over pending (kept, not recomputed)
        self.since_sync_us = 0.0
        self.since_sync_n = 0
        self.last_retired = None                 # the newest sync point known complete (GPU spans)
        self._unpaired = 0

    @property
    def in_flight_us(self):
        return self.pending_us + self.since_sync_us

    @property
    def in_flight_commands(self):
        return sum(p[2] for p in self.pending) + self.since_sync_n

    def after_launch(self, est_us=None):
        """Account a launched command; True when a sync point should be recorded now."""
        self.since_sync_us += self.cmd_us if est_us is None else est_us
        self.since_sync_n += 1
        if not self.calibrated:
            return self.since_sync_n >= self.min_commands
        return self.since_sync_us >= self.sync_every_us and self.since_sync_n >= self.min_commands

    def recorded(self, handle, now):
        self.pending.append((handle, self.since_sync_us, self.since_sync_n, now))
        self.pending_us += self.since_sync_us
        self.since_sync_us, self.since_sync_n = 0.0, 0

    def must_wait(self):
        """The oldest sync point to wait on before launching more, or None."""
        if not self.pending:
            return None
        if self.in_flight_us > self.window_us:
            return self.pending[0][0]
        if not self.calibrated and self.in_flight_commands >= self.calibration_commands:
            return self.pending[0][0]
        return None

    def over(self):
        """True when launching more would exceed the window (the caller then retires or waits)."""
        if not self.pending:
            return False
        if self.pending_us + self.since_sync_us > self.window_us:
            return True
        return not self.calibrated and self.in_flight_commands >= self.calibration_commands

    def retire(self, is_done, gpu_span_us=None):
        """Drop the sync points that already completed (`is_done(handle)` must not block). With
        `gpu_span_us(earlier, later)` (µs between two sync points on the GPU's clock), learn the GPU
        time per command from consecutive ones."""
        pending = self.pending
        while pending and is_done(pending[0][0]):
            handle, est, n, _ = pending.popleft()
            self.pending_us = max(0.0, self.pending_us - est)
            if self._unpaired:
                self._unpaired -= 1
            elif gpu_span_us is not None and self.last_retired is not None and n:
                self._learn(gpu_span_us(self.last_retired, handle) / n)
            self.last_retired = handle

    def paused(self):
        """The client was held back (or the GPU given to others): GPU spans reaching across the
        pause are not work, so the sync points pending now and the next one teach nothing."""
        self._unpaired = len(self.pending) + 1

    def _learn(self, measured_us):
        self.cmd_us = measured_us if not self.calibrated else 0.8 * self.cmd_us + 0.2 * measured_us
        self.calibrated = True

    def completed(self, now, previous_done_at):
        """The oldest sync point completed at `now`; learn the per-command GPU time from it."""
        handle, est, n, t_rec = self.pending.popleft()
        self.pending_us = max(0.0, self.pending_us - est)
        start = t_rec if previous_done_at is None else max(previous_done_at, t_rec)
        if n and now > start:
            self._learn((now - start) * 1e6 / n)
        return handle

    def clear(self):
        self.last_retired, self._unpaired = None, 0
        self.pending.clear()
        self.pending_us = 0.0
        self.since_sync_us, self.since_sync_n = 0.0, 0
