"""The simulated GPU executes work in time: kernels rung into AQL queues occupy the device's wave
slots, wait for slots when the device is full, stop while their queue is unmapped and complete at
a computed moment.

The model: wave slots, filled by dispatch and freed only when waves retire or are saved.
- A queue runs its packets in order (an AQL queue's packet processor) and only its head kernel
  dispatches: the next kernel starts once the head has completed (the barrier bit HIP sets).
  A kernel is (work_us, waves): its duration with the device to itself, and its wave count.
- A device has `capacity` wave slots (timing.max_waves: CUs x 40). A kernel runs in
  rounds = ceil(min(waves, capacity * max(1, floor(work_us / MIN_WAVE_US))) / capacity)
  and each of its waves lasts work_us / rounds, so alone it takes exactly work_us. That is
  ceil(waves / capacity) rounds, except that a modelled wave lasts at least MIN_WAVE_US (or the
  whole kernel, if shorter): a kernel of more, shorter waves is modelled as fewer, longer ones.
  A bound on the events per simulated second (ESTIMATE where it applies: a kernel arriving then
  may wait up to MIN_WAVE_US longer for a slot than on hardware).
- Waves retire on a tick: at the first multiple of EVENT_TICK_US (of the monotonic clock) at or
  after their end, so a wave lasts up to EVENT_TICK_US longer than modelled. Without it the
  moments at which waves end drift apart (a kernel's waves dispatched in pieces as slots free,
  other queues' waves, CWSR restores and HWS stalls each add end times that never merge again):
  three batch jobs of full-device 8 ms kernels reached ~1000 distinct end times, ~120k events per
  simulated second, more than the server's one thread could play in real time. With the tick the
  events are at most 1 / EVENT_TICK_US per simulated second. A modelling bound, not a hardware
  fact (ESTIMATE).
- Waves are dispatched onto free slots and keep them until they retire: a running wave is never
  preempted, so a kernel that arrives while other waves fill the device waits for them to retire,
  then competes for the slots they free. SOURCED: ROCm HIP docs, "Hardware Implementation"
  (docs/understand/hardware_implementation.rst): blocks are scheduled onto CUs, and a block the
  CU has no room for waits until other blocks finish. A kernel completes when its last wave retires.
- Free slots go to the runnable queues' heads that want them, round-robin (equal shares, the
  remainder one wave each from a rotating start). ESTIMATE: the SPI's arbitration between queues
  is not documented. Queue priority is not modelled: the MQD carries it (kfd_mqd_manager_v9.c:
  set_priority writes cp_hqd_pipe_priority / cp_hqd_queue_priority) but no source says how the
  SPI uses it. Also ESTIMATE: all waves of a kernel last equally long; waves, not workgroups,
  are dispatched; CU masks are not modelled.
- A queue runs while it is active (QUEUE_IS_ACTIVE: not suspended, not evicted, percent > 0,
  mapped). When it stops, with CWSR enabled its resident waves are saved at once (their slots
  free) and, when it runs again, restored with the time they had left before any new wave of that
  queue dispatches; without CWSR they run on to completion (drain) while no new wave dispatches.
  SOURCED: kfd_device_queue_manager.c: update_queue / evict_process_queues_nocpsch (no HWS)
  preempt with KFD_PREEMPT_TYPE_WAVEFRONT_SAVE when cwsr_enabled, else _DRAIN; under HWS the CP
  saves when the MQD has a save area, which kfd_mqd_manager_v9.c: init_mqd programs only with CWSR
  (the firmware is closed). The save/restore costs time in the timing model (timing.py), charged
  as an HWS stall (below). ESTIMATE: the saved waves come back before any new wave of the queue
  (the CP reloads the saved context when it maps the queue again) and need free slots like any.
- An HWS unmap+map (TimingModel.settle calls `stall`): kfd_device_queue_manager.c:
  execute_queues_cpsch unmaps every dynamic queue of the device (unmap_queues_cpsch with
  KFD_UNMAP_QUEUES_FILTER_DYNAMIC_QUEUES), so for the stall's length nothing new dispatches and,
  with CWSR, every resident wave of the device is saved and restored: it makes no progress. Without
  CWSR the waves drain meanwhile (the timing model charges that drain as its 1 ms ESTIMATE).
- A queue's resident_waves is its waves on slots (what the timing model's save costs charge).
- A queue that is destroyed, or whose process exits, drops its work and its slots free at once.

Waves are tracked in cohorts: the waves of one queue dispatched at one instant share an end and
retire together, so a kernel of millions of waves on thousands of slots costs a few events per
round, not one per wave. Time is real (time.monotonic_ns), as in the rest of the server. Nothing
is polled: the state is caught up exactly, event by event, when someone looks (a doorbell, a query,
a state change), under the plan (which queues run) that held until then. The server wakes for the
moment a waiter's count is reached (`wake_ns`, replaying the same events on a copy), through
`WakeTimer`. That replay runs in the server's one thread, so it is bounded: at most
PROJECTION_EVENTS events per device, and one replay for all the waiters of a device, kept until its
plan changes. A waiter further away than that gets a wake at the last event replayed, where the
replay goes on from the caught-up state.
"""
import bisect
import ctypes
import math
import operator
import os

