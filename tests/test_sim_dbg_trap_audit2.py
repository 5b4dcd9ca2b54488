"""DBG_TRAP and CRIU_OP against the Linux kernel's text (drivers/gpu/drm/amd/amdkfd/), where a
review found the simulator apart from it:

- kfd_debug.c: kfd_dbg_trap_enable (6.12.117): a runtime_info copy that faults
  undoes the enable (kfd_dbg_trap_deactivate, the debugger's count taken back, debug_trap_enabled
  false) and answers -EFAULT; debugger_process, set before by kfd_ioctl_set_debug_trap, stays.
- kfd_debug.c: kfd_dbg_trap_activate: per device, a debug VMID reserved (no per-VMID debugging) or
  a runlist refreshed (per-VMID HWS), each one remap; a MES device gets a set_shader_debugger call
  that unmaps nothing; a failed CU workaround returns before any device is touched.
- kfd_chardev.c: kfd_ioctl: CRIU_OP from another process is admitted for the ptrace parent of the
  fd's process, compared with the calling *thread* (`ptrace_parent(process->lead_thread) == current`).

The test process is the debugger (and, where it debugs itself, the target)."""
import ctypes
import errno
import os
import subprocess
import threading

import pytest

from kfdtool import errors
from kfdtool.cwsr import ptrace
from kfdtool.ioctls import constants as c
from kfdtool.ioctls import structs as s
from simhelpers import Client, errno_of

UNWRITABLE = 0x1000                       # a user address no region of the call covers


def enable_faulting(client):
    """ENABLE of this process with a runtime_info pointer the kernel cannot write: (errno, the
    rinfo_size written back)."""
    args = s.kfd_ioctl_dbg_trap_args(op=c.kfd_dbg_trap_operations.KFD_IOC_DBG_TRAP_ENABLE, pid=os.getpid())
    args.enable.dbg_fd, args.enable.rinfo_ptr, args.enable.rinfo_size = client.kfd.fd, UNWRITABLE, 8
    args.enable.exception_mask = c.KFD_EC_MASK(c.EC_QUEUE_NEW)
    try:
        client.kfd.ioctl("DBG_TRAP", args)
    except errors.KfdIoctlError as e:
        return e.errno, args.enable.rinfo_size
    return 0, args.enable.rinfo_size


def enable_with_runtime_info(client):
    info = s.kfd_runtime_info()
    client.dbg("ENABLE", "enable", dbg_fd=client.kfd.fd, rinfo_ptr=ctypes.addressof(info),
               rinfo_size=ctypes.sizeof(info))
    return info


def remaps(client):
    return {int(g): n for g, n in client.ctl("status")["remaps"].items()}


def kinds_of(client):
    """gpu_id -> "mes" (GC 11+), "per-vmid" (GC 9.4.2-9.5.0, HWS) or "global" (no per-VMID debugging)."""
    kinds = {}
    for node in client.rt.topology.for_each_gpu():
        v = node.gfx_target_version
        kinds[node.gpu_id] = ("mes" if v >= 110000 else
                              "per-vmid" if (v == 90010 or 90400 <= v <= 90500) else "global")
    return kinds


def delta(before, after, gpus):
    return {g: after[g] - before[g] for g in gpus}


# --- 1. ENABLE whose runtime_info copy faults is undone ------------------------------------------
def test_enable_whose_runtime_info_copy_faults_leaves_the_target_not_debug_enabled(client):
    """kfd_debug.c: kfd_dbg_trap_enable (6.12.117): copy_to_user of runtime_info fails ->
    kfd_dbg_trap_deactivate(target, false, 0), debug_trap_enabled = false, -EFAULT; the size is
    written back all the same. A later op finds the target not debug-enabled (-EINVAL, "not debug
    enabled for op"), a later ENABLE is not -EALREADY; the exception mask was never taken."""
    assert enable_faulting(client) == (errno.EFAULT, ctypes.sizeof(s.kfd_runtime_info))
    assert errno_of(lambda: client.dbg("QUERY_DEBUG_EVENT", "query_debug_event", exception_mask=0)) \
        == errno.EINVAL
    assert errno_of(lambda: client.snapshot()) == errno.EINVAL
    assert errno_of(lambda: client.dbg("DISABLE")) == errno.EINVAL
    client.enable_debug()                            # no EALREADY
    client.dbg("DISABLE")


@pytest.fixture
def composite(composite_612):
    cl = Client(composite_612)
    yield cl
    cl.close()


