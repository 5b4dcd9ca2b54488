"""The simulated GPU executes work in time: kernels rung into AQL queues run, share their device,
stop while their queue is unmapped and complete at a computed moment.

What is modelled:
- A queue runs its packets in order (an AQL queue's packet processor); only its head kernel runs.
  A kernel is (work_us, waves): its duration with the device to itself, and the wave slots it
  occupies.
- The heads of every runnable queue of a device run at once. SHARING IS AN ESTIMATE (no source
  describes how the CP firmware and the SPI share a device between queues): while the heads'
  waves fit the device's wave slots (timing.max_waves) each runs at full speed; beyond that every
  head progresses at capacity / total waves. A kernel wider than the device counts as the device's
  width, so alone it runs at full speed. Queue priority and CU masks are not modelled.
- A queue runs while it is active (QUEUE_IS_ACTIVE: not suspended, not evicted, percent > 0,
  mapped) and its device is not stalled by an HWS remap (TimingModel.settle calls `stall`). A
  queue that stops keeps the remaining work of its head kernel (CWSR saved its waves; without CWSR
  the timing model charges the drain) and goes on from there when it runs again. The running
  kernel's waves are the queue's resident_waves, which the save/restore cost model charges.
- A queue that is destroyed, or whose process exits, drops its work.

Time is real (time.monotonic_ns), as in the rest of the server. Nothing is polled: the rates of a
device change only when its set of running heads does, and the state in between is caught up
exactly, piece by piece, when someone looks (a doorbell, a query, a state change). The server
wakes for the moment a waiter's count is reached (`projected_done_ns`), through `WakeTimer`.
"""
import ctypes
import math
import os

from .timing import max_waves

AQL_PACKET_BYTES = 64          # hsa_kernel_dispatch_packet_t: a ring holds ring_size / 64 packets
MAX_WORK_US = 600e6            # a kernel of more than 10 minutes is a mistake, not a workload
MAX_WAVES = 1 << 24
DONE_EPSILON_US = 1e-6         # float residue below which a kernel counts as finished


class DeviceClock:
    """One device's execution state: which queues' heads run since `last_ns`, and until when an
    HWS remap stalls it."""

    def __init__(self, gpu_id, capacity):
        self.gpu_id = gpu_id
        self.capacity = capacity        # wave slots (timing.max_waves)
        self.running = []               # queues whose head kernel runs, as of the last plan
        self.last_ns = 0                # work is accounted up to here
        self.stalled_until_ns = 0
        self.epoch = 0                  # bumped whenever a projection of completions changes

    def speed(self, heads_waves):
        """Fraction of full speed each head runs at (the ESTIMATE above)."""
        demand = sum(min(w, self.capacity) for w in heads_waves)
        return 1.0 if demand <= self.capacity else self.capacity / demand


