"""The simulated KFD against the Linux kernel's text (drivers/gpu/drm/amd/amdkfd/), third audit:

- kfd_device_queue_manager.c: allocate_sdma_queue turns an SDMA_BY_ENG_ID queue into an SDMA or
  SDMA_XGMI queue by the engine it got (q->properties.type), which sysfs (kfd_process.c:
  kfd_procfs_queue_show) and the DBG_TRAP queue snapshot (set_queue_type_for_user) show.
- kfd_device_queue_manager.c: reserve_debug_trap_vmid / release_debug_trap_vmid and kfd_debug.c:
  kfd_dbg_trap_activate / kfd_dbg_trap_deactivate: on a device without per-VMID debugging one
  debug VMID per device (dqm->trap_debug_vmid): a second process's activation is -EBUSY, which
  leaves it ENABLED_BUSY; a release where none is reserved is -EINVAL and unmaps nothing.

Not followed here: kfd_queue.c: kfd_queue_acquire_buffers's half-size ring of a gfx7/8 AQL queue
(no simulated machine has a GPU before gfx9)."""
import ctypes
import errno
import os

import pytest

from kfdtool.ioctls import constants as c
from kfdtool.ioctls import structs as s
from kfdtool.sim import runner
from simhelpers import Client, errno_of, in_child, start

UNWRITABLE = 0x1000                       # a user address no region of the call covers
BY_ENG_ID = c.KFD_IOC_QUEUE_TYPE_SDMA_BY_ENG_ID


@pytest.fixture(scope="module")
def mi210(sim_dir):
    yield start("mi210")
    runner.stop("mi210")                   # another module may start it with another ABI


@pytest.fixture(scope="module")
def vega10(sim_dir):
    yield start("vega10")
    runner.stop("vega10")


def create_sdma(cl, gpu, queue_type, **fields):
    """CREATE_QUEUE of an SDMA queue with its ring and pointers allocated and mapped on `gpu`."""
    ring = cl.rt.alloc(gpu, 4096, map_to_gpu=True)
    rptr = cl.rt.alloc(gpu, 4096, map_to_gpu=True)
    wptr = cl.rt.alloc(gpu, 4096, map_to_gpu=True)
    args = cl.kfd.abi.layout("kfd_ioctl_create_queue_args")(
        ring_base_address=ring, ring_size=4096, read_pointer_address=rptr, write_pointer_address=wptr,
        gpu_id=gpu, queue_type=queue_type, queue_percentage=100, queue_priority=7, **fields)
    cl.kfd.ioctl("CREATE_QUEUE", args)
    return args.queue_id


def destroy(cl, qid):
    cl.kfd.ioctl("DESTROY_QUEUE", s.kfd_ioctl_destroy_queue_args(qid, 0))


def sysfs_type(cl, qid, pid=None):
    path = cl.sim.sysfs_root / f"class/kfd/kfd/proc/{pid or os.getpid()}/queues/{qid}/type"
    return path.read_text()


def snapshot_types(cl):
    """qid -> queue_type of the DBG_TRAP queue snapshot of this (debug-enabled) process."""
    snap, buf = cl.snapshot()
    size = ctypes.sizeof(s.kfd_queue_snapshot_entry)
    entries = [s.kfd_queue_snapshot_entry.from_buffer_copy(bytes(buf)[i * size:(i + 1) * size])
               for i in range(snap.num_queues)]
    return {e.queue_id: e.queue_type for e in entries}


# --- 1. SDMA_BY_ENG_ID becomes SDMA or SDMA_XGMI ------------------------------------------------
def _by_engine_types(sim, engines):
    """In a new process: an SDMA_BY_ENG_ID queue on each engine of `engines` (of the first GPU), and
    what sysfs and the queue snapshot say of its type."""
    cl = Client(sim)
    gpu = cl.gpus[0]
    qids = [create_sdma(cl, gpu, BY_ENG_ID, sdma_engine_id=e) for e in engines]
    cl.enable_debug()
    try:
        snap = snapshot_types(cl)
        return [(sysfs_type(cl, q), snap[q]) for q in qids]
    finally:
        cl.dbg("DISABLE")
        for q in qids:
            destroy(cl, q)


def test_an_sdma_queue_by_engine_id_shows_as_sdma_on_a_pcie_engine(sim):
    """kfd_device_queue_manager.c: allocate_sdma_queue: an engine id below the device's SDMA engine
    count makes properties.type KFD_QUEUE_TYPE_SDMA (1): kfd_procfs_queue_show prints 1 and
    set_queue_type_for_user reports KFD_IOC_QUEUE_TYPE_SDMA (MI308X: 2 engines, no XGMI ones)."""
    assert in_child(_by_engine_types, sim, [0, 1]) == [("1", c.KFD_IOC_QUEUE_TYPE_SDMA)] * 2


def test_an_sdma_queue_by_engine_id_shows_as_sdma_xgmi_on_an_xgmi_engine(mi210):
    """kfd_device_queue_manager.c: allocate_sdma_queue: an engine id past the SDMA engines (MI210: 2
    PCIe engines, then 3 XGMI ones) makes properties.type KFD_QUEUE_TYPE_SDMA_XGMI, which 7.2's
    kfd_priv.h numbers 3 (no KFD_QUEUE_TYPE_DIQ) and the snapshot reports as
    KFD_IOC_QUEUE_TYPE_SDMA_XGMI; engine 1 stays SDMA."""
    assert in_child(_by_engine_types, mi210, [2, 4, 1]) == [
        ("3", c.KFD_IOC_QUEUE_TYPE_SDMA_XGMI), ("3", c.KFD_IOC_QUEUE_TYPE_SDMA_XGMI),
        ("1", c.KFD_IOC_QUEUE_TYPE_SDMA)]