from .timing import max_waves

_END = operator.itemgetter(1)     # a cohort's end
AQL_PACKET_BYTES = 64          # hsa_kernel_dispatch_packet_t: a ring holds ring_size / 64 packets
MAX_WORK_US = 600e6            # a kernel of more than 10 minutes is a mistake, not a workload
MAX_WAVES = 1 << 24
# The shortest modelled wave: about the server's own round trip (~0.1 ms), below which a shorter
# wave could not be observed anyway. A modelling bound (see above), not a hardware fact.
MIN_WAVE_US = 100.0
# Events one wake projection replays at most (~10-20 µs each in CPython). Unbounded, three batch
# jobs of 8 ms kernels sharing a device (their waves fragment into ~100 cohorts) took ~2000 events
# and up to 48 ms of the server's one thread to project a waiter 100-300 ms ahead, after every
# change of plan (each launch of another process): every other process's reply waited meanwhile.
PROJECTION_EVENTS = 64
EVENT_TICK_US = MIN_WAVE_US    # waves retire on this grid (see above): no finer than a modelled wave
EVENT_TICK_NS = int(EVENT_TICK_US * 1e3)


class Lane:
    """One queue's work on its device: the dispatch state of its head kernel. The kernels stay in
    q.kernels, which only the Execution changes (so a projection can replay a copy of the lane).
    Cohorts are [waves, end_ns] on slots, in the order of their ends (the next to retire first,
    one cohort per end); saved cohorts [waves, ns left] (CWSR)."""

    __slots__ = ("q", "proc", "runnable", "retired_ns", "has_head", "wave_ns", "undispatched",
                 "cohorts", "resident", "saved", "saved_waves")

    def __init__(self, q, proc, runnable):
        self.q, self.proc, self.runnable = q, proc, runnable
        self.retired_ns = []            # when each kernel completed that is not yet taken off q.kernels
        self.has_head = False
        self.wave_ns = 0
        self.undispatched = 0           # head waves not yet dispatched
        self.cohorts = []
        self.resident = 0               # waves on slots
        self.saved = []
        self.saved_waves = 0

    def copy(self):
        twin = Lane(self.q, self.proc, self.runnable)
        twin.retired_ns, twin.has_head, twin.wave_ns, twin.undispatched = (
            self.retired_ns[:], self.has_head, self.wave_ns, self.undispatched)
        twin.cohorts = [c[:] for c in self.cohorts]
        twin.resident = self.resident
        twin.saved = [s[:] for s in self.saved]
        twin.saved_waves = self.saved_waves
        return twin

    @property
    def retired(self):
        """Kernels completed and not yet taken off q.kernels."""
        return len(self.retired_ns)

    @property
    def wants(self):
        """Slots the head would take now: its saved waves, then its waves not yet dispatched."""
        return self.saved_waves + self.undispatched if self.runnable else 0

    def start_waves(self, n, at_ns):
        """Put `n` (at most `wants`) waves on slots at `at_ns`: saved ones first (CWSR restores a
        queue's waves before its packet processor dispatches more)."""
        self.resident += n
        while n and self.saved:
            waves, left_ns = self.saved[-1]
            take = min(waves, n)
            self._add_cohort(take, at_ns + left_ns)
            if take == waves:
                self.saved.pop()
            else:
                self.saved[-1][0] -= take
            self.saved_waves -= take
            n -= take
        if n:
            self.undispatched -= n
            self._add_cohort(n, at_ns + self.wave_ns)

    def _add_cohort(self, waves, end_ns):
        cohorts = self.cohorts
        if not cohorts or cohorts[-1][1] < end_ns:
            cohorts.append([waves, end_ns])          # the usual case: a head's waves end in dispatch order
            return
        i = bisect.bisect_left(cohorts, end_ns, key=_END)
        if i < len(cohorts) and cohorts[i][1] == end_ns:
            cohorts[i][0] += waves
        else:
            cohorts.insert(i, [waves, end_ns])