class Execution:
    def __init__(self, kfd):
        self.kfd = kfd
        self.clocks = {gpu: DeviceClock(gpu, max_waves(dev.node)) for gpu, dev in kfd.devices.items()}
        self.busy = {}                  # id(queue) -> (queue, process): queues with unfinished kernels

    # --- dispatch and completion ------------------------------------------------------------------
    def dispatch(self, proc, q, kernels, now_ns):
        """Ring `q`'s doorbell for `kernels` [(work_us, waves)]; returns the new dispatched count.
        ValueError (one line) for values no AQL packet could carry or more than the ring holds."""
        if not q.is_compute:
            raise ValueError(f"queue {q.qid} is not a compute queue")
        if not isinstance(kernels, list) or not kernels:
            raise ValueError("kernels must be a non-empty list of [work_us, waves]")
        checked = []
        for kernel in kernels:
            if not (isinstance(kernel, (list, tuple)) and len(kernel) == 2):
                raise ValueError(f"a kernel is [work_us, waves], got {kernel!r:.60}")
            work_us, waves = kernel
            if (isinstance(work_us, bool) or not isinstance(work_us, (int, float)) or not math.isfinite(work_us)
                    or not 0 < work_us <= MAX_WORK_US):
                raise ValueError(f"work_us must be a number in (0, {MAX_WORK_US:g}], got {work_us!r:.40}")
            if isinstance(waves, bool) or not isinstance(waves, int) or not 0 < waves <= MAX_WAVES:
                raise ValueError(f"waves must be an integer in [1, {MAX_WAVES}], got {waves!r:.40}")
            checked.append([float(work_us), waves])
        clock = self.clocks[q.gpu_id]
        self._catch_up(clock, now_ns)
        room = q.ring_size // AQL_PACKET_BYTES - len(q.kernels)
        if len(checked) > room:
            raise ValueError(f"queue {q.qid}'s ring holds {q.ring_size // AQL_PACKET_BYTES} packets and "
                             f"{len(q.kernels)} are outstanding: no room for {len(checked)} more")
        was_idle = not q.kernels
        q.kernels.extend(checked)
        q.dispatched += len(checked)
        self.busy[id(q)] = (q, proc)
        if was_idle:
            self._set_resident_waves(q, clock, now_ns)
        clock.epoch += 1
        self.replan(now_ns)
        return q.dispatched

    def completed(self, q, now_ns):
        """`q`'s completed count, caught up to now."""
        clock = self.clocks.get(q.gpu_id)
        if clock is not None:
            self._catch_up(clock, now_ns)
        return q.completed

    def stall(self, gpu_id, seconds, now_ns):
        """An HWS unmap+map: no queue of the device progresses for `seconds`, from now or from
        the end of a remap still under way (the DQM lock serialises them)."""
        clock = self.clocks[gpu_id]
        self._catch_up(clock, now_ns)
        clock.stalled_until_ns = max(clock.stalled_until_ns, now_ns) + int(seconds * 1e9)
        clock.epoch += 1

    def replan(self, now_ns):
        """After anything that may have changed which queues run (every request the server
        handles): catch each busy device up under its previous plan, drop the work of queues that
        are gone, and take the new set of running heads where it changed."""
        busy_gpus = {q.gpu_id for q, _proc in self.busy.values()}
        for gpu_id, clock in self.clocks.items():
            if gpu_id in busy_gpus or clock.running:
                self._catch_up(clock, now_ns)     # under the plan that held until this change
        for key in [key for key, (q, proc) in self.busy.items() if not _exists(q, proc)]:
            q, _proc = self.busy.pop(key)
            q.kernels.clear()                     # a destroyed queue's packets never run
        runnable = {}
        for q, _proc in self.busy.values():
            if q.is_active:
                runnable.setdefault(q.gpu_id, []).append(q)
        for gpu_id, clock in self.clocks.items():
            running = runnable.get(gpu_id, [])
            if {id(q) for q in running} != {id(q) for q in clock.running}:
                clock.running = running
                clock.epoch += 1

    # --- time ---------------------------------------------------------------------------------------
    def _catch_up(self, clock, now_ns):
        """Account the work done on `clock`'s device up to `now_ns` under its plan, completing
        kernels at the moments they finished (which changes the rates from there on)."""
        t = max(clock.last_ns, clock.stalled_until_ns)
        while clock.running and t < now_ns:
            rate = clock.speed(q.kernels[0][1] for q in clock.running)
            first_us = min(q.kernels[0][0] for q in clock.running)     # work left of the first to finish
            end = t + first_us / rate * 1e3
            if end > now_ns:
                worked_us = (now_ns - t) / 1e3 * rate
                for q in clock.running:
                    q.kernels[0][0] -= worked_us
                break
            # The first heads finish at `end`. Subtracting the very value that is their minimum
            # leaves them at exactly 0, so they retire even where `end` rounds to `t` (ns since boot
            # as a float resolve ~0.002 ns): every turn of this loop retires a kernel.
            for q in clock.running:
                q.kernels[0][0] -= first_us
            t = end
            self._retire_heads(clock, int(t))
        clock.last_ns = max(clock.last_ns, now_ns)

    def _retire_heads(self, clock, at_ns):
        still = []
        for q in clock.running:
            if q.kernels[0][0] <= DONE_EPSILON_US:
                q.kernels.popleft()
                q.completed += 1
                self._set_resident_waves(q, clock, at_ns)
                if not q.kernels:
                    self.busy.pop(id(q), None)
                    continue
            still.append(q)
        clock.running = still

    def _set_resident_waves(self, q, clock, at_ns):
        """The waves of the kernel at the queue's head: what CWSR saves when it is preempted."""
        q.sync_progress(at_ns)
        q.resident_waves = min(q.kernels[0][1], clock.capacity) if q.kernels else 0
        q.sync_progress(at_ns)

    def projected_done_ns(self, q, count):
        """When `q` will have completed `count` kernels if nothing changes meanwhile (the device's
        plan runs on); None if it will not (the queue does not run)."""
        if q.completed >= count:
            return 0
        clock = self.clocks[q.gpu_id]
        if not any(r is q for r in clock.running):
            return None
        t = max(clock.last_ns, clock.stalled_until_ns)
        # per running queue: [remaining of its head, iterator over the kernels after it, completed]
        lanes = []
        for r in clock.running:
            rest = iter(r.kernels)
            head = next(rest)
            lanes.append([head[0], head[1], rest, r.completed, r])
        while True:
            rate = clock.speed(lane[1] for lane in lanes)
            first_us = min(lane[0] for lane in lanes)      # exact 0 for the first to finish (see _catch_up)
            t += first_us / rate * 1e3
            next_lanes = []
            for lane in lanes:
                lane[0] -= first_us
                if lane[0] <= DONE_EPSILON_US:
                    lane[3] += 1
                    if lane[4] is q and lane[3] >= count:
                        return int(math.ceil(t))
                    following = next(lane[2], None)
                    if following is None:
                        continue
                    lane[0], lane[1] = following
                next_lanes.append(lane)
            lanes = next_lanes


