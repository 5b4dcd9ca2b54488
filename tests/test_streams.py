"""Stream -> KFD queue mapping against the simulator's model of HIP queue pooling."""
import os

import pytest

from kfdtool.cwsr.debugtrap import DebugTrapSuspend
from kfdtool.cwsr.streams import StreamQueueMapper
from kfdtool.sim.hip import SimHipRuntime
from simhelpers import Client, start

LONG_US = 10e6          # a kernel that outlasts the test: the queue stays busy


@pytest.fixture
def hip(sim_dir):
    cl = Client(start("mi308x"))
    yield cl, SimHipRuntime(cl.rt, max_hw_queues=4)
    cl.close()


def test_pooling_is_reported(hip):
    cl, rt = hip
    gpu = cl.gpus[2]
    mapper = StreamQueueMapper(cl.sim.sysfs_root, max_hw_queues=4)
    streams = [rt.create_stream(f"s{i}", gpu) for i in range(6)]
    maps = [mapper.map(s, lambda s=s: rt.launch(s, work_us=LONG_US), gpu_id=gpu) for s in streams]
    assert [m.how for m in maps] == ["new-queue"] * 4 + ["shared-pool"] * 2
    assert all(m.exclusive for m in maps[2:4]) and not any(m.exclusive for m in maps[:2])
    # the 5th and 6th streams share the least-used queues, as ROCclr picks them
    assert maps[4].queue_ids == [streams[4].qid] and maps[5].queue_ids == [streams[5].qid]
    assert maps[4].shared_with == [streams[0]] and not maps[0].exclusive
    assert set(mapper.sharing()) == {streams[4].qid, streams[5].qid}
    high = rt.create_stream("hp", gpu, "high")
    m = mapper.map(high, lambda: rt.launch(high, work_us=LONG_US), priority="high", gpu_id=gpu)
    assert m.how == "new-queue" and m.exclusive            # its own pool


def test_cu_mask_streams_are_never_shared(hip):
    cl, rt = hip
    gpu = cl.gpus[3]
    mapper = StreamQueueMapper(cl.sim.sysfs_root, max_hw_queues=1)
    rt.max_hw_queues = 1
    a, b = rt.create_stream("a", gpu), rt.create_stream("b", gpu, cu_mask=True)
    assert mapper.map(a, lambda: rt.launch(a, work_us=LONG_US), gpu_id=gpu).how == "new-queue"
    assert mapper.map(b, lambda: rt.launch(b, work_us=LONG_US), gpu_id=gpu, cu_mask=True).how == "new-queue"
    assert a.qid != b.qid


def test_preempting_a_shared_queue_stops_every_stream_on_it(hip):
    cl, rt = hip
    gpu = cl.gpus[4]
    rt.max_hw_queues = 1
    mapper = StreamQueueMapper(cl.sim.sysfs_root, max_hw_queues=1)
    s1, s2 = rt.create_stream("s1", gpu), rt.create_stream("s2", gpu)
    m1 = mapper.map(s1, lambda: rt.launch(s1, work_us=LONG_US), gpu_id=gpu)
    m2 = mapper.map(s2, lambda: rt.launch(s2, work_us=LONG_US), gpu_id=gpu)
    assert m2.how == "shared-pool" and m2.queue_ids == m1.queue_ids and m2.shared_with == [s1]
    with DebugTrapSuspend(cl.kfd, os.getpid()) as mech:
        mech.suspend(m1.queue_ids)
        assert not cl.queues()[s2.qid]["active"]           # s2's work stopped too
    rt.destroy_stream(s1)
    assert s2.qid in cl.queues()                           # refcount keeps the queue for s2
    rt.destroy_stream(s2)
    assert m1.queue_ids[0] not in cl.queues()


def test_threads_launching_on_one_stream_can_each_wait_for_it(hip):
    """HIP streams may be shared by threads: an event recorded after launches from several threads
    covers them all and can be waited for by any thread. Each thread posts on its own connection
    and the server reads them in no set order: a wait counted another thread's launches that had
    not reached it yet and was refused (4 of 5 runs of a review's program)."""
    import threading
    cl, rt = hip
    stream = rt.create_stream("shared", cl.gpus[0])
    errors, barrier = [], threading.Barrier(3)

    def launcher():
        try:
            barrier.wait()
            for i in range(60):
                rt.launch(stream, work_us=20.0, waves=8)
                if i % 10 == 9:
                    rt.synchronize(rt.record(stream))
        except Exception as e:   # noqa: BLE001  reported below, from the test's thread
            errors.append(e)
    threads = [threading.Thread(target=launcher) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    event = rt.record(stream)                        # this thread launched nothing on it
    rt.synchronize(event)
    assert event.signal == 180 and rt.query(event)


def test_a_queue_id_used_again_counts_its_kernels_anew(hip):
    """The kernel gives a destroyed queue's id to the next queue: that queue's events count from
    its own first kernel (the old count made every wait on it a refusal)."""
    cl, rt = hip
    first = rt.create_stream("first", cl.gpus[0])
    for _ in range(5):
        rt.launch(first, work_us=10.0)
    rt.synchronize(rt.record(first))
    qid = first.qid
    rt.destroy_stream(first)
    second = rt.create_stream("second", cl.gpus[0])
    rt.launch(second, work_us=10.0)
    event = rt.record(second)
    assert second.qid == qid and event.signal == 1
    rt.synchronize(event)


def test_an_event_recorded_by_another_thread_covers_the_launches_it_saw(hip):
    """One thread launches and exits; another, started after it (CPython may give it the same
    thread id), records the stream and waits. The launches were posted on the first thread's
    connection, perhaps not yet read by the server: the wait was refused whenever the recording
    thread was taken for the launcher (the id reused) or did not make sure the server had them."""
    import threading
    cl, rt = hip
    for round_ in range(10):
        stream = rt.create_stream(f"s{round_}", cl.gpus[0])
        launcher = threading.Thread(target=lambda: [rt.launch(stream, work_us=1.0, waves=8) for _ in range(200)])
        launcher.start()
        launcher.join()
        errors = []

        def wait():
            try:
                event = rt.record(stream)
                rt.synchronize(event)
                assert event.signal == 200 and rt.query(event)
            except Exception as e:   # noqa: BLE001  reported below, from the test's thread
                errors.append(e)
        waiter = threading.Thread(target=wait)
        waiter.start()
        waiter.join()
        assert not errors, f"round {round_}: {errors[0]}"
        rt.destroy_stream(stream)


def test_a_child_forked_while_the_runtime_is_busy_can_use_it(hip):
    """A fork while another thread holds the runtime's lock (a launch in progress) left the child's
    copy locked: the child's first launch waited for good instead of being answered (as the kernel
    answers a child using its parent's fd: EBADF, or its own KFD process)."""
    import warnings
    cl, rt = hip
    with rt._lock:                                   # what another thread's launch holds
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            os._exit(0 if rt._lock.acquire(timeout=2) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