def test_the_unwind_deactivates_and_the_target_can_be_enabled_again_on_6_12(composite):
    """Linux 6.12.117 (the 1.17 profile), kfd_dbg_trap_enable on a runtime-enabled target: the
    activation (a remap on each non-MES device: debug VMID reserved or runlist refreshed), then on
    the faulting copy the full deactivation (kfd_dbg_trap_deactivate(target, false, 0): three
    refreshes of a per-VMID HWS device, a VMID release on one without per-VMID debugging, nothing
    unmapped on MES). The target is then not debug-enabled: -EINVAL for SUSPEND, ENABLE works."""
    cl = composite
    assert not cl.queues()
    kinds = kinds_of(cl)
    before = remaps(cl)
    assert enable_faulting(cl)[0] == errno.EFAULT
    expected = {"mes": 0, "per-vmid": 1 + 3, "global": 1 + 1}
    assert delta(before, remaps(cl), kinds) == {g: expected[k] for g, k in kinds.items()}
    assert errno_of(lambda: cl.suspend([0])) == errno.EINVAL
    cl.enable_debug()
    cl.dbg("DISABLE")


def _in_process_kernel(tmp_path, abi):
    from kfdtool.sim.kernel import SimKfd
    from kfdtool.sim.machine import DEFAULT_PARAMETERS, PROFILES, materialize
    root = tmp_path / f"mi308x-{abi}"
    materialize("mi308x", root, PROFILES[abi])
    return SimKfd(root, PROFILES[abi], dict(DEFAULT_PARAMETERS))


@pytest.mark.parametrize("abi", ["1.17", "1.23"])
def test_the_unwind_takes_the_debuggers_count_back_but_not_its_role(tmp_path, abi):
    """kfd_debug.c: kfd_dbg_trap_enable's unwind: atomic_dec of debugger_process's
    debugged_process_count (the debugger's exit then scans for nothing), debug_trap_enabled false;
    kfd_chardev.c: kfd_ioctl_set_debug_trap set target->debugger_process = p before the call and
    nothing clears it. The runtime state stays as it was."""
    from kfdtool.sim.errors import SimErrno
    from kfdtool.sim.memory import UserMemory
    kfd = _in_process_kernel(tmp_path, abi)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        debugger = kfd.open_process(os.getpid(), 0)
        target = kfd.open_process(sleeper.pid, 0)
        target.runtime_state = c.DEBUG_RUNTIME_STATE_ENABLED
        args = s.kfd_ioctl_dbg_trap_args(op=c.kfd_dbg_trap_operations.KFD_IOC_DBG_TRAP_ENABLE, pid=sleeper.pid)
        args.enable.dbg_fd, args.enable.rinfo_ptr, args.enable.rinfo_size = 0, UNWRITABLE, 8
        with pytest.raises(SimErrno) as refused:
            kfd.dbg.enable(debugger, target, args, UserMemory())
        assert refused.value.errno == errno.EFAULT
        assert not target.debug_trap_enabled and debugger.debugged_count == 0
        assert target.debugger is debugger
        assert target.runtime_state == c.DEBUG_RUNTIME_STATE_ENABLED
        args.enable.rinfo_ptr = 0
        args.enable.rinfo_size = 0                    # a copy of nothing: succeeds
        assert kfd.dbg.enable(debugger, target, args, UserMemory()) == 0
        assert target.debug_trap_enabled and debugger.debugged_count == 1
    finally:
        sleeper.kill()
        sleeper.wait()


# --- 2. activation remaps ------------------------------------------------------------------------
def test_activation_remaps_each_kind_of_device_as_the_kernel_does(composite):
    """kfd_debug.c: kfd_dbg_trap_activate (6.12.117) from ENABLE of a runtime-enabled target: a
    device without per-VMID debugging reserves the debug VMID (reserve_debug_trap_vmid: one unmap
    and map; its debug_refresh_runlist returns before unmapping), a per-VMID HWS device has its
    runlist refreshed once, a MES device takes kfd_dbg_set_mes_debug_mode (set_shader_debugger), which
    unmaps nothing."""
    cl = composite
    assert not cl.queues()
    kinds = kinds_of(cl)
    assert set(kinds.values()) == {"mes", "per-vmid", "global"}
    before = remaps(cl)
    info = enable_with_runtime_info(cl)
    try:
        assert info.runtime_state == c.DEBUG_RUNTIME_STATE_ENABLED
        expected = {"mes": 0, "per-vmid": 1, "global": 1}
        assert delta(before, remaps(cl), kinds) == {g: expected[k] for g, k in kinds.items()}
    finally:
        cl.dbg("DISABLE")


def test_a_failed_cu_workaround_refreshes_no_device(composite):
    """kfd_debug.c: kfd_dbg_trap_activate returns kfd_dbg_set_workaround's -EBUSY (a queue with a
    user CU mask on GC 11.0.0-11.0.3) before its per-device loop: runtime_state ENABLED_BUSY and no
    device reserved, refreshed or sent a MES call."""
    cl = composite
    kinds = kinds_of(cl)
    navi33 = next(n.gpu_id for n in cl.rt.topology.for_each_gpu() if n.gfx_target_version == 110002)
    qid = cl.rt.create_queue(navi33)
    try:
        mask = (ctypes.c_uint32 * 1)(0x3)
        cl.kfd.ioctl("SET_CU_MASK", s.kfd_ioctl_set_cu_mask_args(queue_id=qid, num_cu_mask=32,
                                                                 cu_mask_ptr=ctypes.addressof(mask)))
        before = remaps(cl)
        info = enable_with_runtime_info(cl)
        assert info.runtime_state == c.DEBUG_RUNTIME_STATE_ENABLED_BUSY
        assert delta(before, remaps(cl), kinds) == {g: 0 for g in kinds}
        cl.dbg("DISABLE")
    finally:
        cl.rt.destroy_queue(qid)