class DeviceClock:
    """One device's wave slots and the lanes of its queues with work, accounted up to `last_ns`."""

    def __init__(self, gpu_id, capacity, saves_waves):
        self.gpu_id = gpu_id
        self.capacity = capacity        # wave slots (timing.max_waves)
        self.saves_waves = saves_waves  # CWSR enabled: a stop or an HWS stall saves waves instead of draining
        self.free = capacity
        self.lanes = {}                 # id(q) -> Lane, in the order the queues got work
        self.last_ns = 0                # events are accounted up to here
        self.stalled_until_ns = 0       # an HWS remap holds the device until then
        self.turn = 0                   # where the round-robin remainder starts
        self.epoch = 0                  # bumped whenever a projection of completions changes

    def copy(self):
        twin = DeviceClock(self.gpu_id, self.capacity, self.saves_waves)
        twin.free, twin.last_ns, twin.stalled_until_ns, twin.turn = (
            self.free, self.last_ns, self.stalled_until_ns, self.turn)
        twin.lanes = {key: lane.copy() for key, lane in self.lanes.items()}
        return twin

    # --- the plan changes (at the clock's last_ns) ------------------------------------------------
    def add_lane(self, q, proc, runnable):
        lane = self.lanes[id(q)] = Lane(q, proc, runnable)
        self.load_head(lane)
        return lane

    def load_head(self, lane):
        """The kernel after the `retired` ones becomes the lane's head (AQL order)."""
        kernels = lane.q.kernels
        lane.has_head = lane.retired < len(kernels)
        if not lane.has_head:
            return
        work_us, waves = kernels[lane.retired]
        modelled = min(waves, self.capacity * max(1, int(work_us // MIN_WAVE_US)))
        rounds = -(-modelled // self.capacity)
        lane.wave_ns = max(1, round(work_us * 1e3 / rounds))
        lane.undispatched = modelled

    def stop(self, lane, now_ns):
        """The lane's queue stopped running at `now_ns`. With CWSR its waves are saved, keeping the
        time they had left (during an HWS stall, from the stall's end: they were frozen); without
        CWSR they drain (stay on their slots until they retire)."""
        lane.runnable = False
        if not self.saves_waves or not lane.cohorts:
            return
        frozen_from = max(now_ns, self.stalled_until_ns)
        lane.saved.extend([waves, end_ns - frozen_from] for waves, end_ns in lane.cohorts)
        lane.saved_waves += lane.resident
        self.free += lane.resident
        lane.cohorts, lane.resident = [], 0

    def drop(self, lane):
        """A destroyed queue: its waves leave their slots at once."""
        self.free += lane.resident
        del self.lanes[id(lane.q)]

    def stall(self, now_ns, seconds):
        """An HWS unmap+map from now (or from the end of one still under way: the DQM lock
        serialises them): nothing dispatches meanwhile and, with CWSR, every resident wave of the
        device is saved and restored, so its end moves by the stall's length."""
        length_ns = int(seconds * 1e9)
        if self.saves_waves:
            for lane in self.lanes.values():
                for cohort in lane.cohorts:
                    cohort[1] += length_ns
        self.stalled_until_ns = max(self.stalled_until_ns, now_ns) + length_ns

    # --- events -------------------------------------------------------------------------------------
    def next_event_ns(self):
        """The next moment something happens: waves retire (on the tick at or after the first end),
        or an HWS stall ends (dispatch resumes)."""
        ends = [_on_tick(lane.cohorts[0][1]) for lane in self.lanes.values() if lane.cohorts]
        if self.stalled_until_ns > self.last_ns:
            ends.append(self.stalled_until_ns)
        return min(ends) if ends else None

    def advance(self, until_ns):
        """Play the events up to `until_ns`."""
        while True:
            at_ns = self.next_event_ns()
            if at_ns is None or at_ns > until_ns:
                break
            self.play(at_ns)
        self.last_ns = max(self.last_ns, until_ns)

    def play(self, at_ns):
        """The event at `at_ns`: waves retire, freed slots are dispatched."""
        self.last_ns = at_ns
        self.retire(at_ns)
        self.dispatch(at_ns)

    def first_done(self, targets, max_events=math.inf):
        """Play events (on a copy: this moves the clock) until one of `targets` [(lane, kernels it
        must retire)] has: (that moment, True). (the last event's moment, False) after `max_events`
        events with none done; None if none ever will under this plan."""
        if any(lane.retired >= count for lane, count in targets):
            return self.last_ns, True
        played = 0
        while played < max_events:
            if all(not lane.runnable and not lane.cohorts for lane, _count in targets):
                return None                   # stopped and nothing left on slots: no progress
            at_ns = self.next_event_ns()
            if at_ns is None:
                return None
            self.play(at_ns)
            played += 1
            if any(lane.retired >= count for lane, count in targets):
                return at_ns, True
        return self.last_ns, False

    def retire(self, at_ns):
        """Waves whose end has come leave their slots; a head whose last wave left completes and
        the next kernel of its queue becomes the head."""
        for lane in self.lanes.values():
            cohorts = lane.cohorts
            if not cohorts or cohorts[0][1] > at_ns:
                continue
            ended = bisect.bisect_right(cohorts, at_ns, key=_END)
            freed = sum(waves for waves, _end in cohorts[:ended])
            del cohorts[:ended]
            self.free += freed
            lane.resident -= freed
            if not cohorts and not lane.undispatched and not lane.saved_waves:
                lane.retired_ns.append(at_ns)
                self.load_head(lane)

    def dispatch(self, at_ns):
        """Free slots go to the heads that want them. True if any wave was dispatched."""
        if at_ns < self.stalled_until_ns or not self.free:
            return False
        wanting = [lane for lane in self.lanes.values() if lane.wants]
        if not wanting:
            return False
        grants = share_round_robin(self.free, [lane.wants for lane in wanting], self.turn)
        self.turn += 1
        for lane, n in zip(wanting, grants):
            if n:
                lane.start_waves(n, at_ns)
                self.free -= n
        return True

    def head_remaining_us(self, lane, now_ns):
        """How long the lane's head kernel still needs with the device to itself: its waves in
        flight or saved, then its rounds not yet dispatched."""
        if not lane.has_head:
            return 0.0
        frozen_from = max(now_ns, self.stalled_until_ns) if self.saves_waves else now_ns
        in_flight = [end - frozen_from for _waves, end in lane.cohorts] + [left for _waves, left in lane.saved]
        rounds_left = -(-lane.undispatched // self.capacity)
        return (max(in_flight, default=0) + rounds_left * lane.wave_ns) / 1e3


def _on_tick(ns):
    """The first moment of the event tick at or after `ns`."""
    return -(-ns // EVENT_TICK_NS) * EVENT_TICK_NS


def share_round_robin(free, wants, turn):
    """Split `free` slots among heads wanting `wants`, as dealing one wave at a time round-robin
    would: equal shares, no head more than it wants, the remainder one each from index `turn`."""
    grants = [0] * len(wants)
    open_ = [i for i, want in enumerate(wants) if want]
    while free and open_:
        each = free // len(open_)
        if not each:
            start = turn % len(open_)
            for i in (open_[start:] + open_[:start])[:free]:
                grants[i] += 1
            break
        for i in open_:
            take = min(each, wants[i] - grants[i])
            grants[i] += take
            free -= take
        open_ = [i for i in open_ if grants[i] < wants[i]]
    return grants


class Execution:
    def __init__(self, kfd):
        self.kfd = kfd
        self.clocks = {gpu: DeviceClock(gpu, max_waves(dev.node), dev.cwsr_enabled)
                       for gpu, dev in kfd.devices.items()}
        self.wakes = {}                 # gpu_id -> (epoch, waits, moment): the device's last wake_ns
        self.played_ns = 0              # the furthest any device was played to (the model does not go back)

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
            checked.append((float(work_us), waves))
        clock = self.clocks[q.gpu_id]
        self.catch_up(q.gpu_id, now_ns)
        room = q.ring_size // AQL_PACKET_BYTES - len(q.kernels)
        if len(checked) > room:
            raise ValueError(f"queue {q.qid}'s ring holds {q.ring_size // AQL_PACKET_BYTES} packets and "
                             f"{len(q.kernels)} are outstanding: no room for {len(checked)} more")
        q.kernels.extend(checked)
        q.dispatched += len(checked)
        clock.epoch += 1                  # a projection made before must see the new packets
        if id(q) in clock.lanes:
            # behind a head still running: nothing runs differently now (its packet processor
            # reaches these when the head completes), so no re-plan of every device
            return q.dispatched
        clock.add_lane(q, proc, q.is_active)
        self.replan(now_ns)
        return q.dispatched

    def completed(self, q, now_ns):
        """`q`'s completed count, caught up to now."""
        if q.gpu_id in self.clocks:
            self.catch_up(q.gpu_id, now_ns)
        return q.completed

    def head_remaining_us(self, q, now_ns):
        """How long `q`'s head kernel still needs with its device to itself (0 when idle)."""
        clock = self.clocks.get(q.gpu_id)
        lane = clock.lanes.get(id(q)) if clock is not None else None
        if lane is None:
            return 0.0
        self.catch_up(q.gpu_id, now_ns)
        return clock.head_remaining_us(lane, now_ns)

    def stall(self, gpu_id, seconds, now_ns):
        """An HWS unmap+map of the device for `seconds` (TimingModel.settle)."""
        clock = self.clocks[gpu_id]
        self.catch_up(gpu_id, now_ns)
        clock.stall(now_ns, seconds)
        clock.epoch += 1

    def catch_up(self, gpu_id, now_ns):
        """Play the device's events up to `now_ns` under its plan and record them in its queues."""
        clock = self.clocks[gpu_id]
        self._advance(clock, now_ns)
        for lane in list(clock.lanes.values()):
            self._record(clock, lane, now_ns)

    def _advance(self, clock, now_ns):
        clock.advance(now_ns)
        self.played_ns = max(self.played_ns, clock.last_ns)

    def replan(self, now_ns):
        """After anything that may have changed which queues run (every request the server
        handles): catch each device up under its previous plan, drop the work of queues that are
        gone, stop or restart the lanes whose queue stopped or became active, and hand out the
        slots that this frees."""
        for gpu_id, clock in self.clocks.items():
            if not clock.lanes and clock.stalled_until_ns <= clock.last_ns:
                continue
            self._advance(clock, now_ns)
            changed = False
            for lane in list(clock.lanes.values()):
                if not _exists(lane.q, lane.proc):
                    clock.drop(lane)
                    lane.q.kernels.clear()        # a destroyed queue's packets never run
                    lane.q.resident_waves = 0
                    changed = True
                    continue
                active = lane.q.is_active
                if active != lane.runnable:
                    if active:
                        lane.runnable = True
                    else:
                        clock.stop(lane, now_ns)
                    changed = True
            if clock.dispatch(now_ns) or changed:
                clock.epoch += 1
            for lane in list(clock.lanes.values()):
                self._record(clock, lane, now_ns)

    def _record(self, clock, lane, now_ns):
        """Write a lane's progress into its queue: completed kernels leave the ring, resident_waves
        is what is on slots now; an idle queue leaves the device's lanes."""
        q = lane.q
        if lane.retired_ns:
            for _ in lane.retired_ns:
                q.kernels.popleft()
            q.completed += len(lane.retired_ns)
            q.completion_ns.extend(lane.retired_ns)
            lane.retired_ns = []
        if q.resident_waves != lane.resident:
            q.sync_progress(now_ns)
            q.resident_waves = lane.resident
            q.sync_progress(now_ns)
        if not lane.has_head:
            del clock.lanes[id(q)]

    def projected_done_ns(self, q, count):
        """When `q` will have completed `count` kernels if nothing changes meanwhile (the events
        of the device's plan replayed on a copy, however many); None if it will not (the queue
        does not run)."""
        if q.completed >= count:
            return 0
        clock = self.clocks[q.gpu_id]
        if id(q) not in clock.lanes:
            return None
        twin = clock.copy()
        done = twin.first_done([(twin.lanes[id(q)], count - q.completed)])
        return None if done is None else done[0]

    def wake_ns(self, waits, now_ns):
        """When to look again for `waits` [(q, count)]: the earliest moment one of them may have
        completed `count` kernels, if no plan changes meanwhile, or None (none will). Per device
        one replay of at most PROJECTION_EVENTS events from now, on a copy, for all its waits; a
        wait beyond them gets the last event replayed (look again there). Kept until the device's
        plan or waits change, or the moment passes."""
        soonest = None
        by_gpu = {}
        for q, count in waits:
            if q.gpu_id in self.clocks:
                by_gpu.setdefault(q.gpu_id, []).append((q, count))
        for gpu_id, device_waits in by_gpu.items():
            at_ns = self._device_wake_ns(gpu_id, device_waits, now_ns)
            if at_ns is not None and (soonest is None or at_ns < soonest):
                soonest = at_ns
        return soonest

    def _device_wake_ns(self, gpu_id, waits, now_ns):
        clock = self.clocks[gpu_id]
        key = tuple(sorted((id(q), count) for q, count in waits))
        kept = self.wakes.get(gpu_id)
        if kept is not None and kept[:2] == (clock.epoch, key) and (kept[2] is None or kept[2] > now_ns):
            return kept[2]
        self.catch_up(gpu_id, now_ns)            # replay from now: what is past is past
        if any(q.completed >= count for q, count in waits):
            at_ns = now_ns                       # answerable now
        else:
            twin = clock.copy()
            targets = [(twin.lanes[id(q)], count - q.completed) for q, count in waits if id(q) in twin.lanes]
            done = twin.first_done(targets, PROJECTION_EVENTS) if targets else None
            at_ns = None if done is None else done[0]
        self.wakes[gpu_id] = (clock.epoch, key, at_ns)
        return at_ns


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
