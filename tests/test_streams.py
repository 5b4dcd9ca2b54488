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
