"""A model of HIP's (ROCclr's) stream-to-hardware-queue pooling on the simulated KFD, so stream
mapping and "preempting a shared queue hits every stream on it" can be tested without ROCm.

Modelled from ROCm/clr rocdevice.cpp `Device::acquireQueue` (kfd-abi.md §6.2): per device, separate
pools per priority (low/normal/high); at most GPU_MAX_HW_QUEUES (default 4) queues per pool; a new
stream beyond that shares the pooled queue with the lowest refcount; CU-masked streams always get
their own queue; a queue is acquired lazily, when the stream first launches work (HIP's lazy stream
creation), and destroyed when its last stream goes. KFD priorities: low 0, normal 7, high 11.
"""
import os
from dataclasses import dataclass

KFD_PRIORITY = {"low": 0, "normal": 7, "high": 11}


@dataclass(eq=False)
class SimStream:
    name: str
    gpu_id: int
    priority: str = "normal"
    cu_mask: bool = False
    qid: int | None = None


class SimHipRuntime:
    def __init__(self, runtime, control, max_hw_queues=None):
        self.rt = runtime                 # sim.workload.FakeRuntime
        self.ctl = control                # SimControl, to mark queues busy
        env = os.environ.get("GPU_MAX_HW_QUEUES")
        self.max_hw_queues = max_hw_queues or (int(env) if env and env.isdigit() else 4)
        self.pools = {}                   # (gpu_id, priority) -> {qid: refcount}

    def create_stream(self, name, gpu_id, priority="normal", cu_mask=False):
        if priority not in KFD_PRIORITY:
            raise ValueError(f"priority must be one of {', '.join(KFD_PRIORITY)}")
        return SimStream(name, gpu_id, priority, cu_mask)

    def _acquire(self, stream):
        pool = self.pools.setdefault((stream.gpu_id, stream.priority), {})
        if stream.cu_mask:
            return self.rt.create_queue(stream.gpu_id, priority=KFD_PRIORITY[stream.priority])
        if len(pool) < self.max_hw_queues:
            qid = self.rt.create_queue(stream.gpu_id, priority=KFD_PRIORITY[stream.priority])
            pool[qid] = 1
            return qid
        qid = min(pool, key=pool.get)
        pool[qid] += 1
        return qid

    def launch(self, stream, waves=64):
        """Launch work: the stream's queue gets `waves` resident waves."""
        if stream.qid is None:
            stream.qid = self._acquire(stream)
        self.ctl("set_waves", pid=os.getpid(), qid=stream.qid, waves=waves)

    def destroy_stream(self, stream):
        if stream.qid is None:
            return
        pool = self.pools.get((stream.gpu_id, stream.priority), {})
        if stream.qid in pool:
            pool[stream.qid] -= 1
            if pool[stream.qid] == 0:
                del pool[stream.qid]
                self.rt.destroy_queue(stream.qid)
        else:
            self.rt.destroy_queue(stream.qid)
        stream.qid = None
