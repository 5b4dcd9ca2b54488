"""The wave-slot model of the simulated GPU (kfdtool/sim/execution.py), on simulated time.

No server and no wall clock: a device of 800 wave slots (20 CUs x 40), queues from the simulator's
own state, and the moments at which the model says kernels complete. A running wave keeps its
slot until it retires; CWSR saves a stopped queue's waves and frees their slots; without CWSR
they drain. The end-to-end behaviour through the server is in test_sim_execution.py."""
import time
from types import SimpleNamespace

import pytest

from kfdtool.sim.execution import EVENT_TICK_US, MIN_WAVE_US, Execution, share_round_robin
from kfdtool.sim.state import SimQueue

GPU = 1
SLOTS = 800                    # 20 CUs x 40 wave slots
T0 = 5_000_000_000_000         # ~1.4 h of CLOCK_MONOTONIC, in ns
MS = 1_000_000


def at(ms):
    return T0 + round(ms * MS)


class Gpu:
    """One simulated device and the queues of one process on it."""

    def __init__(self, cwsr=True):
        node = SimpleNamespace(cu_count=SLOTS // 40)
        self.execution = Execution(SimpleNamespace(devices={GPU: SimpleNamespace(node=node, cwsr_enabled=cwsr)}))
        self.proc = SimpleNamespace(alive=True, queues={})

    def queue(self):
        qid = len(self.proc.queues)
        q = SimQueue(qid, GPU, 2, 0x7F00_0000_0000 + qid * 0x10_0000, 1 << 20, 0, 0, 0, 0, 0, 100, 7)
        self.proc.queues[qid] = q
        return q

    def launch(self, q, ms, kernels):
        """Ring `q`'s doorbell at `ms` for kernels [(work_us, waves)]."""
        self.execution.dispatch(self.proc, q, [list(k) for k in kernels], at(ms))

    def replan(self, ms):
        """After a request that may have changed which queues run (the server calls it after each)."""
        self.execution.replan(at(ms))

    def done_ms(self, q, count=1):
        """When the model projects `q`'s `count`-th completion, in ms after T0 (None: never)."""
        ns = self.execution.projected_done_ns(q, count)
        return None if ns is None else (ns - T0) / MS

    def completed(self, q, ms):
        return self.execution.completed(q, at(ms))


@pytest.mark.parametrize("waves", [8, SLOTS, 3 * SLOTS + 1, 1 << 24])
def test_alone_a_kernel_takes_its_work_time_whatever_its_waves(waves):
    gpu = Gpu()
    q = gpu.queue()
    gpu.launch(q, 0, [(8000, waves)])
    assert gpu.done_ms(q) == pytest.approx(8.0, abs=1e-4)
    assert gpu.completed(q, 7.99) == 0
    assert gpu.completed(q, 8.0) == 1
    assert q.resident_waves == 0 and not q.kernels


def test_a_queue_runs_its_kernels_in_order_one_after_another():
    gpu = Gpu()
    q = gpu.queue()
    gpu.launch(q, 0, [(1000, 8), (2000, SLOTS), (500, 3)])
    assert [gpu.done_ms(q, n) for n in (1, 2, 3)] == pytest.approx([1.0, 3.0, 3.5])
    assert gpu.completed(q, 1.5) == 1 and q.resident_waves == SLOTS      # the second kernel fills the device


def test_kernels_that_fit_the_slots_together_both_run_at_full_speed():
    gpu = Gpu()
    a, b = gpu.queue(), gpu.queue()
    gpu.launch(a, 0, [(8000, SLOTS // 2)])
    gpu.launch(b, 0, [(8000, SLOTS // 2)])
    assert gpu.done_ms(a) == pytest.approx(8.0) and gpu.done_ms(b) == pytest.approx(8.0)


def test_a_kernel_arriving_on_a_full_device_waits_for_the_running_waves_to_retire():
    """Head-of-line blocking: one round of 8 ms waves fills the device; a 1 ms kernel that arrives
    0.1 ms later gets slots only when those waves retire (at 8 ms), not a share of the device at once.
    Then the freed slots are shared: it takes its 200, the batch queue's next kernel the other 600
    at once and its last 200 when the short kernel's waves retire."""
    gpu = Gpu()
    batch, service = gpu.queue(), gpu.queue()
    gpu.launch(batch, 0, [(8000, SLOTS)] * 2)
    gpu.launch(service, 0.1, [(1000, SLOTS // 4)])
    assert service.resident_waves == 0                           # no slot free: it waits
    assert gpu.done_ms(service) == pytest.approx(9.0)            # waited ~7.9 ms for the batch's waves
    assert gpu.done_ms(batch, 2) == pytest.approx(17.0)
    gpu.completed(service, 8.5)
    assert (service.resident_waves, batch.resident_waves) == (SLOTS // 4, SLOTS * 3 // 4)


def test_free_slots_are_dealt_round_robin_among_the_heads_that_want_them():
    assert share_round_robin(10, [3, 100, 100], turn=0) == [3, 4, 3]
    assert share_round_robin(10, [3, 100, 100], turn=1) == [3, 3, 4]
    assert share_round_robin(800, [1 << 20, 5], turn=0) == [795, 5]
    assert share_round_robin(4, [0, 9, 0], turn=7) == [0, 4, 0]
    assert share_round_robin(0, [9, 9], turn=0) == [0, 0]


def test_a_suspend_with_cwsr_frees_the_slots_at_once_and_resume_restores_the_waves():
    gpu = Gpu(cwsr=True)
    batch, service = gpu.queue(), gpu.queue()
    gpu.launch(batch, 0, [(8000, SLOTS)])
    gpu.launch(service, 1, [(1000, SLOTS // 4)])
    gpu.replan(2)                                                # nothing changed: nothing moves
    assert gpu.done_ms(service) == pytest.approx(9.0)
    batch.is_suspended = True
    gpu.replan(2)
    assert batch.resident_waves == 0 and service.resident_waves == SLOTS // 4    # saved; the service starts
    assert gpu.done_ms(service) == pytest.approx(3.0)
    assert gpu.done_ms(batch) is None                            # suspended: no projection
    assert gpu.execution.head_remaining_us(batch, at(3.5)) == pytest.approx(6000)   # 6 ms left, frozen
    batch.is_suspended = False
    gpu.replan(4)
    assert batch.resident_waves == SLOTS
    assert gpu.done_ms(batch) == pytest.approx(10.0)             # restored with the 6 ms its waves had left


def test_restored_waves_go_before_new_waves_of_the_same_queue():
    """A two-round kernel suspended in its first round: on resume its saved waves come back first
    (with their 2 ms left), the second round after them."""
    gpu = Gpu(cwsr=True)
    batch = gpu.queue()
    gpu.launch(batch, 0, [(8000, 2 * SLOTS)])                    # two rounds of 4 ms waves
    batch.is_suspended = True
    gpu.replan(2)
    batch.is_suspended = False
    gpu.replan(5)
    assert gpu.completed(batch, 6.9) == 0 and batch.resident_waves == SLOTS
    assert gpu.done_ms(batch) == pytest.approx(11.0)             # 2 ms restored, then the 4 ms round


def test_without_cwsr_a_stopped_queue_drains_its_running_waves():
    gpu = Gpu(cwsr=False)
    batch, service = gpu.queue(), gpu.queue()
    gpu.launch(batch, 0, [(8000, 2 * SLOTS)])                    # two rounds of 4 ms waves
    gpu.launch(service, 1, [(1000, SLOTS // 4)])
    batch.is_suspended = True
    gpu.replan(2)
    assert batch.resident_waves == SLOTS                          # still on their slots
    assert gpu.done_ms(service) == pytest.approx(5.0)             # slots free when the first round retires
    assert gpu.completed(batch, 4.5) == 0 and batch.resident_waves == 0
    batch.is_suspended = False
    gpu.replan(6)
    assert gpu.done_ms(batch) == pytest.approx(10.0)              # the second round, dispatched on resume


def test_without_cwsr_a_kernel_whose_waves_all_run_completes_while_its_queue_is_stopped():
    gpu = Gpu(cwsr=False)
    batch = gpu.queue()
    gpu.launch(batch, 0, [(8000, SLOTS), (1000, 8)])
    batch.is_evicted = True
    gpu.replan(1)
    assert gpu.completed(batch, 8.0) == 1                         # drained; the next kernel waits
    assert gpu.completed(batch, 20) == 1 and batch.resident_waves == 0


def test_a_destroyed_queue_frees_its_slots_at_once():
    gpu = Gpu()
    batch, service = gpu.queue(), gpu.queue()
    gpu.launch(batch, 0, [(8000, SLOTS)] * 3)
    gpu.launch(service, 1, [(1000, SLOTS // 4)])
    del gpu.proc.queues[batch.qid]
    gpu.replan(2)
    assert not batch.kernels and batch.resident_waves == 0
    assert gpu.done_ms(service) == pytest.approx(3.0)


def test_an_exited_process_drops_its_work():
    gpu = Gpu()
    q = gpu.queue()
    gpu.launch(q, 0, [(8000, SLOTS)])
    gpu.proc.alive = False
    gpu.replan(1)
    assert not q.kernels and gpu.execution.clocks[GPU].free == SLOTS


def test_an_hws_stall_with_cwsr_freezes_every_wave_of_the_device_and_holds_dispatch():
    gpu = Gpu(cwsr=True)
    batch, service = gpu.queue(), gpu.queue()
    gpu.launch(batch, 0, [(8000, SLOTS // 2)])
    gpu.execution.stall(GPU, 0.003, at(2))                        # 3 ms unmap+map from 2 ms
    gpu.launch(service, 3, [(1000, SLOTS // 4)])                   # rung during the stall
    assert service.resident_waves == 0
    assert gpu.done_ms(batch) == pytest.approx(11.0)               # 8 ms of work + the 3 ms stall
    assert gpu.done_ms(service) == pytest.approx(6.0)              # dispatched when the stall ends
    gpu.execution.stall(GPU, 0.001, at(4))                         # a second remap queues behind it
    assert gpu.done_ms(batch) == pytest.approx(12.0)


def test_a_queue_suspended_during_a_stall_keeps_the_time_its_waves_had_left():
    gpu = Gpu(cwsr=True)
    batch = gpu.queue()
    gpu.launch(batch, 0, [(8000, SLOTS)])
    gpu.execution.stall(GPU, 0.002, at(3))                         # frozen from 3 ms to 5 ms
    batch.is_suspended = True
    gpu.replan(4)
    assert gpu.execution.head_remaining_us(batch, at(4)) == pytest.approx(5000)
    batch.is_suspended = False
    gpu.replan(10)
    assert gpu.done_ms(batch) == pytest.approx(15.0)


def test_without_cwsr_an_hws_stall_holds_dispatch_while_running_waves_go_on():
    gpu = Gpu(cwsr=False)
    batch, service = gpu.queue(), gpu.queue()
    gpu.launch(batch, 0, [(8000, SLOTS // 2)])
    gpu.execution.stall(GPU, 0.003, at(2))
    gpu.launch(service, 3, [(1000, SLOTS // 4)])
    assert gpu.done_ms(batch) == pytest.approx(8.0)
    assert gpu.done_ms(service) == pytest.approx(6.0)


def test_a_kernel_shorter_than_its_own_rounds_is_modelled_with_waves_of_at_least_min_wave_us():
    gpu = Gpu()
    batch, service = gpu.queue(), gpu.queue()
    gpu.launch(batch, 0, [(1000, 1 << 24)])                         # on hardware ~21 000 rounds
    gpu.launch(service, 0.01, [(100, 8)])
    assert gpu.done_ms(service) == pytest.approx(MIN_WAVE_US / 1e3 + 0.1)   # waits one modelled wave
    assert gpu.done_ms(batch) == pytest.approx(1.1, abs=1e-3)


def test_catching_up_at_hours_of_boot_time_retires_even_the_tiniest_kernel():
    """A kernel of 1e-6 µs rounds to a 1 ns wave: it retires, on the first event tick (the float
    model once spun forever on a head whose end rounded to its start)."""
    gpu = Gpu()
    q = gpu.queue()
    gpu.launch(q, 0, [(1e-6, 8), (10.0, 8)])
    tick_ms = EVENT_TICK_US / 1e3
    assert gpu.completed(q, tick_ms) == 1
    assert gpu.execution.head_remaining_us(q, at(tick_ms + 0.005)) == pytest.approx(5.0, abs=2e-3)


def test_many_waves_and_many_queues_stay_cheap():
    """16 queues of four 10 ms kernels of 2^24 waves each share the device: about 6 400 device
    rounds to replay, whatever the wave count. Projections and catch-up stay well under a second."""
    gpu = Gpu()
    queues = [gpu.queue() for _ in range(16)]
    for q in queues:
        gpu.launch(q, 0, [(10_000, 1 << 24)] * 4)
    started = time.process_time()
    last = gpu.done_ms(queues[-1], 4)
    for ms in range(0, 700, 7):
        gpu.completed(queues[0], ms)
    elapsed = time.process_time() - started
    assert last == pytest.approx(16 * 4 * 10, rel=1e-3)                # the device is never idle
    assert [q.completed for q in queues] == [4] * 16
    assert elapsed < 3.0, f"{elapsed:.2f} s of CPU"


def service_beside_three_suspended_batch_jobs(gpu, requests):
    """What the simulated end-to-end benchmark does at Lv3 (scripts/bench_sim_e2e.py): three batch
    jobs of full-device 8 ms kernels, and a service request of 20 kernels of 100 µs every ~50 ms
    during which the daemon suspends the batch jobs one by one and resumes them (each an HWS stall
    of the device, at its own moment). Returns the batch queues and the service's."""
    batch = [gpu.queue() for _ in range(3)]
    service = gpu.queue()
    for q in batch:
        gpu.launch(q, 0, [(8000, SLOTS)] * 200)
    for k in range(requests):
        t0 = 50.37 * k
        gpu.launch(service, t0, [(100, SLOTS // 4)] * 20)
        for i, q in enumerate(batch):
            q.is_suspended = True
            gpu.execution.stall(GPU, 47e-6 + 13e-6 * i, at(t0 + 0.3 + 0.41 * i))
            gpu.replan(t0 + 0.3 + 0.41 * i)
        for i, q in enumerate(batch):
            q.is_suspended = False
            gpu.execution.stall(GPU, 47e-6 + 7e-6 * i, at(t0 + 4.1 + 0.53 * i))
            gpu.replan(t0 + 4.1 + 0.53 * i)
        ms = t0 + 6
        while ms < t0 + 50:                     # the processes' doorbells look about every ms
            gpu.completed(service, ms)
            ms += 0.97
    return batch, service


def test_a_service_beside_three_suspended_batch_jobs_is_simulated_faster_than_real_time():
    """The server plays the device's events in its one thread: if a simulated second costs about a
    second of CPU, every reply waits. Waves dispatched in pieces, CWSR restores and HWS stalls give
    the waves' ends ever more distinct moments; before waves retired on the event tick, one
    simulated second of this took ~0.9 s of CPU (~260 cohorts, ~120k events per second)."""
    gpu = Gpu()
    started = time.process_time()
    batch, service = service_beside_three_suspended_batch_jobs(gpu, requests=20)
    elapsed = time.process_time() - started
    assert service.completed == 20 * 20
    assert sum(q.completed for q in batch) >= 100          # ~1 s of three batch jobs sharing the device
    assert elapsed < 0.25, f"{elapsed:.2f} s of CPU for one simulated second"


def test_a_wake_far_ahead_is_a_bounded_replay_that_still_lands_on_the_completion():
    """The server arms its wake timer from `wake_ns`, in its one thread, after every change of
    plan: a batch job's call of 20 kernels ~0.5 s ahead is not replayed in one go (that took up to
    48 ms, during which nobody got a reply). Looking again at each moment it returns ends exactly
    at the moment the full replay projects."""
    gpu = Gpu()
    batch, _service = service_beside_three_suspended_batch_jobs(gpu, requests=4)
    q = batch[0]
    count = q.completed + 20
    now = at(201.5)
    gpu.execution.completed(q, now)
    exact = gpu.execution.projected_done_ns(q, count)
    looks = 0
    while True:
        started = time.process_time()
        wake = gpu.execution.wake_ns([(q, count)], now)
        assert time.process_time() - started < 0.02
        looks += 1
        assert now <= wake <= exact
        if gpu.execution.completed(q, wake) >= count:
            break
        now = wake
    assert wake == exact
    assert looks > 1                                       # it was further than one replay
