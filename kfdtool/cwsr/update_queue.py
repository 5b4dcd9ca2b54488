"""Queue suspend by UPDATE_QUEUE with percentage 0 (and back to 100): what ROCr's
AqlQueue::Suspend/Resume do. Only for the calling process's own queues (queue ids are per
process and the fd is bound to its opener). The ring address and size must be resupplied exactly
as mapped (kfd-abi.md §2a). Under HWS every call unmaps and remaps every dynamic queue of the
device; there is no grace period; waves are CWSR-saved when the queue has a save area. Unlike
DBG_TRAP, nothing resumes these queues if this process forgets to: close() does, and an exiting
process takes its queues with it.
"""
import os
from dataclasses import dataclass

from ..errors import KfdIoctlError
from ..ioctls import constants as c
from ..ioctls import structs as s
from .mechanisms import Availability, Mechanism, MechanismResult, QueueOutcome

NO_GRACE = "UPDATE_QUEUE has no grace period: the requested one was not applied"


@dataclass(frozen=True)
class OwnQueue:
    qid: int
    ring_base: int
    ring_size: int
    priority: int = 7
    compute: bool = True
    ctx_save_restore_address: int = 0


class UpdateQueueSuspend(Mechanism):
    name = "update-queue"

    def __init__(self, kfd, queues, read_wave_state=True):
        super().__init__()
        self.kfd = kfd
        self.queues = {q.qid: q for q in queues}
        self.read_wave_state = read_wave_state

    @classmethod
    def from_snapshot(cls, kfd):
        """Learn our own queues' rings from a self debug-trap snapshot (briefly self-debugging)."""
        from .debugtrap import DebugTrapSuspend
        mech = DebugTrapSuspend(kfd, os.getpid())
        try:
            entries = mech.queues(clear_new=False)
        finally:
            mech.close()
        return cls(kfd, [OwnQueue(e.queue_id, e.ring_base_address, e.ring_size, 7,
                                  e.queue_type in (c.KFD_IOC_QUEUE_TYPE_COMPUTE, c.KFD_IOC_QUEUE_TYPE_COMPUTE_AQL),
                                  e.ctx_save_restore_address) for e in entries])

    def _update(self, q, percentage):
        self.kfd.ioctl("UPDATE_QUEUE", s.kfd_ioctl_update_queue_args(q.ring_base, q.qid, q.ring_size,
                                                                     percentage, q.priority))

    def _each(self, qids, percentage):
        """UPDATE_QUEUE each queue to `percentage`; yields (qid, queue, outcome or None if it worked)."""
        for qid in qids:
            q = self.queues.get(qid)
            if q is None:
                yield qid, None, QueueOutcome(qid, "not-found", detail="not one of this process's known queues")
                continue
            try:
                self._update(q, percentage)
            except KfdIoctlError as e:
                yield qid, q, QueueOutcome(qid, "error", detail=str(e))
                continue
            yield qid, q, None

    def suspend(self, qids=None, grace_period=None):
        outcomes = []
        notes = [] if grace_period is None else [NO_GRACE]
        for qid, q, failed in self._each(sorted(self.queues) if qids is None else qids, 0):
            if failed:
                outcomes.append(failed)
                continue
            outcome = QueueOutcome(qid, "already" if qid in self._held else "suspended")
            self._held.add(qid)
            if q.compute and self.read_wave_state:
                outcome.ctl_stack_bytes, outcome.save_area_bytes = self._wave_state(q)
            outcomes.append(outcome)
        return MechanismResult(outcomes, notes)

    def _wave_state(self, q):
        args = s.kfd_ioctl_get_queue_wave_state_args(ctl_stack_address=q.ctx_save_restore_address, queue_id=q.qid)
        try:
            self.kfd.ioctl("GET_QUEUE_WAVE_STATE", args)
        except KfdIoctlError:
            return None, None          # no CWSR, or not a compute queue
        return args.ctl_stack_used_size, args.save_area_used_size

    def resume(self, qids=None):
        outcomes = []
        for qid, _, failed in self._each(sorted(self._held) if qids is None else qids, 100):
            if failed:
                outcomes.append(failed)
                continue
            self._held.discard(qid)
            outcomes.append(QueueOutcome(qid, "resumed"))
        return MechanismResult(outcomes)

    def close(self):
        if self._held:
            self.resume()


def availability(target_pid=None):
    if target_pid is not None and target_pid != os.getpid():
        return Availability("update-queue", False, "only the process that owns the queues can update them "
                                                   "(queue ids are per process; run it in-process, e.g. xsched_lv3)")
    return Availability("update-queue", True, "available for this process's own queues",
                        ["no grace period", "HWS: each call remaps every queue of the device",
                         "not undone by the kernel if this process stops updating: resume before exit"])
