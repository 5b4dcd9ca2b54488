"""The simulated GPU executes work in time (kfdtool/sim/execution.py) and SimHip drives it.

Kernels take their work time, hold wave slots until their waves retire (a kernel arriving on a
full device waits for them), stop while their queue is suspended, evicted or its device stalled by
an HWS remap, and go on after. The slot rules themselves, on simulated time, are in
test_sim_execution_slots.py; here they are seen through the server. Rules about processes are tried
with separate OS processes. Timing tolerances are loose: CI has 2 vCPUs and the server is Python."""
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest

from kfdtool.cwsr.debugtrap import DebugTrapSuspend
from kfdtool.device import KfdDevice
from kfdtool.errors import SimulatorError
from kfdtool.sim.hip import SimEvent, SimHip, SimModel
from kfdtool.sim.protocol import frame
from simhelpers import Client, in_child, start

MACHINE = "mi308x"
WIDE = 1 << 20          # more waves than any device has: the kernel saturates its device

# A GPU process of its own: one stream on `device`, one kernel, then it reports when it is done
# and stays a KFD process until its stdin closes.
WORKER = r"""
import json, sys, time
from kfdtool.sim.hip import SimHip
machine, device, work_us, waves = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
hip = SimHip(machine)
s = hip.stream(device=device)
t0 = time.monotonic()
hip.launch(s, work_us=work_us, waves=waves)
print(json.dumps({"qid": s.queue_id, "gpu_id": s.gpu_id}), flush=True)
try:
    hip.stream_synchronize(s)
    print(json.dumps({"done_s": time.monotonic() - t0}), flush=True)
except Exception as e:
    print(json.dumps({"error": str(e)}), flush=True)
sys.stdin.read()
"""


@pytest.fixture(scope="module")
def sim(sim_dir):
    return start(MACHINE)


@pytest.fixture
def hip(sim):
    h = SimHip(MACHINE)
    yield h
    h.close()


class Worker:
    def __init__(self, device, work_us, waves=8):
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, MACHINE, str(device), str(work_us), str(waves)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.pid = self.proc.pid
        self.qid = self.line()["qid"]

    def line(self, timeout=10):
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, "the worker said nothing"
        return json.loads(self.proc.stdout.readline())

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def workers():
    started = []

    def spawn(*args, **kwargs):
        started.append(Worker(*args, **kwargs))
        return started[-1]
    yield spawn
    for w in started:
        w.close()


def queue_state(sim, pid, qid):
    with sim.control() as ctl:
        return next(q for q in ctl("queues", pid=pid)["queues"] if q["qid"] == qid)


def timed_sync(hip, stream):
    t0 = time.monotonic()
    hip.stream_synchronize(stream)
    return time.monotonic() - t0


def test_a_kernel_takes_its_work_time_and_a_stream_runs_in_order(hip):
    s = hip.stream(device=8)
    t0 = time.monotonic()
    hip.launch(s, work_us=20_000, waves=64)
    event = hip.record(s)
    assert not hip.query(event)                       # launch returned before the work was done
    hip.synchronize(event)
    assert 0.019 <= time.monotonic() - t0 < 0.06
    assert hip.query(event)
    t0 = time.monotonic()
    SimModel(hip, [(10_000, 8)] * 3, name="three")(s)     # one queue: one kernel after another
    hip.stream_synchronize(s)
    assert 0.029 <= time.monotonic() - t0 < 0.08


def slots(hip, device):
    """The device's wave slots: CUs x 40 (timing.max_waves)."""
    return hip.rt.topology.find_gpu(hip.gpus[device]).cu_count * 40


def warm_stream(hip, device):
    """A stream whose queue exists: its first launch creates the queue (CREATE_QUEUE and its
    buffers, several ms through the Python server on a loaded 2-vCPU host), which an upper
    bound on a kernel's time must not count."""
    s = hip.stream(device=device)
    hip.launch(s, work_us=1, waves=1)
    hip.stream_synchronize(s)
    return s