@pytest.mark.parametrize("abi", ["1.17", "1.23"])
def test_runtime_enable_of_a_debug_enabled_process_activates_it(tmp_path, abi):
    """kfd_chardev.c: runtime_enable: a debug-enabled process whose runtime comes on is activated
    there (kfd_dbg_trap_activate, deferred from ENABLE): on GC 9.4.3 under HWS (per-VMID debugging),
    one runlist refresh per device. Its ENABLE while the runtime was off refreshed nothing."""
    from kfdtool.sim.memory import UserMemory
    kfd = _in_process_kernel(tmp_path, abi)
    proc = kfd.open_process(os.getpid(), 0)
    assert proc.runtime_state == c.DEBUG_RUNTIME_STATE_DISABLED
    before = {g: d.remaps for g, d in kfd.devices.items()}
    args = s.kfd_ioctl_dbg_trap_args(op=c.kfd_dbg_trap_operations.KFD_IOC_DBG_TRAP_ENABLE, pid=os.getpid())
    args.enable.dbg_fd = 0
    assert kfd.dbg.enable(proc, proc, args, UserMemory()) == 0
    assert {g: d.remaps for g, d in kfd.devices.items()} == before
    proc.runtime_sema = 1                        # SEND_RUNTIME_EVENT already answered: no sleep
    on = s.kfd_ioctl_runtime_enable_args(0, c.KFD_RUNTIME_ENABLE_MODE_ENABLE_MASK, 0)
    assert kfd.dbg.runtime_enable(proc, on, UserMemory(), 0) == 0
    assert {g: d.remaps - before[g] for g, d in kfd.devices.items()} == {g: 1 for g in kfd.devices}


# --- 3. CRIU_OP's ptrace-parent admission is per thread ------------------------------------------
@pytest.fixture
def traced_by_a_thread():
    """A `sleep` traced by a thread of this process that is not its main thread: (its pid, the
    tracer thread's id), the thread kept alive (and tracing) until the test ends."""
    child = subprocess.Popen(["sleep", "60"])
    seized, done = threading.Event(), threading.Event()
    tid = {}

    def tracer():
        ptrace.seize(child.pid)
        tid["value"] = threading.get_native_id()
        seized.set()
        done.wait(60)
        ptrace.detach(child.pid)
    t = threading.Thread(target=tracer)
    t.start()
    try:
        assert seized.wait(10) and tid["value"] != os.getpid()
        assert ptrace.tracer_of(child.pid) == tid["value"]
        yield child.pid, tid["value"]
    finally:
        done.set()
        t.join(30)
        child.kill()
        child.wait()


def test_criu_op_admits_the_tracer_thread_and_not_its_process(tmp_path, traced_by_a_thread):
    """kfd_chardev.c: kfd_ioctl: a CHECKPOINT_RESTORE ioctl on another process's fd is admitted when
    ptrace_parent(process->lead_thread) == current, the calling thread: the thread that attached
    passes (then UNPAUSE of a process not paused is criu_unpause's -EINVAL, or -EACCES without
    CAP_CHECKPOINT_RESTORE), another thread of the same process, its main thread included, is
    -EBADF ("Using KFD FD in wrong process"), as is a thread id whose thread has been replaced (the
    start time differs)."""
    from kfdtool.pids import start_time
    from kfdtool.sim.memory import UserMemory
    victim, tracer = traced_by_a_thread
    me = os.getpid()
    kfd = _in_process_kernel(tmp_path, "1.23")
    proc = kfd.open_process(victim, 0)
    unpause = bytes(s.kfd_ioctl_criu_args(op=c.KFD_CRIU_OP_UNPAUSE))

    def criu_from(thread):
        kfd.dbg.calling_thread = thread
        try:
            return kfd.ioctl(proc, me, kfd.abi.request("CRIU_OP"), unpause, UserMemory(), os.getuid())[0]
        finally:
            kfd.dbg.calling_thread = None
    admitted = -errno.EINVAL if os.getuid() == 0 else -errno.EACCES
    assert criu_from((me, tracer, start_time(me, tracer))) == admitted
    assert criu_from((me, me, start_time(me, me))) == -errno.EBADF
    assert criu_from((me, tracer, start_time(me, tracer) - 1)) == -errno.EBADF
