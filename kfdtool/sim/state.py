"""State of the simulated KFD: processes, queues, buffer objects (kfd_priv.h's structures, trimmed)."""
import collections
from dataclasses import dataclass, field

from ..ioctls import constants as c
from . import clock


COMPLETIONS_KEPT = 64      # completion moments a queue remembers (SimQueue.completion_ns)


@dataclass
class SimQueue:
    qid: int
    gpu_id: int
    queue_type: int                   # KFD_IOC_QUEUE_TYPE_*
    ring_base: int
    ring_size: int
    wptr: int
    rptr: int
    ctx_save_restore_address: int
    ctx_save_restore_size: int
    ctl_stack_size: int
    percent: int
    priority: int
    pm4_target_xcc: int = 0
    metadata_ring_size: int = 0
    # the BOs kfd_queue_acquire_buffers took (queue_properties' wptr_bo, rptr_bo, ring_bo,
    # eop_buf_bo, cwsr_bo): name -> memory.BufferObject, each holding one queue_refcount on its
    # mapping in the queue's GPU VM until kfd_queue_unref_bo_vas; empty before 6.12 (KFD 1.17)
    buffers: dict = field(default_factory=dict)
    exception_status: int = c.KFD_EC_MASK(c.EC_QUEUE_NEW)
    is_suspended: bool = False
    is_evicted: bool = False
    being_destroyed: bool = False
    cu_mask: tuple = ()
    is_user_cu_masked: bool = False   # SET_CU_MASK succeeded once (pqm_update_mqd)
    is_dbg_wa: bool = False           # the debugger's CU workaround holds the mask (kfd_debug.c)
    # timing model: waves resident while the queue runs work, and work done while mapped
    resident_waves: int = 0
    progress_ns: int = 0
    mapped_since_ns: int | None = None
    saved_ctl_stack_bytes: int = 0
    saved_wave_bytes: int = 0
    # execution model (execution.py): AQL packets rung in and not yet retired, in ring order, each
    # (work_us with the device to itself, waves); how many were dispatched and completed (the
    # values a completion signal would carry)
    kernels: collections.deque = field(default_factory=collections.deque)
    dispatched: int = 0
    completed: int = 0
    # when the latest COMPLETIONS_KEPT completions happened on the model's clock (ns), the last
    # one the `completed`-th (what a wait reports as its work's end)
    completion_ns: collections.deque = field(default_factory=lambda: collections.deque(maxlen=COMPLETIONS_KEPT))
    # kfd_device_queue_manager.c: allocate_sdma_queue, for an SDMA queue: its bit in the device's
    # sdma_bitmap (xgmi_sdma_bitmap where sdma_xgmi), the engine and the queue on that engine;
    # sdma_id None for a compute queue
    sdma_id: int | None = None
    sdma_xgmi: bool = False
    sdma_engine_id: int = 0
    sdma_queue_id: int = 0
    # allocate_doorbell: the queue's doorbell index in its process's doorbell pages on the device
    doorbell_id: int = 0

    def completed_at(self, count):
        """When the queue's `count`-th kernel completed on the model's clock (ns), None if not
        known (not yet, or longer ago than COMPLETIONS_KEPT completions)."""
        back = self.completed - count
        return self.completion_ns[-1 - back] if 0 <= back < len(self.completion_ns) else None

    @property
    def is_compute(self):
        return self.queue_type in (c.KFD_IOC_QUEUE_TYPE_COMPUTE, c.KFD_IOC_QUEUE_TYPE_COMPUTE_AQL)

    @property
    def is_active(self):
        """QUEUE_IS_ACTIVE (kfd_priv.h:563-567)."""
        return (self.ring_size > 0 and self.ring_base != 0 and self.percent > 0
                and not self.is_evicted and not self.is_suspended)

    def sync_progress(self, now_ns=None):
        """Account work done since the last state change; call before and after every change."""
        now_ns = now_ns if now_ns is not None else clock.now_ns()
        resume_at = now_ns
        if self.mapped_since_ns is not None:
            self.progress_ns += max(0, now_ns - self.mapped_since_ns)
            resume_at = max(now_ns, self.mapped_since_ns)     # an HWS stall still under way is no progress
        self.mapped_since_ns = resume_at if (self.is_active and self.resident_waves > 0) else None


@dataclass
class SimProcess:
    pid: int
    uid: int
    gpu_ids: tuple
    comm: str = ""                                      # the task's name, for SMI's PROCESS_START/END
    runtime_state: int = c.DEBUG_RUNTIME_STATE_DISABLED
    r_debug: int = 0
    ttmp_setup: int = 0
    debug_trap_enabled: bool = False
    debugger: "SimProcess | None" = None
    debugged_count: int = 0
    exception_mask: int = 0
    exception_status: int = 0                           # process-level exceptions (EC_PROCESS_*) raised
    device_exceptions: dict = field(default_factory=dict)   # gpu_id -> pdd->exception_status (EC_DEVICE_*)
    runtime_sema: int = 0                               # runtime_enable_sema: ups not yet taken
    dbg_flags: int = 0
    queues: dict = field(default_factory=dict)          # qid -> SimQueue, insertion = creation order
    bos: dict = field(default_factory=dict)             # handle -> BufferObject
    events: dict = field(default_factory=dict)          # event_id -> signaled
    next_event: int = 1
    queues_paused: bool = False                         # CRIU PROCESS_INFO
    has_reset_queue: bool = False
    vram: dict = field(default_factory=dict)            # gpu_id -> bytes
    evicted_ms: dict = field(default_factory=dict)      # gpu_id -> ms
    evicted_since: float | None = None
    profiler_locked: set = field(default_factory=set)
    xnack: int = 0
    alive: bool = True

    def lowest_free_qid(self):
        for qid in range(c.KFD_MAX_NUM_OF_QUEUES_PER_PROCESS):
            if qid not in self.queues:
                return qid
        return None

    def queues_on(self, gpu_id):
        return [q for q in self.queues.values() if q.gpu_id == gpu_id]
