"""Lv3 on AMD: the queue that launches the work (a HIP stream) is mapped to its KFD queue ids, and
interrupt/restore suspend and resume those queues through DBG_TRAP (waves saved to the CWSR area).

The same code runs against the simulated KFD (CI) and /dev/kfd (ROCm hosts, untested here: no AMD
GPU). Where the mapped queue is shared with other streams (HIP pools 4 queues per priority by
default), interrupting it stops them all: `shared_with` says so.

Close it before the process's GPU runtime shuts down: this process debugs itself, and a debugged
process turning its runtime off waits for its debugger's answer (kfd_chardev.c: runtime_disable),
which only this object would give (DebugTrapSuspend.close answers it).
"""
import os

from kfdtool.cwsr.debugtrap import DebugTrapSuspend
from kfdtool.errors import Error

from ..levels import HwQueue, Level


class KfdHwQueue(HwQueue):
    max_level = Level.INTERRUPT

    def __init__(self, inner, kfd, queue_ids, grace_period=None, shared_with=()):
        self.inner = inner                 # the HwQueue that launches work (torch or sim)
        self.mech = DebugTrapSuspend(kfd, os.getpid(), read_wave_state=False)
        self.queue_ids = list(queue_ids)
        self.grace_period = grace_period
        self.shared_with = list(shared_with)
        self.why = (f"Lv3: KFD DBG_TRAP suspend of queue(s) {self.queue_ids} (CWSR)"
                    + (f"; shared with {len(self.shared_with)} other stream(s)" if self.shared_with else ""))

    def launch(self, payload):
        self.inner.launch(payload)

    def record_sync_point(self):
        return self.inner.record_sync_point()

    def sync_point_done(self, handle):
        return self.inner.sync_point_done(handle)

    def wait_sync_point(self, handle):
        self.inner.wait_sync_point(handle)

    def synchronize(self):
        self.inner.synchronize()

    def interrupt(self):
        bad = self.mech.suspend(self.queue_ids, self.grace_period).failed
        if bad:
            raise RuntimeError(f"KFD suspend failed for queue {bad[0].qid}: {bad[0].outcome} {bad[0].detail}")
        if getattr(self.inner, "max_level", Level.BLOCK) >= Level.INTERRUPT:
            self.inner.interrupt()         # the simulated device stops executing too

    def restore(self):
        self.mech.resume(self.queue_ids)
        if getattr(self.inner, "max_level", Level.BLOCK) >= Level.INTERRUPT:
            self.inner.restore()

    def close(self):
        self.mech.close()


def detect(kfd=None):
    """Can this process use Lv3 here? (level, reason)."""
    from kfdtool.device import KfdDevice
    try:
        kfd = kfd or KfdDevice.open()
    except Error as e:
        return Level.BLOCK, f"Lv1: no KFD ({e})"
    if not kfd.supports("DBG_TRAP"):
        return Level.BLOCK, f"Lv1: KFD ABI {kfd.abi} has no debugger API"
    return Level.INTERRUPT, f"Lv3 available: KFD ABI {kfd.abi} DBG_TRAP suspend/resume"