def test_saturating_kernels_share_the_device_small_ones_run_side_by_side(hip):
    a, b = hip.stream(device=9), hip.stream(device=9)
    t0 = time.monotonic()
    hip.launch(a, work_us=20_000, waves=WIDE)
    hip.launch(b, work_us=20_000, waves=WIDE)
    hip.stream_synchronize(a)
    hip.stream_synchronize(b)
    assert time.monotonic() - t0 >= 0.038             # their waves took turns on the slots: ~40 ms for both
    c, d = warm_stream(hip, device=10), warm_stream(hip, device=10)
    t0 = time.monotonic()
    hip.launch(c, work_us=20_000, waves=8)
    hip.launch(d, work_us=20_000, waves=8)
    hip.stream_synchronize(c)
    hip.stream_synchronize(d)
    assert time.monotonic() - t0 < 0.032              # both at full speed: ~20 ms
    e = warm_stream(hip, device=11)                    # a saturating kernel alone: full speed
    t0 = time.monotonic()
    hip.launch(e, work_us=20_000, waves=WIDE)
    hip.stream_synchronize(e)
    assert time.monotonic() - t0 < 0.032


def test_a_wait_names_when_its_work_completed_on_the_device_not_when_it_was_answered(hip):
    """SimHip.synchronize returns the moment the event's last kernel completed on the model's clock
    (what the device's completion signal would say), however much later the wait was made or
    answered; an event that covers nothing names none."""
    s = warm_stream(hip, 7)
    launched = time.monotonic_ns()
    hip.launch(s, work_us=20_000, waves=1)
    event = hip.record(s)
    time.sleep(0.08)                                  # done 60 ms before we wait
    completed = hip.synchronize(event)
    assert launched + 19_000_000 <= completed <= launched + 35_000_000, (completed - launched) / 1e6
    assert time.monotonic_ns() - completed > 50_000_000
    assert hip.synchronize(SimEvent(None, 0)) is None


def test_a_kernel_arriving_on_a_full_device_waits_for_the_running_waves(hip):
    """Head-of-line blocking through the server: one round of 60 ms waves fills device 23; a 1 ms
    kernel rung just after gets no slot until they retire."""
    batch, service = hip.stream(device=23), hip.stream(device=23)
    hip.launch(batch, work_us=60_000, waves=slots(hip, 23))
    t0 = time.monotonic()
    hip.launch(service, work_us=1_000, waves=8)
    hip.stream_synchronize(service)
    assert 0.055 <= time.monotonic() - t0 < 0.2
    hip.stream_synchronize(batch)


def test_a_queue_suspended_by_another_process_keeps_its_work_and_finishes_after_resume(sim, workers):
    worker = workers(device=12, work_us=80_000)
    kfd = KfdDevice(sim.open_kfd())
    try:
        with DebugTrapSuspend(kfd, worker.pid) as mech:
            assert [o.outcome for o in mech.suspend([worker.qid]).outcomes] == ["suspended"]
            held = queue_state(sim, worker.pid, worker.qid)
            # CWSR saved the kernel's 8 waves: they left their slots
            assert held["resident_waves"] == 0 and held["saved_wave_bytes"] > 0
            time.sleep(0.15)
            later = queue_state(sim, worker.pid, worker.qid)
            assert later["head_remaining_us"] == held["head_remaining_us"] > 0     # no progress
            assert later["completed"] == 0
            mech.resume([worker.qid])
            time.sleep(0.01)                            # the remap's stall ends: the waves are restored
            assert queue_state(sim, worker.pid, worker.qid)["resident_waves"] == 8
        done = worker.line()
        assert 0.22 <= done["done_s"] < 0.6           # 80 ms of work + the ~150 ms it was held
        assert queue_state(sim, worker.pid, worker.qid)["completed"] == 1
    finally:
        kfd.close()


def test_suspending_the_queue_that_fills_the_device_lets_a_waiting_kernel_run(sim, hip, workers):
    """Lv3's premise: a kernel waiting behind another process's waves runs as soon as that queue is
    suspended (CWSR saves its waves and frees their slots), not when they would have retired."""
    worker = workers(device=24, work_us=300_000, waves=slots(hip, 24))     # one round of 300 ms waves
    s = hip.stream(device=24)
    kfd = KfdDevice(sim.open_kfd())
    try:
        with DebugTrapSuspend(kfd, worker.pid) as mech:
            hip.launch(s, work_us=1_000, waves=8)
            event = hip.record(s)
            time.sleep(0.02)
            assert not hip.query(event)                 # no free slot: it waits
            t0 = time.monotonic()
            assert [o.outcome for o in mech.suspend([worker.qid]).outcomes] == ["suspended"]
            hip.synchronize(event)
            assert time.monotonic() - t0 < 0.1          # ~1 ms of work once the slots were free
            mech.resume([worker.qid])
        assert 0.3 <= worker.line()["done_s"] < 1.5      # the batch kernel lost no work
    finally:
        kfd.close()


