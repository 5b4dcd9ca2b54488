"""More handlers the README calls exact, against the Linux kernel's rules: SET_XNACK_MODE,
PROFILER, CRIU pause/unpause and DBG_TRAP GET_DEVICE_SNAPSHOT. Each test names the
kernel file and function it follows (drivers/gpu/drm/amd/amdkfd/)."""
import ctypes
import errno
import os

import pytest

from kfdtool import errors
from kfdtool.ioctls import constants as c
from kfdtool.ioctls import structs as s
from simhelpers import Client, in_child

ROOT = os.geteuid() == 0          # the simulator takes the caller's uid from SO_PEERCRED


def _xnack_rules(sim):
    cl = Client(sim, runtime_enable=False)          # a new process: no queues yet
    cl.kfd.ioctl("SET_XNACK_MODE", s.kfd_ioctl_set_xnack_mode_args(0))
    query = s.kfd_ioctl_set_xnack_mode_args(-1)
    cl.kfd.ioctl("SET_XNACK_MODE", query)
    cl.rt.create_queue(cl.gpus[0])
    try:
        cl.kfd.ioctl("SET_XNACK_MODE", s.kfd_ioctl_set_xnack_mode_args(0))
        busy = None
    except errors.KfdIoctlError as e:
        busy = e.errno
    return query.xnack_enabled, busy


def test_set_xnack_mode_queries_with_a_negative_value_and_is_busy_once_queues_exist(sim):
    """kfd_chardev.c: kfd_ioctl_set_xnack_mode: xnack_enabled < 0 only reads the mode back;
    setting it while the process has any user queue is -EBUSY."""
    assert in_child(_xnack_rules, sim) == (0, errno.EBUSY)


def pmc(client, gpu, lock):
    client.kfd.ioctl("PROFILER", s.kfd_ioctl_profiler_args(op=c.KFD_IOC_PROFILER_PMC,
                                                           pmc=s.kfd_ioctl_pmc_settings(gpu, lock, 0)))


def _pmc_errno(sim, gpu, lock):
    try:
        pmc(Client(sim, runtime_enable=False), gpu, lock)
        return 0
    except errors.KfdIoctlError as e:
        return e.errno


def test_profiler_version_and_the_pmc_device_lock(client, sim):
    """kfd_chardev.c: kfd_ioctl_profiler: VERSION answers KFD_IOC_PROFILER_VERSION_NUM, an unknown
    op is -EINVAL; kfd_profiler_pmc needs perfmon_capable() (-EPERM), then profile_lock_device:
    lock 1 takes the device (-EALREADY if the caller holds it, -EBUSY if another process does),
    lock 0 frees it only for its holder, and every other case is -EINVAL."""
    version = s.kfd_ioctl_profiler_args(op=c.KFD_IOC_PROFILER_VERSION)
    client.kfd.ioctl("PROFILER", version)
    assert version.version == c.KFD_IOC_PROFILER_VERSION_NUM
    with pytest.raises(errors.InvalidArgument):
        client.kfd.ioctl("PROFILER", s.kfd_ioctl_profiler_args(op=7))
    gpu = client.gpus[0]
    if not ROOT:
        with pytest.raises(errors.PermissionDenied):
            pmc(client, gpu, 1)
        return
    pmc(client, gpu, 1)
    try:
        with pytest.raises(errors.AlreadyDebugged):           # EALREADY
            pmc(client, gpu, 1)
        assert in_child(_pmc_errno, sim, gpu, 1) == errno.EBUSY
        assert in_child(_pmc_errno, sim, gpu, 0) == errno.EINVAL
        with pytest.raises(errors.InvalidArgument):
            pmc(client, gpu, 2)
    finally:
        pmc(client, gpu, 0)
    with pytest.raises(errors.InvalidArgument):                # no longer the holder
        pmc(client, gpu, 0)
    assert in_child(_pmc_errno, sim, gpu, 1) == 0             # free for another process


def criu(client, op):
    args = s.kfd_ioctl_criu_args(op=op)
    client.kfd.ioctl("CRIU_OP", args)
    return args


def test_criu_process_info_pauses_and_unpause_restores(client):
    """kfd_chardev.c: criu_process_info evicts every queue (kfd_process_evict_queues), marks the
    process paused and reports its pid, devices, buffers and objects (queues + events + SVM
    ranges, criu_get_process_object_info); criu_unpause restores the queues, and -EINVAL when
    not paused. kfd_ioctl: without CAP_CHECKPOINT_RESTORE / CAP_SYS_ADMIN, -EACCES."""
    qid = client.rt.create_queue(client.gpus[0])
    if not ROOT:
        with pytest.raises(errors.PermissionDenied):
            criu(client, c.KFD_CRIU_OP_PROCESS_INFO)
        return
    event = s.kfd_ioctl_create_event_args(event_type=0)
    client.kfd.ioctl("CREATE_EVENT", event)
    try:
        info = criu(client, c.KFD_CRIU_OP_PROCESS_INFO)
        assert info.pid == os.getpid()
        assert info.num_devices == len(client.gpus)
        assert info.num_objects == len(client.queues()) + 1
        assert client.queues()[qid]["active"] is False
        criu(client, c.KFD_CRIU_OP_UNPAUSE)
        assert client.queues()[qid]["active"] is True
        with pytest.raises(errors.InvalidArgument):
            criu(client, c.KFD_CRIU_OP_UNPAUSE)
    finally:
        client.kfd.ioctl("DESTROY_EVENT", s.kfd_ioctl_destroy_event_args(event_id=event.event_id))


def device_snapshot(client, n, entry_size, buf_size=4096):
    buf = (ctypes.c_ubyte * buf_size)(*([0xEE] * buf_size))
    _, args = client.dbg("GET_DEVICE_SNAPSHOT", "device_snapshot", snapshot_buf_ptr=ctypes.addressof(buf),
                         num_devices=n, entry_size=entry_size)
    return args.device_snapshot, bytes(buf)


def test_device_snapshot_counts_cuts_the_entry_and_keeps_the_stride(client):
    """kfd_debug.c: kfd_dbg_trap_device_snapshot: num_devices becomes the target's device count,
    min(num_devices, count) entries are copied in the process's device order, each cut to
    min(entry_size, sizeof(kfd_dbg_device_info_entry)) at the caller's stride; entry_size 0 copies
    nothing and is no error; a NULL buffer is -EINVAL."""
    client.enable_debug()
    try:
        entry = ctypes.sizeof(s.kfd_dbg_device_info_entry)
        args, raw = device_snapshot(client, 2, entry + 8)
        assert (args.num_devices, args.entry_size) == (len(client.gpus), entry)
        ids = [s.kfd_dbg_device_info_entry.from_buffer_copy(raw, i * (entry + 8)).gpu_id for i in range(2)]
        assert ids == client.gpus[:2]
        assert raw[entry:entry + 8] == b"\xEE" * 8                    # the stride's gap is not written
        assert raw[2 * (entry + 8):3 * (entry + 8)] == b"\xEE" * (entry + 8)   # only 2 entries
        args, raw = device_snapshot(client, 2, 0)
        assert (args.num_devices, args.entry_size) == (len(client.gpus), 0)
        assert raw == b"\xEE" * 4096
        with pytest.raises(errors.InvalidArgument):
            client.dbg("GET_DEVICE_SNAPSHOT", "device_snapshot", snapshot_buf_ptr=0, num_devices=1, entry_size=entry)
    finally:
        client.dbg("DISABLE")
