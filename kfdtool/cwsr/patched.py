"""Opt-in support for preemption ioctls that exist only in patched kernels. Never the default.

* "preempt-queue": the seeds' AMDKFD_IOC_PREEMPT_QUEUE 0x87 / RESUME_QUEUE 0x88 with
  {queue_id, preempt_type DRAIN/RESET/SAVE, timeout_ms}. No upstream or ROCm kernel has them
  (kfd-abi.md §3); a stock kernel answers ENOTTY.
* "gpreempt": GPreempt's (ATC'25) suspend/resume through 'K' 0x88 with suspend-queues arguments
  plus a type word (0 suspend, 1 resume). Its kernel side is unpublished: layout UNVERIFIED.

Both operate on the caller's own queue ids (as the patches describe: the argument carries no pid),
so they serve only the process that owns the queues, never `kfdtool preempt --pid`. They are probed
with an invalid queue id first: ENOTTY means "this kernel has no such ioctl".
"""
import ctypes
import errno
import os

import ioctl_opt

from ..errors import KfdIoctlError, NotSupported
from ..ioctls.structs import KfdStruct, u32
from .mechanisms import Availability, Mechanism, MechanismResult, QueueOutcome

PREEMPT_DRAIN, PREEMPT_RESET, PREEMPT_SAVE = 0, 1, 2
PROBE_QUEUE_ID = 0xFFFFFFFF


class kfd_ioctl_preempt_queue_args(KfdStruct):
    _fields_ = [("queue_id", u32), ("preempt_type", u32), ("timeout_ms", u32), ("pad", u32)]


class gpreempt_suspend_queues_args(KfdStruct):
    _fields_ = [("exception_mask", ctypes.c_uint64), ("queue_array_ptr", ctypes.c_uint64),
                ("num_queues", u32), ("grace_period", u32), ("type", u32), ("pad", u32)]


AMDKFD_IOC_PREEMPT_QUEUE = ioctl_opt.IOWR(ord("K"), 0x87, kfd_ioctl_preempt_queue_args)
AMDKFD_IOC_RESUME_QUEUE = ioctl_opt.IOWR(ord("K"), 0x88, kfd_ioctl_preempt_queue_args)
GPREEMPT_IOC_SUSPEND_RESUME = ioctl_opt.IOWR(ord("K"), 0x88, gpreempt_suspend_queues_args)
VARIANTS = ("preempt-queue", "gpreempt")
NO_GRACE = "the patched ioctls take a timeout, not a grace period: the requested one was not applied"
OWN_QUEUES_ONLY = ("acts only on the calling process's own queues (the patched ioctl's argument has no pid), "
                   "so it cannot preempt another process")


def probe(kfd, variant):
    """True if the kernel implements the variant's ioctl (anything but ENOTTY on a bogus queue)."""
    try:
        if variant == "preempt-queue":
            kfd.raw_ioctl(AMDKFD_IOC_PREEMPT_QUEUE, kfd_ioctl_preempt_queue_args(PROBE_QUEUE_ID, PREEMPT_SAVE, 1),
                          "PREEMPT_QUEUE")
        else:
            kfd.raw_ioctl(GPREEMPT_IOC_SUSPEND_RESUME, gpreempt_suspend_queues_args(), "RESUME_QUEUE")
    except KfdIoctlError as e:
        return e.errno != errno.ENOTTY
    return True


class PatchedIoctlSuspend(Mechanism):
    def __init__(self, kfd, variant="preempt-queue", preempt_type=PREEMPT_SAVE, timeout_ms=1000):
        super().__init__()
        if variant not in VARIANTS:
            raise ValueError(f"unknown patched-driver variant {variant!r}; choose one of {', '.join(VARIANTS)}")
        self.kfd, self.variant = kfd, variant
        self.name = f"patched-{variant}"
        self.preempt_type, self.timeout_ms = preempt_type, timeout_ms
        if not probe(kfd, variant):
            raise NotSupported("PREEMPT_QUEUE", errno.ENOTTY)

    def _call(self, qid, resume):
        if self.variant == "preempt-queue":
            request = AMDKFD_IOC_RESUME_QUEUE if resume else AMDKFD_IOC_PREEMPT_QUEUE
            self.kfd.raw_ioctl(request, kfd_ioctl_preempt_queue_args(qid, self.preempt_type, self.timeout_ms),
                               "RESUME_QUEUE" if resume else "PREEMPT_QUEUE")
        else:
            arr = (ctypes.c_uint32 * 1)(qid)
            self.kfd.raw_ioctl(GPREEMPT_IOC_SUSPEND_RESUME, gpreempt_suspend_queues_args(
                queue_array_ptr=ctypes.addressof(arr), num_queues=1, type=int(resume)), "RESUME_QUEUE")

    def _each(self, qids, resume):
        outcomes = []
        for qid in qids:
            try:
                self._call(qid, resume)
            except KfdIoctlError as e:
                outcomes.append(QueueOutcome(qid, "error", detail=str(e)))
                continue
            (self._held.discard if resume else self._held.add)(qid)
            outcomes.append(QueueOutcome(qid, "resumed" if resume else "suspended"))
        return outcomes

    def suspend(self, qids=None, grace_period=None):
        if qids is None:
            raise ValueError("the patched ioctls need explicit queue ids")
        return MechanismResult(self._each(qids, resume=False), [] if grace_period is None else [NO_GRACE])

    def resume(self, qids=None):
        return MechanismResult(self._each(sorted(self._held) if qids is None else qids, resume=True))

    def close(self):
        if self._held:
            self.resume()


def availability(kfd, variant, target_pid=None):
    if target_pid is not None and target_pid != os.getpid():
        return Availability(f"patched-{variant}", False, OWN_QUEUES_ONLY)
    if kfd is None:
        return Availability(f"patched-{variant}", False, "not probed (needs /dev/kfd)")
    if probe(kfd, variant):
        return Availability(f"patched-{variant}", True, "this kernel implements it (a patched driver); opt-in only")
    return Availability(f"patched-{variant}", False, "this kernel has no such ioctl (ENOTTY): it exists only in "
                                                     "patched drivers")