def test_an_evicted_process_makes_no_progress_and_finishes_after_restore(sim, workers):
    worker = workers(device=13, work_us=60_000)
    with sim.control() as ctl:
        ctl("evict", pid=worker.pid)
        before = queue_state(sim, worker.pid, worker.qid)["head_remaining_us"]
        time.sleep(0.15)
        assert queue_state(sim, worker.pid, worker.qid)["head_remaining_us"] == before > 0
        ctl("restore", pid=worker.pid)
    assert 0.2 <= worker.line()["done_s"] < 0.6


def test_a_debugger_killed_while_holding_the_queue_leaves_the_work_to_complete(sim, workers):
    worker = workers(device=14, work_us=50_000)
    tool = subprocess.Popen([sys.executable, "-m", "kfdtool", "--sim", MACHINE, "preempt", "--pid", str(worker.pid)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while queue_state(sim, worker.pid, worker.qid)["active"]:
            assert time.monotonic() < deadline, "the preempting tool never suspended the queue"
            time.sleep(0.01)
        held = queue_state(sim, worker.pid, worker.qid)["head_remaining_us"]
        time.sleep(0.1)
        assert queue_state(sim, worker.pid, worker.qid)["head_remaining_us"] == held
    finally:
        tool.kill()                                    # SIGKILL: the kernel's exit path resumes
        tool.wait()
    done = worker.line()
    assert "done_s" in done
    assert queue_state(sim, worker.pid, worker.qid)["completed"] == 1


def last_ioctl_cost_s(client):
    cost = client.ctl("last_cost")
    return cost["remap_s"] + cost["grace_s"] + cost["save_s"] + cost["restore_s"]


def test_an_hws_remap_stalls_the_other_queues_of_that_device_only(sim, hip):
    """Suspend/resume cycles of queue B on one device stall A (same device) for the modelled
    unmap/map + grace + CWSR save/restore of each; C on another device runs on."""
    a, b, c = hip.stream(device=15), hip.stream(device=15), hip.stream(device=16)
    for stream in (b, a, c):
        hip.launch(stream, work_us=2e6, waves=8)      # long enough to outlast the cycles
    client = Client(sim)

    def lag_us():                                       # how far A is behind C
        state = client.queues()
        return state[a.queue_id]["head_remaining_us"] - state[c.queue_id]["head_remaining_us"]
    stalled_s = 0.0
    try:
        with DebugTrapSuspend(client.kfd, os.getpid(), read_wave_state=False) as mech:
            lag_before = lag_us()                         # C started later (its queue was created after A's)
            for _ in range(40):
                mech.suspend([b.queue_id], grace_period=255)
                stalled_s += last_ioctl_cost_s(client)
                mech.resume([b.queue_id])
                stalled_s += last_ioctl_cost_s(client)
            stalled_us = lag_us() - lag_before
    finally:
        client.ctl.close()
        client.kfd.close()
    assert stalled_s > 40 * 150e-6                      # grace 255 x 1K clocks, two remaps, the save
    assert abs(stalled_us - stalled_s * 1e6) < 0.05 * stalled_s * 1e6


def test_a_costed_call_sleeps_its_modelled_time_and_such_calls_take_turns(tmp_path, monkeypatch):
    """Realtime: a caller sleeps in its ioctl for the modelled cost (the reply says when the call
    returns), and costed calls take turns on the device-wide DQM lock. Without CWSR a suspend drains
    the queue's resident waves (ESTIMATE 1 ms, timing.py), so four suspends issued at once end no
    sooner than four such costs after they began."""
    from kfdtool.sim import runner
    monkeypatch.setenv("KFDTOOL_SIM_DIR", str(tmp_path))      # a realtime simulator of its own
    sim = runner.start(MACHINE, params={"cwsr_enable": 0})
    hip = SimHip(MACHINE)
    client = Client(sim)
    streams = []
    try:
        streams += [hip.stream(device=0) for _ in range(4)]
        for stream in streams:
            hip.launch(stream, work_us=20e6, waves=8)           # resident throughout the test
        assert len({s.queue_id for s in streams}) == 4          # HIP's pool: four queues, one each
        hip.flush()                                             # the server has dispatched them all
        assert all(client.queues()[s.queue_id]["resident_waves"] == 8 for s in streams)
        client.enable_debug()
        client.snapshot()                                       # clears EC_QUEUE_NEW: suspendable
        t0 = time.monotonic()
        assert client.suspend([streams[0].queue_id])[0] == 1
        took, cost = time.monotonic() - t0, last_ioctl_cost_s(client)
        assert cost >= 1e-3 and took >= cost
        client.resume([streams[0].queue_id])

        spans = []

        def suspend(stream):
            began = time.monotonic()
            assert client.suspend([stream.queue_id])[0] == 1
            spans.append((began, time.monotonic()))
        threads = [threading.Thread(target=suspend, args=(s,)) for s in streams]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert len(spans) == 4
        assert max(end for _, end in spans) - min(began for began, _ in spans) >= 4 * 1e-3
    finally:
        client.resume([s.queue_id for s in streams if s.queue_id is not None])
        client.close()
        hip.close()
        runner.stop(MACHINE)


def test_wait_on_a_destroyed_queue_errors_instead_of_hanging(hip):
    s = hip.stream(device=17)
    hip.launch(s, work_us=5e6, waves=8)
    event = hip.record(s)
    outcome = []

    def waiter():
        try:
            hip.synchronize(event)
            outcome.append("done")
        except SimulatorError as e:
            outcome.append(str(e))
    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.05)
    hip.destroy_stream(s)
    thread.join(5)
    assert not thread.is_alive()
    assert outcome and "destroyed" in outcome[0]


def test_doorbells_only_on_the_callers_own_queues(sim, hip, workers):
    s = hip.stream(device=18)
    hip.launch(s, work_us=100, waves=8)
    qid = s.queue_id
    # another process, with its own connection: our qid names none of its queues
    worker = workers(device=19, work_us=100)
    other = qid + worker.qid + 1
    with pytest.raises(SimulatorError, match=f"has no queue {other}"):
        hip.doorbell("query", qid=other)

    def child_on_the_parents_connection(fd):
        """A forked child writing on the fd its parent opened (the parent's KFD process)."""
        sock = socket.socket(fileno=os.dup(fd))
        sock.sendall(frame(b"D" + json.dumps({"op": "dispatch", "qid": qid, "kernels": [[1.0, 1]]}).encode()))
        return sock.recv(4096)
    reply = in_child(child_on_the_parents_connection, hip.rt.kfd.backend.sock.fileno())
    assert b"may not ring pid" in reply and b"ok" not in reply
    assert hip.doorbell("query", qid=qid)["dispatched"] == 1    # nothing was added


@pytest.mark.parametrize("kernels, needle", [
    ([], "non-empty list"),
    ([[0, 8]], "work_us must be"),
    ([[-5, 8]], "work_us must be"),
    ([[float("inf"), 8]], "work_us must be"),
    ([[10, 0]], "waves must be"),
    ([[10, 2.5]], "waves must be"),
    ([[10, True]], "waves must be"),
    ([["10", 8]], "work_us must be"),
    ([[10]], "a kernel is"),
    ("x", "non-empty list"),
])
def test_nonsense_dispatches_get_one_line(hip, kernels, needle):
    s = hip.stream(device=20)
    hip.launch(s, work_us=1, waves=1)
    with pytest.raises(SimulatorError, match=needle) as info:
        hip.doorbell("dispatch", qid=s.queue_id, kernels=kernels)
    assert "\n" not in str(info.value)


def test_the_ring_bounds_outstanding_packets_and_bad_messages_close_only_their_connection(sim, hip):
    qid = hip.rt.create_queue(hip.gpus[21], ring_size=4096)        # 64 AQL packets
    hip.doorbell("dispatch", qid=qid, kernels=[[1e6, 1]] * 64)
    with pytest.raises(SimulatorError, match="holds 64 packets and 64 are outstanding"):
        hip.doorbell("dispatch", qid=qid, kernels=[[1.0, 1]])
    with pytest.raises(SimulatorError, match=r"count must be an integer in \[0, 64\]"):
        hip.doorbell("wait", qid=qid, count=65)
    with pytest.raises(SimulatorError, match="unknown doorbell op"):
        hip.doorbell("launch", qid=qid)
    raw = socket.socket(socket.AF_UNIX)
    raw.connect(str(sim.socket))
    raw.sendall(frame(b"D{not json"))
    assert b"doorbell message is not JSON" in raw.recv(4096)
    raw.close()
    assert hip.doorbell("query", qid=qid)["dispatched"] == 64      # the server serves on


def test_a_waiter_that_disappears_costs_nothing(sim, hip, workers):
    worker = workers(device=22, work_us=5e6)           # waits on a 5 s kernel
    time.sleep(0.05)
    os.kill(worker.pid, signal.SIGKILL)                # waiter and KFD process gone
    worker.proc.wait()
    s = hip.stream(device=22)                          # a thread of ours waits, then its socket closes
    hip.launch(s, work_us=5e6, waves=8)
    from kfdtool.sim.control import Channel
    channel = Channel(sim.socket)
    channel.call_json(b"O")
    channel.sock.sendall(frame(b"D" + json.dumps({"op": "wait", "qid": s.queue_id, "count": 1}).encode()))
    time.sleep(0.05)
    channel.close()
    server = psutil.Process(json.loads((sim.dir / "machine.json").read_text())["pid"])
    time.sleep(0.05)
    before = sum(server.cpu_times()[:2])
    time.sleep(0.5)
    assert sum(server.cpu_times()[:2]) - before < 0.1   # no spinning on a wait nobody reads
    t0 = time.monotonic()
    assert hip.doorbell("query", qid=s.queue_id)["completed"] == 0
    assert time.monotonic() - t0 < 0.5
    with sim.control() as ctl:
        assert worker.pid not in ctl("status")["processes"]      # its queues and work went with it


def test_a_request_takes_effect_when_its_caller_made_it_within_what_the_model_allows():
    """clock.applied_at: the moment the caller stamped, never before the model was played to, never
    in the future, never more than MAX_LATE_NS ago; anything but a positive int means now."""
    from kfdtool.sim.clock import MAX_LATE_NS, applied_at
    now, played = 10_000_000_000, 9_990_000_000
    assert applied_at(9_995_000_000, played, now) == 9_995_000_000
    assert applied_at(9_980_000_000, played, now) == played            # the model does not go back
    assert applied_at(now + 5, played, now) == now                      # a stamp from the future
    assert applied_at(1, 0, now) == now - MAX_LATE_NS                   # another clock: bounded
    for junk in (0, -3, True, 9.99e9, "9995000000", None, [1]):
        assert applied_at(junk, played, now) == now


def dispatch_stamped(hip, qid, kernels, at):
    """Ring a doorbell as a client whose write was made at `at` (None: no stamp) would."""
    fields = {"op": "dispatch", "qid": qid, "kernels": kernels}
    if at is not None:
        fields["at"] = at
    return hip.rt.kfd.backend._channel().call_json(b"D" + json.dumps(fields).encode())


def test_a_dispatch_runs_from_the_moment_its_doorbell_was_rung_not_from_when_the_server_got_to_it(sim, hip):
    """The server handles one request at a time: a doorbell that waited for its turn (or for its
    Python) runs as of when it was rung, as on the device, where the CP sees the write at once."""
    stamped, unstamped = warm_stream(hip, 26), warm_stream(hip, 27)
    time.sleep(0.05)                                   # the model is played to the warm-ups' end, no later
    rung = time.monotonic_ns() - 15_000_000            # a doorbell that waited 15 ms for the server
    dispatch_stamped(hip, stamped.queue_id, [[30_000.0, 8]], at=rung)
    dispatch_stamped(hip, unstamped.queue_id, [[30_000.0, 8]], at=None)
    left = queue_state(sim, os.getpid(), stamped.queue_id)["head_remaining_us"]
    assert 0 < left <= 15_500                          # 15 ms of its 30 already run
    assert queue_state(sim, os.getpid(), unstamped.queue_id)["head_remaining_us"] > left + 10_000
    hip.doorbell("wait", qid=unstamped.queue_id, count=2)
    # a stamp from another clock (10 s ago) is taken as at most MAX_LATE_NS (20 ms) late, though the
    # model was last played 50 ms ago
    time.sleep(0.05)
    dispatch_stamped(hip, stamped.queue_id, [[100_000.0, 8]], at=time.monotonic_ns() - 10_000_000_000)
    assert 70_000 < queue_state(sim, os.getpid(), stamped.queue_id)["head_remaining_us"] <= 80_500
    hip.doorbell("wait", qid=stamped.queue_id, count=3)


def test_an_ioctl_takes_effect_when_it_was_made_a_suspend_stops_the_waves_then(sim, workers, monkeypatch):
    """The motivation: a SUSPEND_QUEUES that waited for the server stops the target's waves at the
    moment the debugger made the call, not when the server's one thread got to it."""
    import kfdtool.sim.client as sim_client
    worker = workers(device=28, work_us=300_000)
    kfd = KfdDevice(sim.open_kfd())
    try:
        with DebugTrapSuspend(kfd, worker.pid) as mech:
            mech.queues()                               # the snapshot now: suspend() makes one ioctl
            time.sleep(0.02)
            before = queue_state(sim, worker.pid, worker.qid)["head_remaining_us"]   # the model played to now
            time.sleep(0.03)
            real = sim_client.made_at_ns
            monkeypatch.setattr(sim_client, "made_at_ns", lambda: real() - 20_000_000)   # made 20 ms before it is sent
            assert [o.outcome for o in mech.suspend([worker.qid]).outcomes] == ["suspended"]
            monkeypatch.setattr(sim_client, "made_at_ns", real)
            ran_ms = (before - queue_state(sim, worker.pid, worker.qid)["head_remaining_us"]) / 1000
            assert ran_ms < 22                          # ~10 ms: stopped 20 ms before the ~30 ms since `before`
            mech.resume([worker.qid])
    finally:
        kfd.close()


def test_a_backdated_dispatch_is_never_applied_before_a_request_handled_earlier(sim_dir):
    """A doorbell rung while its queue was inactive (UPDATE_QUEUE 0 %) but handled after the queue
    was made active again must not run in the inactive interval. On MES a reactivation costs no
    remap, so no device's model is played to it: the order handled is the floor."""
    import kfdtool.ioctls.structs as s
    from kfdtool.sim import runner
    composite = start("composite")
    hip = SimHip("composite")
    try:
        gpus = list(hip.rt.topology.for_each_gpu())
        mes = next(i for i, n in enumerate(gpus) if n.gfx_target_version >= 110000)
        st = warm_stream(hip, mes)
        with composite.control() as ctl:
            q = next(x for x in ctl("queues", pid=os.getpid())["queues"] if x["qid"] == st.queue_id)

        def update(percent):
            hip._kfd.ioctl("UPDATE_QUEUE", s.kfd_ioctl_update_queue_args(q["ring_base"], q["qid"], q["ring_size"],
                                                                          percent, 7))
        update(0)
        time.sleep(0.03)
        rung = time.monotonic_ns()                      # rung now, while the queue is inactive ...
        time.sleep(0.01)
        update(100)                                     # ... and handled only after it is active again
        dispatch_stamped(hip, st.queue_id, [[30_000.0, 8]], at=rung)
        with composite.control() as ctl:
            left = next(x for x in ctl("queues", pid=os.getpid())["queues"] if x["qid"] == st.queue_id)
        assert left["head_remaining_us"] > 25_000       # not ~20 ms: none of it ran while inactive
        hip.doorbell("wait", qid=st.queue_id, count=2)
    finally:
        hip.close()
        runner.stop("composite")                        # other tests start it with another ABI


def test_a_dispatch_is_stamped_as_the_channel_writes_it_after_waiting_for_earlier_replies():
    """A thread whose channel first reads the replies of its posted doorbells rings the new one only
    then: its "at" says so (stamped earlier, it would run for the time it spent waiting)."""
    from kfdtool.sim.client import _doorbell_message
    from kfdtool.sim.control import Channel
    from kfdtool.sim.protocol import recv_frame
    ours, server = socket.socketpair()
    channel = Channel.__new__(Channel)
    channel.sock, channel.unanswered = ours, 1            # one posted doorbell not answered yet
    seen = []

    def answer():
        time.sleep(0.03)                                  # the posted one is answered 30 ms from now
        server.sendall(frame(b'J{"ok": true}'))
        seen.append(json.loads(recv_frame(server)[0][1:]))
        server.sendall(frame(b'J{"ok": true}'))
    thread = threading.Thread(target=answer)
    thread.start()
    made = time.monotonic_ns()
    channel.call_json(_doorbell_message("dispatch", {"qid": 1, "kernels": [[1.0, 1]]}))
    thread.join(5)
    ours.close()
    server.close()
    assert seen and seen[0]["op"] == "dispatch" and seen[0]["at"] - made >= 25_000_000