# --- 2. one debug VMID per device without per-VMID debugging -------------------------------------
def remaps(cl):
    return {int(g): n for g, n in cl.ctl("status")["remaps"].items()}


def enable(cl):
    """ENABLE of this process on itself: (errno, runtime_state copied out)."""
    info = s.kfd_runtime_info()
    err = errno_of(lambda: cl.dbg("ENABLE", "enable", dbg_fd=cl.kfd.fd, rinfo_ptr=ctypes.addressof(info),
                                  rinfo_size=ctypes.sizeof(info)))
    return err, info.runtime_state


def enable_faulting(cl):
    """ENABLE of this process with a runtime_info pointer the kernel cannot write: its errno."""
    args = s.kfd_ioctl_dbg_trap_args(op=c.kfd_dbg_trap_operations.KFD_IOC_DBG_TRAP_ENABLE, pid=os.getpid())
    args.enable.dbg_fd, args.enable.rinfo_ptr, args.enable.rinfo_size = cl.kfd.fd, UNWRITABLE, 8
    return errno_of(lambda: cl.kfd.ioctl("DBG_TRAP", args))


def _second_debugged_process(sim):
    cl = Client(sim)
    gpu = cl.gpus[0]
    before = remaps(cl)[gpu]
    first = enable(cl)
    suspend = errno_of(lambda: cl.suspend([]))
    made = remaps(cl)[gpu] - before
    disable = errno_of(lambda: cl.dbg("DISABLE"))
    return first, suspend, made, disable


def _debugged_process(sim):
    cl = Client(sim)
    try:
        return enable(cl)
    finally:
        cl.dbg("DISABLE")


def test_a_second_debugged_process_on_a_device_without_per_vmid_debugging_is_enabled_busy(vega10):
    """kfd_device_queue_manager.c: reserve_debug_trap_vmid: -EBUSY where dqm->trap_debug_vmid is
    already set ("Trap debug id already reserved"), before unmapping anything; kfd_debug.c:
    kfd_dbg_trap_activate makes that runtime_state DEBUG_RUNTIME_STATE_ENABLED_BUSY, and
    kfd_dbg_trap_enable ignores the error: ENABLE succeeds and copies ENABLED_BUSY out, the hardware
    ops are -EPERM (kfd_ioctl_set_debug_trap) and DISABLE works. Once the holder's DISABLE released
    the VMID (release_debug_trap_vmid), the next process reserves it. Vega10 (GC 9.0.1) has no
    per-VMID debugging."""
    cl = Client(vega10)
    gpu = cl.gpus[0]
    try:
        before = remaps(cl)[gpu]
        assert enable(cl) == (0, c.DEBUG_RUNTIME_STATE_ENABLED)
        assert remaps(cl)[gpu] == before + 1                       # the reservation
        busy = in_child(_second_debugged_process, vega10)
        assert busy == ((0, c.DEBUG_RUNTIME_STATE_ENABLED_BUSY), errno.EPERM, 0, 0)
        assert errno_of(lambda: cl.suspend([])) == 0               # the holder is unaffected
        before = remaps(cl)[gpu]
        cl.dbg("DISABLE")
        assert remaps(cl)[gpu] == before + 1                       # the release
        assert in_child(_debugged_process, vega10) == (0, c.DEBUG_RUNTIME_STATE_ENABLED)
    finally:
        cl.close()


def _deferred_enable_faulting(sim):
    cl = Client(sim, runtime_enable=False)
    gpu = cl.gpus[0]
    before = remaps(cl)[gpu]
    err = enable_faulting(cl)
    return err, remaps(cl)[gpu] - before


def test_an_enable_undone_before_the_runtime_was_on_releases_no_vmid(vega10):
    """kfd_debug.c: kfd_dbg_trap_enable of a target whose runtime is off defers the activation (no
    VMID reserved); a runtime_info copy that faults then runs kfd_dbg_trap_deactivate(target, false,
    0), whose release_debug_trap_vmid finds dqm->trap_debug_vmid 0 and returns -EINVAL ("Trap debug
    id is not reserved") before unmapping: no remap (and debug_refresh_runlist unmaps nothing
    without per-VMID debugging)."""
    assert in_child(_deferred_enable_faulting, vega10) == (errno.EFAULT, 0)


def test_a_release_frees_the_devices_vmid_whoever_reserved_it(vega10):
    """kfd_device_queue_manager.c: release_debug_trap_vmid checks only dqm->trap_debug_vmid, not
    who reserved it: a process whose deferred ENABLE is undone (kfd_dbg_trap_enable's faulting copy,
    kfd_dbg_trap_deactivate) while another holds the VMID releases the holder's (one remap); the next
    process then reserves it, and the holder's own DISABLE later finds none reserved (no remap)."""
    cl = Client(vega10)
    gpu = cl.gpus[0]
    try:
        assert enable(cl) == (0, c.DEBUG_RUNTIME_STATE_ENABLED)
        assert in_child(_deferred_enable_faulting, vega10) == (errno.EFAULT, 1)
        assert in_child(_debugged_process, vega10) == (0, c.DEBUG_RUNTIME_STATE_ENABLED)
        before = remaps(cl)[gpu]
        cl.dbg("DISABLE")
        assert remaps(cl)[gpu] == before
    finally:
        cl.close()
