"""Which KFD queue(s) run a HIP stream, found with unprivileged upstream means: the queue ids in
/sys/class/kfd/kfd/proc/<self>/queues before and after the stream's first launch.

HIP (ROCclr) pools hardware queues: per device and per priority at most GPU_MAX_HW_QUEUES (default 4)
queues; a further stream shares the pooled queue with the fewest streams, and streams with a CU mask
always get their own (kfd-abi.md §6.2). Suspending a shared queue suspends every stream on it, so
every mapping says whether it is shared and with whom.

    mapper = StreamQueueMapper()
    m = mapper.map("decode", first_launch=lambda: run_one_kernel_on(stream))
    m.queue_ids, m.shared_with
"""
import os
from dataclasses import dataclass, field

from ..sysfs import SysfsRoot

DEFAULT_MAX_HW_QUEUES = 4


@dataclass
class StreamMapping:
    stream: object
    queue_ids: list
    how: str                       # "new-queue" | "shared-pool" | "unknown"
    priority: str = "normal"
    shared_with: list = field(default_factory=list)

    @property
    def exclusive(self):
        return self.how == "new-queue" and not self.shared_with


class StreamQueueMapper:
    def __init__(self, sysfs=None, pid=None, max_hw_queues=None):
        self.sysfs = sysfs if isinstance(sysfs, SysfsRoot) else SysfsRoot(sysfs)
        self.pid = pid or os.getpid()
        env = os.environ.get("GPU_MAX_HW_QUEUES")
        self.max_hw_queues = max_hw_queues or (int(env) if env and env.isdigit() else DEFAULT_MAX_HW_QUEUES)
        self.pools = {}                # (gpu_id, priority) -> {qid: [streams]}
        self.mappings = {}

    def queue_ids(self):
        """{qid: gpu_id} of this process now."""
        qdir = self.sysfs.proc / str(self.pid) / "queues"
        out = {}
        try:
            names = os.listdir(qdir)
        except FileNotFoundError:
            return out
        for name in names:
            try:
                with open(qdir / name / "gpuid") as f:
                    out[int(name)] = int(f.read())
            except (OSError, ValueError):
                continue
        return out

    def map(self, stream, first_launch, priority="normal", gpu_id=None, cu_mask=False):
        """Run `first_launch()` (the stream's first kernel, synchronized) and see what appeared."""
        before = self.queue_ids()
        first_launch()
        after = self.queue_ids()
        new = sorted(set(after) - set(before))
        if new:
            gpu = after[new[0]]
            pool = self.pools.setdefault((gpu, priority), {})
            if not cu_mask:                # CU-masked queues are never pooled
                for qid in new:
                    pool[qid] = [stream]
            mapping = StreamMapping(stream, new, "new-queue", priority)
        else:
            pool = self.pools.get((gpu_id, priority)) if gpu_id is not None else None
            if pool is None and gpu_id is None:
                pools = [p for (g, prio), p in self.pools.items() if prio == priority]
                pool = pools[0] if len(pools) == 1 else None
            if pool and len(pool) >= self.max_hw_queues:
                # ROCclr's rule: the pooled queue with the fewest streams (lowest refcount)
                qid = min(pool, key=lambda q: len(pool[q]))
                mapping = StreamMapping(stream, [qid], "shared-pool", priority, shared_with=list(pool[qid]))
                for other in pool[qid]:
                    if other in self.mappings:
                        self.mappings[other].shared_with.append(stream)
                pool[qid].append(stream)
            else:
                mapping = StreamMapping(stream, [], "unknown", priority)   # queue predates the mapper
        self.mappings[stream] = mapping
        return mapping

    def sharing(self):
        """{qid: [streams]} for queues that carry more than one stream."""
        return {qid: list(streams) for pool in self.pools.values() for qid, streams in pool.items()
                if len(streams) > 1}


def map_torch_stream(mapper, stream, priority="normal"):
    """Map a torch.cuda.Stream (a hipStream_t on ROCm) by running one tiny kernel on it."""
    import torch

    def launch():
        with torch.cuda.stream(stream):
            torch.ones(1, device=stream.device).add_(1)
        stream.synchronize()
    return mapper.map(stream, launch, priority, gpu_id=None)