def _exists(q, proc):
    return proc.alive and proc.queues.get(q.qid) is q


class WakeTimer:
    """A timerfd the server's selector watches: the simulated GPU's completion interrupt, armed for
    the next moment a waiter's count is reached. epoll's own timeout has millisecond granularity;
    kernels last microseconds."""

    CLOCK_MONOTONIC = 1                        # the clock of time.monotonic_ns
    TFD_NONBLOCK, TFD_CLOEXEC, TFD_TIMER_ABSTIME = 0o4000, 0o2000000, 1

    class _Itimerspec(ctypes.Structure):
        _fields_ = [("interval", ctypes.c_long * 2), ("value", ctypes.c_long * 2)]

    def __init__(self):
        self._libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self._libc.timerfd_create(self.CLOCK_MONOTONIC, self.TFD_NONBLOCK | self.TFD_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        self.armed_ns = None

    def fileno(self):
        return self.fd

    def arm(self, deadline_ns):
        """Fire at monotonic `deadline_ns` (None: disarm)."""
        if deadline_ns == self.armed_ns:
            return
        spec = self._Itimerspec()
        if deadline_ns is not None:
            deadline_ns = max(1, deadline_ns)         # all zeros would disarm
            spec.value[0], spec.value[1] = divmod(deadline_ns, 1_000_000_000)
        if self._libc.timerfd_settime(self.fd, self.TFD_TIMER_ABSTIME, ctypes.byref(spec), None) < 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")
        self.armed_ns = deadline_ns

    def acknowledge(self):
        try:
            os.read(self.fd, 8)
        except BlockingIOError:
            pass
        self.armed_ns = None

    def close(self):
        os.close(self.fd)
