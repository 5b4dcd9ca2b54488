"""The simulated KFD against the semantics in kfd-abi.md, through the same KfdDevice seam that
real hardware uses. The test process itself is the GPU process."""
import contextlib
import ctypes
import errno
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import ioctl_opt
import pytest

from kfdtool import errors
from kfdtool.ioctls import constants as c
from kfdtool.ioctls import structs as s
from kfdtool.ioctls.history import KfdAbi
from kfdtool.sim import runner
from simhelpers import Client, in_child, start


def test_get_version_follows_the_selected_abi(sim_dir):
    """kfd_chardev.c: kfd_ioctl_get_version answers KFD_IOCTL_MAJOR/MINOR_VERSION of the kernel's
    uapi header; kfd_ioctl answers -ENOTTY for an nr past AMDKFD_COMMAND_END (DBG_TRAP before 1.13)."""
    for name, abi in (("mi300x-cpx", "1.17"), ("composite", "1.11")):
        machine = start(name, abi)
        cl = Client(machine, runtime_enable=False)
        try:
            assert str(cl.kfd.abi) == abi
            if abi == "1.11":      # no debugger API below 1.13: the dispatcher answers ENOTTY
                with pytest.raises(errors.NotSupported):
                    cl.kfd.raw_ioctl(KfdAbi(23).request("DBG_TRAP"), s.kfd_ioctl_dbg_trap_args(), "DBG_TRAP")
        finally:
            cl.close()
            runner.stop(name)               # other tests start it with another ABI


def test_dispatcher_checks_only_the_nr(client):
    """kfd_chardev.c: kfd_ioctl looks the command up by _IOC_NR alone (type and size of the user's
    cmd are not compared), and an nr outside AMDKFD_COMMAND_START..END is -ENOTTY."""
    v = s.kfd_ioctl_get_version_args()
    wrong_type = ioctl_opt.IOR(ord("Z"), 0x01, s.kfd_ioctl_get_version_args)
    client.kfd.raw_ioctl(wrong_type, v)
    assert (v.major_version, v.minor_version) == (1, 23)
    for nr in (0x29, 0x87, 0x88):         # includes the seeds' PREEMPT_QUEUE/RESUME_QUEUE
        with pytest.raises(errors.NotSupported, match="no such ioctl"):
            client.kfd.raw_ioctl(ioctl_opt.IOWR(ord("K"), nr, ctypes.c_uint64 * 2), (ctypes.c_uint64 * 2)())


def test_old_88_byte_create_queue_still_works(client):
    """kfd_chardev.c: kfd_ioctl: usize < the kernel's size: the tail of kdata is zero-filled
    (sdma_engine_id = metadata_ring_size = 0), so an 88-byte CREATE_QUEUE still works."""
    rt = client.rt
    old = KfdAbi(16)
    client.kfd.abi = old
    try:
        qid = rt.create_queue(client.gpus[0])
    finally:
        client.kfd.abi = KfdAbi(23)
    assert qid in client.queues()


def test_argument_shorter_than_the_request_size_is_efault(client):
    """kfd_chardev.c: kfd_ioctl: copy_from_user of _IOC_SIZE(cmd) bytes fails -> -EFAULT before the
    handler runs, and nothing is copied back; the short bytes are not zero-padded. (The caller's
    memory past its argument is not the simulator's to read, so for it the copy faults.)"""
    qid = client.rt.create_queue(client.gpus[0])
    short = ctypes.c_uint32(qid)                      # DESTROY_QUEUE's queue_id alone, 4 of 8 bytes
    request = ioctl_opt.IOWR(ord("K"), 0x03, s.kfd_ioctl_destroy_queue_args)
    with pytest.raises(errors.BadAddress):
        client.kfd.raw_ioctl(request, short, "DESTROY_QUEUE")
    assert qid in client.queues()                     # the handler never ran
    version = s.kfd_ioctl_get_version_args()          # _IOR: nothing is copied in, any size works
    client.kfd.raw_ioctl(ioctl_opt.IOR(ord("K"), 0x01, ctypes.c_uint64 * 4), version, "GET_VERSION")
    assert version.major_version == 1


def test_fd_is_bound_to_the_opener(client):
    """kfd_chardev.c: kfd_ioctl: a process other than the fd's opener gets -EBADF."""
    pid = os.fork()
    if pid == 0:                          # the child reuses the parent's /dev/kfd connection
        try:
            client.kfd.ioctl("GET_VERSION", s.kfd_ioctl_get_version_args())
            os._exit(0)
        except errors.KfdIoctlError as e:
            os._exit(7 if e.errno == errno.EBADF else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 7


def test_queue_ids_are_lowest_free(client):
    """kfd_process_queue_manager.c: find_available_queue_slot takes the lowest free bit of the
    per-process bitmap; kfd_process.c: kfd_procfs_queue_show prints the kernel-internal queue
    type (KFD_QUEUE_TYPE_COMPUTE = 0) with no newline."""
    gpu = client.gpus[0]
    a, b, cq = (client.rt.create_queue(gpu) for _ in range(3))
    assert (a, b, cq) == (0, 1, 2)
    client.rt.destroy_queue(b)
    assert client.rt.create_queue(gpu) == 1
    types = sorted(os.listdir(client.sim.sysfs_root / f"class/kfd/kfd/proc/{os.getpid()}/queues"))
    assert types == ["0", "1", "2"]
    raw = (client.sim.sysfs_root / f"class/kfd/kfd/proc/{os.getpid()}/queues/0/type").read_bytes()
    assert raw == b"0"                      # no trailing newline, kernel-internal COMPUTE


@pytest.mark.parametrize("field,value,err", [
    ("queue_priority", 16, errno.EINVAL), ("queue_percentage", 101, errno.EINVAL),
    ("ring_size", 3000, errno.EINVAL), ("queue_type", 9, errors.ENOTSUPP), ("ctl_stack_size", 4096, errno.EINVAL),
    ("ring_base_address", 0xDEAD0000, errno.EINVAL), ("gpu_id", 1, errno.EINVAL),
    ("read_pointer_address", 1 << 48, errno.EFAULT)])
def test_create_queue_validation(client, field, value, err):
    """kfd_chardev.c: set_queue_properties_from_user (priority, percentage, ring size: -EINVAL;
    pointers failing access_ok: -EFAULT; bad queue_type: -ENOTSUPP) and kfd_ioctl_create_queue
    (unknown gpu_id: -EINVAL); kfd_queue.c: kfd_queue_acquire_buffers (ring not mapped,
    ctl_stack_size not the node's: -EINVAL)."""
    rt, gpu = client.rt, client.gpus[0]
    qid = rt.create_queue(gpu)
    good = {"ring_base_address": rt.queues[qid]["ring_base"]}
    args = s.kfd_ioctl_create_queue_args(
        ring_base_address=good["ring_base_address"], ring_size=1 << 20, gpu_id=gpu, queue_type=2,
        queue_percentage=100, queue_priority=7)
    # borrow the valid buffers of an existing queue, then break one field
    snap, buf = client_snapshot(client)
    args.read_pointer_address, args.write_pointer_address = snap["rptr"], snap["wptr"]
    args.ctx_save_restore_address, args.ctx_save_restore_size = snap["ctx"], snap["ctx_size"]
    args.ctl_stack_size = 8192
    setattr(args, field, value)
    with pytest.raises(errors.KfdIoctlError) as info:
        client.kfd.ioctl("CREATE_QUEUE", args)
    assert info.value.errno == err


def test_an_eop_buffer_given_must_be_one_mapping_of_at_least_the_nodes_size(client):
    """kfd_queue.c: kfd_queue_acquire_buffers: where eop_buffer_address is set, eop_buffer_size
    below the node's (4096 off Tonga) is -EINVAL, and so is an address that is not in the first
    page of a mapping of that size (kfd_queue_buffer_get compares page numbers: an address inside
    the mapping's first page, eop + 0x100, is taken). No EOP buffer at all is fine (libhsakmt's AQL
    queues on gfx9.4.x)."""
    rt, gpu = client.rt, client.gpus[0]
    qid = rt.create_queue(gpu)
    snap, buf = client_snapshot(client)
    eop = rt.alloc(gpu, 4096, map_to_gpu=True)
    two_pages = rt.alloc(gpu, 8192, map_to_gpu=True)

    def create(address, size):
        args = s.kfd_ioctl_create_queue_args(
            ring_base_address=rt.queues[qid]["ring_base"], ring_size=1 << 20, gpu_id=gpu, queue_type=2,
            queue_percentage=100, queue_priority=7, read_pointer_address=snap["rptr"],
            write_pointer_address=snap["wptr"], ctx_save_restore_address=snap["ctx"],
            ctx_save_restore_size=snap["ctx_size"], ctl_stack_size=8192,
            eop_buffer_address=address, eop_buffer_size=size)
        client.kfd.ioctl("CREATE_QUEUE", args)
        return args.queue_id
    for address, size in [(eop, 2048), (two_pages + 4096, 4096), (eop + (16 << 20), 4096), (eop, 8192)]:
        with pytest.raises(errors.KfdIoctlError) as info:
            create(address, size)
        assert info.value.errno == errno.EINVAL, (hex(address), size)
    for address in (eop, eop + 0x100):
        made = create(address, 4096)
        client.kfd.ioctl("DESTROY_QUEUE", s.kfd_ioctl_destroy_queue_args(queue_id=made))


@pytest.mark.parametrize("asked", [0, 512])
def test_a_ring_below_the_minimum_is_clamped_and_said(client, asked):
    """kfd_chardev.c: set_queue_properties_from_user clamps a ring_size below KFD_MIN_QUEUE_RING_SIZE
    to it (after the power-of-2-or-0 check) and CREATE_QUEUE copies the argument back: the caller
    reads 1024, and the queue's ring is 1024 bytes (a 4 KiB mapping)."""
    rt, gpu = client.rt, client.gpus[0]
    qid = rt.create_queue(gpu)
    snap, _ = client_snapshot(client)
    args = s.kfd_ioctl_create_queue_args(
        ring_base_address=rt.alloc(gpu, 4096, map_to_gpu=True), ring_size=asked, gpu_id=gpu, queue_type=2, queue_percentage=100,
        queue_priority=7, read_pointer_address=snap["rptr"], write_pointer_address=snap["wptr"],
        ctx_save_restore_address=snap["ctx"], ctx_save_restore_size=snap["ctx_size"],
        ctl_stack_size=8192)
    client.kfd.ioctl("CREATE_QUEUE", args)
    assert args.ring_size == c.KFD_MIN_QUEUE_RING_SIZE
    size = client.sim.sysfs_root / f"class/kfd/kfd/proc/{os.getpid()}/queues/{args.queue_id}/size"
    assert int(size.read_text()) == c.KFD_MIN_QUEUE_RING_SIZE
    client.kfd.ioctl("DESTROY_QUEUE", s.kfd_ioctl_destroy_queue_args(args.queue_id, 0))
    rt.destroy_queue(qid)


def test_queue_buffers_must_start_their_mapping(client):
    """kfd_queue.c: kfd_queue_buffer_get wants an address in the page where a mapping starts, and
    the mapping exactly the expected number of pages, unless that is under a page (then only the
    start is checked): a ring 4 KiB into an 8 KiB buffer is EINVAL at CREATE_QUEUE, and UPDATE_QUEUE with a
    ring size under a page (pqm_update_queue_properties passes it unaligned) accepts the queue's own
    larger ring."""
    rt, gpu = client.rt, client.gpus[0]
    qid = rt.create_queue(gpu)
    snap, _ = client_snapshot(client)
    buf = rt.alloc(gpu, 8192)
    args = s.kfd_ioctl_create_queue_args(
        ring_base_address=buf + 4096, ring_size=4096, gpu_id=gpu, queue_type=2, queue_percentage=100,
        queue_priority=7, read_pointer_address=snap["rptr"], write_pointer_address=snap["wptr"],
        ctx_save_restore_address=snap["ctx"], ctx_save_restore_size=snap["ctx_size"], ctl_stack_size=8192)
    with pytest.raises(errors.InvalidArgument):
        client.kfd.ioctl("CREATE_QUEUE", args)
    ring = rt.queues[qid]["ring_base"]
    client.kfd.ioctl("UPDATE_QUEUE", s.kfd_ioctl_update_queue_args(ring, qid, 0, 100, 7))   # 1024 after the clamp
    assert client.queues()[qid]["active"] is True
    with pytest.raises(errors.BadAddress):                # a whole page or more: the mapping's exact size
        client.kfd.ioctl("UPDATE_QUEUE", s.kfd_ioctl_update_queue_args(ring, qid, 8192, 100, 7))
    rt.destroy_queue(qid)


def test_create_queue_checks_the_ring_address_before_its_size(client):
    """set_queue_properties_from_user: access_ok of ring_base_address (EFAULT) comes before the
    power-of-2 check of ring_size (EINVAL)."""
    args = s.kfd_ioctl_create_queue_args(ring_base_address=1 << 48, ring_size=3000, gpu_id=client.gpus[0],
                                         queue_type=2, queue_percentage=100, queue_priority=7)
    with pytest.raises(errors.BadAddress):
        client.kfd.ioctl("CREATE_QUEUE", args)


def client_snapshot(client):
    client.enable_debug()
    try:
        args, buf = client.snapshot()
        entry = s.kfd_queue_snapshot_entry.from_buffer_copy(bytes(buf)[:64])
        return {"rptr": entry.read_pointer_address, "wptr": entry.write_pointer_address,
                "ctx": entry.ctx_save_restore_address, "ctx_size": entry.ctx_save_restore_area_size}, buf
    finally:
        client.dbg("DISABLE")


def test_update_queue_percentage_zero_deactivates(client):
    """kfd_chardev.c: kfd_ioctl_update_queue (percentage byte > 100: -EINVAL; bits 8-15 are
    pm4_target_xcc) and kfd_process_queue_manager.c: pqm_update_queue_properties (unknown qid,
    ring not the queue's mapping: -EFAULT); kfd_priv.h: QUEUE_IS_ACTIVE needs size, address and
    percentage all non-zero."""
    gpu = client.gpus[0]
    qid = client.rt.create_queue(gpu)
    ring, size = client.rt.queues[qid]["ring_base"], client.rt.queues[qid]["ring_size"]

    def update(pct, ring_base=ring, ring_size=size, queue_id=qid):
        client.kfd.ioctl("UPDATE_QUEUE", s.kfd_ioctl_update_queue_args(ring_base, queue_id, ring_size, pct, 7))
    update(0)
    assert client.queues()[qid]["active"] is False
    update(0x164)                         # 100% with pm4_target_xcc 1: bits 8-15 are not the percentage
    assert client.queues()[qid]["active"] is True
    update(256)                           # percent byte 0: inactive
    assert client.queues()[qid]["active"] is False
    update(100)
    assert client.queues()[qid]["active"] is True
    with pytest.raises(errors.InvalidArgument):
        update(101)
    with pytest.raises(errors.BadAddress, match="no such queue id"):
        update(100, queue_id=77)
    with pytest.raises(errors.BadAddress):
        update(100, ring_base=ring + 4096 * 1024 * 8)
    update(100, ring_base=0)              # a NULL ring deactivates too
    assert client.queues()[qid]["active"] is False


def _runtime_enable_rules(sim):
    cl = Client(sim, runtime_enable=False)
    cl.rt.create_queue(cl.gpus[0])
    with pytest.raises(errors.KfdIoctlError) as info:
        cl.kfd.ioctl("RUNTIME_ENABLE", s.kfd_ioctl_runtime_enable_args(0, 1, 0))
    assert info.value.errno == errno.EEXIST
    cl.enable_debug()
    with pytest.raises(errors.PermissionDenied, match="not runtime-enabled"):
        cl.suspend([0])
    return True


def test_runtime_enable_rules(sim):
    """kfd_chardev.c: runtime_enable: a process that already has queues gets -EEXIST; and
    kfd_ioctl_set_debug_trap: SUSPEND_QUEUES on a target not runtime-enabled is -EPERM."""
    assert in_child(_runtime_enable_rules, sim)


def test_runtime_enable_twice_is_busy(client):
    """kfd_chardev.c: runtime_enable: runtime_state not DISABLED -> -EBUSY."""
    with pytest.raises(errors.Busy):
        client.kfd.ioctl("RUNTIME_ENABLE", s.kfd_ioctl_runtime_enable_args(0, 1, 0))


def test_dbg_trap_permission_order(client):
    """kfd_chardev.c: kfd_ioctl_set_debug_trap: unknown pid -ESRCH; any op but ENABLE on a target
    not debug-enabled -EINVAL; kfd_debug.c: kfd_dbg_trap_enable: already enabled -EALREADY, an
    fd that fget cannot find -EBADF."""
    with pytest.raises(errors.ProcessNotFound):
        client.dbg("ENABLE", "enable", pid=999_999_9, dbg_fd=client.kfd.fd)
    with pytest.raises(errors.InvalidArgument, match="debugging is not enabled"):
        client.suspend([0])
    client.enable_debug()
    with pytest.raises(errors.AlreadyDebugged, match="rocgdb"):
        client.enable_debug()
    client.dbg("DISABLE")
    with pytest.raises(errors.KfdIoctlError) as info:
        client.dbg("ENABLE", "enable", dbg_fd=987)
    assert info.value.errno == errno.EBADF


def test_dbg_trap_other_process_needs_ptrace(client, sim):
    """kfd_chardev.c: kfd_ioctl_set_debug_trap: ENABLE of another process needs the caller to be
    its ptrace parent (ptrace_parent(target->lead_thread) != current) -> -EPERM."""
    from kfdtool.cli.sim_cmd import spawn_workload
    pid = spawn_workload("mi308x", "victim", queues=1, waves=10)
    try:
        with pytest.raises(errors.PermissionDenied, match="ptrace parent"):
            client.dbg("ENABLE", "enable", pid=pid, dbg_fd=client.kfd.fd)
    finally:
        os.kill(pid, 9)


def test_enable_by_the_ptrace_parent_makes_a_kfd_process_of_one_that_has_none(client, sim):
    """kfd_chardev.c: kfd_ioctl_set_debug_trap: for ENABLE by the target's ptrace parent the target's
    kfd_process is created (kfd_create_process) if it has none; anyone else gets -ESRCH. It then
    lives until the process exits, like any (its sysfs entry goes with it)."""
    from kfdtool.cwsr import ptrace
    from kfdtool.sysfs import SysfsRoot
    sleeper = subprocess.Popen(["sleep", "30"])
    entry = SysfsRoot(sim.sysfs_root).proc / str(sleeper.pid)
    try:
        with pytest.raises(errors.ProcessNotFound):
            client.dbg("ENABLE", "enable", pid=sleeper.pid, dbg_fd=client.kfd.fd)
        assert not entry.exists()
        ptrace.seize(sleeper.pid)
        try:
            client.dbg("ENABLE", "enable", pid=sleeper.pid, dbg_fd=client.kfd.fd)
        finally:
            ptrace.detach(sleeper.pid)
        assert entry.is_dir()
        client.dbg("DISABLE", pid=sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()
    deadline = time.monotonic() + 5
    while entry.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not entry.exists()


def test_suspend_status_words_and_new_queues(client):
    """kfd_device_queue_manager.c: suspend_queues / resume_queues: the return value counts queues
    handled; an id not found keeps KFD_DBG_QUEUE_INVALID_MASK (bit 31), a queue with
    EC_QUEUE_NEW pending is skipped and marked, an already suspended queue counts as success."""
    gpu = client.gpus[0]
    q0 = client.rt.create_queue(gpu)
    client.enable_debug()
    client.snapshot()                     # clears EC_QUEUE_NEW on q0
    q9 = None
    for _ in range(9):
        q9 = client.rt.create_queue(gpu)  # q9 is new: still carries EC_QUEUE_NEW
    assert q0 == 0 and q9 == 9
    client.rt.destroy_queue(5)
    ret, status = client.suspend([0, 5, 9])
    assert ret == 1 and status == [0x0, 0x80000005, 0x80000009]    # kfd-abi.md §2b example
    ret, status = client.suspend([0])
    assert ret == 1 and status == [0]     # already suspended counts as success
    ret, status = client.resume([0, 5])
    assert ret == 1 and status == [0, 0x80000005]
    ret, status = client.suspend([0, 0])  # a repeated id: only its first entry is answered
    assert ret == 1 and status == [0x0, 0x80000000]     # (q_array_get_index finds the first)
    ret, status = client.resume([0, 0])
    assert ret == 1 and status == [0x0, 0x80000000]
    client.dbg("DISABLE")


def test_a_redundant_suspend_or_resume_still_remaps_the_device(client):
    """kfd_device_queue_manager.c: suspend_single_queue and resume_single_queue answer 0 for a queue
    already in the asked state, suspend_queues / resume_queues count it, and a count above zero
    runs execute_queues_cpsch: the whole device is unmapped and mapped again all the same (every
    wave on it stalls). A queue skipped as new (EBUSY) is not counted: no remap for it alone."""
    gpu = client.gpus[0]

    def remaps():
        return client.ctl("status")["remaps"][str(gpu)]
    q0 = client.rt.create_queue(gpu)
    client.enable_debug()
    client.snapshot()
    q1 = client.rt.create_queue(gpu)                  # new: EC_QUEUE_NEW pending
    before = remaps()
    client.suspend([q0])
    assert remaps() == before + 1
    client.suspend([q0])                              # already suspended
    assert remaps() == before + 2
    client.suspend([q1])                              # new: skipped, nothing counted
    assert remaps() == before + 2
    client.resume([q0])
    client.resume([q0])                               # not suspended any more
    assert remaps() == before + 4
    # HWS clears the mask of every queue asked for once the device was remapped, the one skipped
    # as new included: with EC_QUEUE_NEW as the mask, q1 is suspendable at the next call
    client.suspend([q0, q1], exception_mask=c.KFD_EC_MASK(c.EC_QUEUE_NEW))
    assert client.suspend([q1])[0] == 1
    client.dbg("DISABLE")                             # (its own runlist refreshes are not counted here)
    at = remaps()
    client.enable_debug()                             # kfd_dbg_trap_activate: a remap of each of its devices
    assert remaps() == at + 1
    client.dbg("DISABLE")
    client.rt.destroy_queue(q1)


def test_on_mes_a_redundant_suspend_costs_nothing_and_a_new_queue_keeps_its_mark(sim_dir):
    """suspend_queues on MES (gfx11+): a counted queue goes straight into the total, with no runlist;
    only a queue actually removed costs a MES call (suspend_single_queue returns 0 first for one
    already suspended), and the exception mask is cleared only for counted queues (`if (!err)`)."""
    from kfdtool.topology import read_topology
    from simhelpers import Client
    sim = start("composite")
    mes = [g.gpu_id for g in read_topology(sim.sysfs_root).for_each_gpu() if g.gfx_target_version >= 110000]
    client = Client(sim)
    try:
        gpu = mes[0]

        def remaps():
            return client.ctl("status")["remaps"][str(gpu)]
        q0 = client.rt.create_queue(gpu)
        client.enable_debug()
        client.snapshot()
        q1 = client.rt.create_queue(gpu)
        before = remaps()
        assert client.suspend([q0])[0] == 1 and remaps() == before + 1
        assert client.suspend([q0])[0] == 1 and remaps() == before + 1         # already suspended: no MES call
        client.suspend([q0, q1], exception_mask=c.KFD_EC_MASK(c.EC_QUEUE_NEW))
        assert client.suspend([q1])[0] == 0                                    # still new: not cleared on MES
        client.dbg("DISABLE")
    finally:
        client.close()
        runner.stop("composite")          # other files start it with another ABI


def test_snapshot_size_negotiation_and_order(client):
    """kfd_process_queue_manager.c: pqm_get_queue_snapshot: num_queues 0 only counts,
    entry_size is cut to the kernel's entry (the user's stride is kept), entry_size 0 is -EINVAL,
    and the queue list is newest first (list_add in pqm_create_queue)."""
    gpu = client.gpus[0]
    for _ in range(3):
        client.rt.create_queue(gpu)
    client.enable_debug()
    args, _ = client.snapshot(n=0)
    assert args.num_queues == 3           # count-only query
    args, buf = client.snapshot(n=3, entry_size=100)
    assert args.entry_size == 64
    ids = [s.kfd_queue_snapshot_entry.from_buffer_copy(bytes(buf)[i * 100:i * 100 + 64]).queue_id for i in range(3)]
    assert ids == [2, 1, 0]               # newest first (list_add)
    with pytest.raises(errors.InvalidArgument):
        client.snapshot(n=3, entry_size=0)
    client.dbg("DISABLE")


def test_snapshot_error_paths_leave_what_the_kernel_leaves(client):
    """pqm_get_queue_snapshot zeroes the count before checking entry_size, cuts entry_size before
    the walk and clears a queue's exception bits before copying its entry, and kfd_ioctl copies the
    arguments back even on error: entry_size 0 answers EINVAL with num_queues 0; a buffer that
    cannot be written answers EFAULT with num_queues at the entries written before it, entry_size
    cut, and the newest queue's EC_QUEUE_NEW already cleared (the older one's kept)."""
    gpu = client.gpus[0]
    older, newest = client.rt.create_queue(gpu), client.rt.create_queue(gpu)
    client.enable_debug()
    new = c.KFD_EC_MASK(c.EC_QUEUE_NEW)
    args = s.kfd_ioctl_dbg_trap_args(op=c.kfd_dbg_trap_operations.KFD_IOC_DBG_TRAP_GET_QUEUE_SNAPSHOT,
                                     pid=os.getpid())
    args.queue_snapshot.num_queues, args.queue_snapshot.entry_size = 5, 0
    with pytest.raises(errors.InvalidArgument):
        client.kfd.ioctl("DBG_TRAP", args)
    assert args.queue_snapshot.num_queues == 0
    args.queue_snapshot.snapshot_buf_ptr = 0x1000          # no user memory there
    args.queue_snapshot.num_queues, args.queue_snapshot.entry_size = 2, 100
    args.queue_snapshot.exception_mask = new
    with pytest.raises(errors.BadAddress):
        client.kfd.ioctl("DBG_TRAP", args)
    assert (args.queue_snapshot.num_queues, args.queue_snapshot.entry_size) == (0, 64)
    snap, buf = client.snapshot(n=2, clear_new=False)
    status = {e.queue_id: e.exception_status for e in (s.kfd_queue_snapshot_entry.from_buffer_copy(
        bytes(buf)[i * 64:(i + 1) * 64]) for i in range(2))}
    assert status == {newest: 0, older: new}
    client.dbg("DISABLE")


def test_wave_state_rules(client):
    """kfd_process_queue_manager.c: pqm_get_wave_state (unknown qid -EFAULT) and
    kfd_device_queue_manager.c: get_wave_state (-EINVAL unless an inactive compute queue with
    CWSR); kfd_debug.c: kfd_dbg_trap_disable resumes every suspended queue."""
    gpu = client.gpus[0]
    qid = client.rt.create_queue(gpu)
    sdma = client.rt.create_queue(gpu, c.KFD_IOC_QUEUE_TYPE_SDMA, ring_size=1 << 16)
    client.ctl("set_waves", pid=os.getpid(), qid=qid, waves=300)
    ctx = client.rt.queues[qid]["ctx_save_restore_address"]
    ws = s.kfd_ioctl_get_queue_wave_state_args(ctl_stack_address=ctx, queue_id=qid)
    with pytest.raises(errors.InvalidArgument, match="inactive compute"):
        client.kfd.ioctl("GET_QUEUE_WAVE_STATE", ws)          # active
    client.enable_debug()
    client.snapshot()
    assert client.suspend([qid, sdma])[0] == 2
    client.kfd.ioctl("GET_QUEUE_WAVE_STATE", ws)
    assert ws.save_area_used_size > 0 and 0 < ws.ctl_stack_used_size <= 8192
    with pytest.raises(errors.InvalidArgument):
        client.kfd.ioctl("GET_QUEUE_WAVE_STATE", s.kfd_ioctl_get_queue_wave_state_args(ctl_stack_address=ctx,
                                                                                       queue_id=sdma))
    with pytest.raises(errors.BadAddress):
        client.kfd.ioctl("GET_QUEUE_WAVE_STATE", s.kfd_ioctl_get_queue_wave_state_args(ctl_stack_address=ctx,
                                                                                       queue_id=99))
    client.dbg("DISABLE")                 # resumes everything
    assert all(q["active"] for q in client.queues().values())


def test_suspend_stops_progress_resume_restarts_it(client):
    """kfd_device_queue_manager.c: suspend_single_queue unmaps the queue (no progress while
    suspended), resume_single_queue maps it again."""
    qid = client.rt.create_queue(client.gpus[0])
    client.ctl("set_waves", pid=os.getpid(), waves=200)
    client.enable_debug()
    client.snapshot()
    client.suspend([qid])
    p1 = client.queues()[qid]["progress_ns"]
    time.sleep(0.05)
    assert client.queues()[qid]["progress_ns"] == p1
    client.resume([qid])
    time.sleep(0.05)
    assert client.queues()[qid]["progress_ns"] > p1
    client.dbg("DISABLE")


def test_destroy_of_suspended_queue_blocks_until_resume(client):
    """kfd_device_queue_manager.c: destroy_queue_cpsch: a suspended queue of a debugged process
    waits (wait_event on the process's qpd) until the debugger resumes it; pqm_destroy_queue removes
    its procfs entry only once that has returned (kfd_procfs_del_queue after dqm's destroy_queue,
    6.12 on), so sysfs lists it meanwhile, and not after."""
    qid = client.rt.create_queue(client.gpus[0])
    client.enable_debug()
    client.snapshot()
    client.suspend([qid])
    done = threading.Event()

    def destroy():
        client.kfd.ioctl("DESTROY_QUEUE", s.kfd_ioctl_destroy_queue_args(qid, 0))
        done.set()
    t = threading.Thread(target=destroy)
    t.start()
    assert not done.wait(0.3)             # sleeping in the kernel
    queues = client.sim.sysfs_root / f"class/kfd/kfd/proc/{os.getpid()}/queues"
    assert str(qid) in os.listdir(queues)              # still listed while the destroy sleeps
    client.resume([qid])
    assert done.wait(5)
    t.join()
    assert str(qid) not in os.listdir(queues)
    client.rt.queues.pop(qid)
    assert qid not in client.queues()
    client.dbg("DISABLE")


RUNTIME = c.KFD_EC_MASK(c.EC_PROCESS_RUNTIME)
RUNTIME_OFF, RUNTIME_ON = 0, c.KFD_RUNTIME_ENABLE_MODE_ENABLE_MASK


@contextlib.contextmanager
def runtime_call_on_a_thread(client, mode):
    """RUNTIME_ENABLE(mode) from a thread of this process; yields the Event set once it returns.
    Never leaves the thread asleep in the server: answered at the end if it still sleeps."""
    returned = threading.Event()

    def call():
        client.kfd.ioctl("RUNTIME_ENABLE", s.kfd_ioctl_runtime_enable_args(0, mode, 0))
        returned.set()
    t = threading.Thread(target=call)
    t.start()
    try:
        yield returned
    finally:
        if not returned.is_set():
            client.dbg("SEND_RUNTIME_EVENT", "send_runtime_event", exception_mask=RUNTIME)
        t.join(5)


def test_a_debugged_process_turning_its_runtime_off_is_resumed_and_waits_for_its_debugger(client):
    """kfd_chardev.c: runtime_disable (hsaKmtRuntimeDisable, which ROCr calls in hsa_shut_down):
    with a debugger attached, kfd_dbg_trap_deactivate resumes every suspended queue,
    EC_PROCESS_RUNTIME is raised (a process event, reported by QUERY_DEBUG_EVENT once enabled),
    and the call sleeps on runtime_enable_sema until the debugger's SEND_RUNTIME_EVENT
    (kfd_dbg_send_exception_to_runtime ups it). A debugger that never answers leaves the
    process asleep there: the xsched-lv3 daemon answers (lv3.py)."""
    qid = client.rt.create_queue(client.gpus[0])
    client.enable_debug()
    client.dbg("SET_EXCEPTIONS_ENABLED", "set_exceptions_enabled", exception_mask=RUNTIME)
    client.snapshot()
    client.suspend([qid])
    assert client.queues()[qid]["suspended"]
    try:
        with runtime_call_on_a_thread(client, RUNTIME_OFF) as returned:
            assert not returned.wait(0.3)                 # asleep in the kernel
            assert not client.queues()[qid]["suspended"]  # the deactivation resumed it
            _, args = client.dbg("QUERY_DEBUG_EVENT", "query_debug_event", exception_mask=RUNTIME)
            event = args.query_debug_event
            assert event.exception_mask & RUNTIME and (event.queue_id, event.gpu_id) == (0, 0)
            with pytest.raises(errors.Busy):              # reported once: the query cleared it
                client.dbg("QUERY_DEBUG_EVENT", "query_debug_event", exception_mask=RUNTIME)
            with pytest.raises(errors.PermissionDenied):  # its runtime is off: no more suspends
                client.suspend([qid])
            client.dbg("SEND_RUNTIME_EVENT", "send_runtime_event", exception_mask=RUNTIME)
            assert returned.wait(5)
    finally:
        client.dbg("DISABLE")
        client.rt.destroy_queue(qid)
        client.kfd.ioctl("RUNTIME_ENABLE", s.kfd_ioctl_runtime_enable_args(0, RUNTIME_ON, 0))   # as other tests expect


def test_disable_does_not_wake_a_process_asleep_in_its_runtime_call_and_clears_the_event(client):
    """kfd_debug.c: kfd_dbg_trap_disable clears every pending exception (kfd_dbg_clean_exception_status)
    and does not up runtime_enable_sema: a debugger that lets go without answering leaves the
    process asleep, and the next one finds no event to answer (only SEND_RUNTIME_EVENT wakes it)."""
    client.enable_debug()
    try:
        with runtime_call_on_a_thread(client, RUNTIME_OFF) as returned:
            assert not returned.wait(0.3)
            client.dbg("DISABLE")
            assert not returned.wait(0.3)                 # still asleep
            client.enable_debug()
            client.dbg("SET_EXCEPTIONS_ENABLED", "set_exceptions_enabled", exception_mask=RUNTIME)
            with pytest.raises(errors.Busy):              # the event went with the old debugger
                client.dbg("QUERY_DEBUG_EVENT", "query_debug_event", exception_mask=RUNTIME)
            client.dbg("SEND_RUNTIME_EVENT", "send_runtime_event", exception_mask=RUNTIME)
            assert returned.wait(5)
    finally:
        client.dbg("DISABLE")
        client.kfd.ioctl("RUNTIME_ENABLE", s.kfd_ioctl_runtime_enable_args(0, RUNTIME_ON, 0))   # as other tests expect


def test_a_debugged_process_turning_its_runtime_on_waits_for_its_debugger(client):
    """kfd_chardev.c: runtime_enable: a process already debug-enabled raises EC_PROCESS_RUNTIME
    and sleeps until the debugger answers, like runtime_disable."""
    client.kfd.ioctl("RUNTIME_ENABLE", s.kfd_ioctl_runtime_enable_args(0, RUNTIME_OFF, 0))   # not debugged: returns
    client.enable_debug()
    try:
        with runtime_call_on_a_thread(client, RUNTIME_ON) as returned:
            assert not returned.wait(0.3)
            client.dbg("SEND_RUNTIME_EVENT", "send_runtime_event", exception_mask=RUNTIME)
            assert returned.wait(5)
    finally:
        client.dbg("DISABLE")


def test_a_runtime_turned_off_under_a_debugger_loses_its_debug_flags(client):
    """kfd_debug.c: kfd_dbg_trap_deactivate sets the debug flags to 0 (kfd_dbg_trap_set_flags), so
    after the runtime went off and on again SET_FLAGS reports 0 as the previous flags."""
    client.enable_debug()
    try:
        client.dbg("SET_FLAGS", "set_flags", flags=1)
        for mode in (RUNTIME_OFF, RUNTIME_ON):
            with runtime_call_on_a_thread(client, mode) as returned:
                assert not returned.wait(0.3)
                client.dbg("SEND_RUNTIME_EVENT", "send_runtime_event", exception_mask=RUNTIME)
                assert returned.wait(5)
        _, args = client.dbg("SET_FLAGS", "set_flags", flags=0)
        assert args.set_flags.flags == 0
    finally:
        client.dbg("DISABLE")


def test_destroying_a_queue_of_a_debugged_process_raises_a_device_event(client):
    """kfd_device_queue_manager.c: destroy_queue_cpsch raises EC_DEVICE_QUEUE_DELETE (a device
    exception: kfd_dbg_ev_raise sets it on the queue's device); kfd_dbg_ev_query_debug_event reports
    device events after queue events, with that device's gpu_id and queue_id 0, once."""
    gpu = client.gpus[0]
    delete = c.KFD_EC_MASK(c.EC_DEVICE_QUEUE_DELETE)
    qid = client.rt.create_queue(gpu)
    client.enable_debug()
    try:
        client.dbg("SET_EXCEPTIONS_ENABLED", "set_exceptions_enabled", exception_mask=delete)
        client.rt.destroy_queue(qid)
        _, args = client.dbg("QUERY_DEBUG_EVENT", "query_debug_event", exception_mask=delete)
        event = args.query_debug_event
        assert event.exception_mask & delete and (event.gpu_id, event.queue_id) == (gpu, 0)
        with pytest.raises(errors.Busy):                  # cleared by the query
            client.dbg("QUERY_DEBUG_EVENT", "query_debug_event", exception_mask=delete)
        # GET_DEVICE_SNAPSHOT shows a device's status and clears what it is asked to, before the copy
        client.rt.destroy_queue(client.rt.create_queue(gpu))
        assert device_status(client, gpu) == delete       # mask 0: shown, kept
        assert device_status(client, gpu, clear=delete) == delete
        assert device_status(client, gpu) == 0
        client.rt.destroy_queue(client.rt.create_queue(gpu))
        client.dbg("DISABLE")                             # kfd_dbg_clean_exception_status: gone too
        client.enable_debug()
        client.dbg("SET_EXCEPTIONS_ENABLED", "set_exceptions_enabled", exception_mask=delete)
        with pytest.raises(errors.Busy):
            client.dbg("QUERY_DEBUG_EVENT", "query_debug_event", exception_mask=delete)
    finally:
        client.dbg("DISABLE")
    client.rt.destroy_queue(client.rt.create_queue(gpu))  # not debugged: kfd_dbg_ev_raise raises nothing
    client.enable_debug()
    try:
        client.dbg("SET_EXCEPTIONS_ENABLED", "set_exceptions_enabled", exception_mask=delete)
        with pytest.raises(errors.Busy):
            client.dbg("QUERY_DEBUG_EVENT", "query_debug_event", exception_mask=delete)
    finally:
        client.dbg("DISABLE")


def device_status(client, gpu, clear=0):
    """The exception status GET_DEVICE_SNAPSHOT reports for `gpu` (clearing `clear`)."""
    entry = s.kfd_dbg_device_info_entry
    buf = (entry * 16)()
    _, args = client.dbg("GET_DEVICE_SNAPSHOT", "device_snapshot", snapshot_buf_ptr=ctypes.addressof(buf),
                         num_devices=16, entry_size=ctypes.sizeof(entry), exception_mask=clear)
    return next(e.exception_status for e in buf[:args.device_snapshot.num_devices] if e.gpu_id == gpu)


def test_sched_policy_2_refuses_debugger(sim_dir):
    """kfd_chardev.c: kfd_ioctl_set_debug_trap refuses every op without HWS. The Vega10 capture
    predates gfx_target_version in sysfs; gfx900 is SOC15 (kfd_debug.c: kfd_dbg_trap_enable
    refuses only pre-gfx9), so ENABLE works until sched_policy is 2."""
    machine = start("vega10", "1.23")
    cl = Client(machine)
    try:
        assert cl.rt.topology.find_gpu(cl.gpus[0]).gfx_target_version == 90000
        cl.enable_debug()
        cl.dbg("DISABLE")
        cl.ctl("set_param", name="sched_policy", value=2)
        with pytest.raises(errors.InvalidArgument, match="sched_policy=2"):
            cl.enable_debug()
    finally:
        cl.ctl("set_param", name="sched_policy", value=0)
        cl.close()


def test_smi_events_eviction_and_restore(client):
    """kfd_smi_events.c: kfd_smi_event_queue_eviction / kfd_smi_event_queue_restore write
    "9 <ns> -<pid> <gpu> <trigger>" and "a <ns> -<pid> <gpu> 0" records, in that order;
    kfd_smi_ev_read of an empty fifo is -EAGAIN; kfd_chardev.c: kfd_ioctl_smi_events refuses a
    gpuid the process has no device for (-EINVAL)."""
    import fcntl
    gpu = client.gpus[0]
    client.rt.create_queue(gpu)
    fd = client.open_smi(gpu, c.KFD_SMI_EVENT_QUEUE_EVICTION, c.KFD_SMI_EVENT_QUEUE_RESTORE)
    with pytest.raises(BlockingIOError):
        os.read(fd, 4096)                 # empty fifo: EAGAIN
    client.ctl("evict", pid=os.getpid(), trigger=2)
    client.ctl("restore", pid=os.getpid())
    time.sleep(0.05)
    text = b"".join(iter(lambda: _read_or_empty(fd), b"")).decode()
    lines = [ln for ln in text.splitlines() if f" {gpu:x} " in ln]
    assert lines[0].startswith("9 ") and lines[0].endswith(f" -{os.getpid()} {gpu:x} 2")
    assert lines[1].startswith("a ") and lines[1].endswith(f" -{os.getpid()} {gpu:x} 0")
    assert fcntl.fcntl(fd, fcntl.F_GETFD) >= 0
    os.close(fd)
    with pytest.raises(errors.InvalidArgument):
        client.kfd.ioctl("SMI_EVENTS", s.kfd_ioctl_smi_events_args(gpuid=12345678))


def _read_or_empty(fd):
    try:
        return os.read(fd, 8192)
    except BlockingIOError:
        return b""


def test_enable_whose_runtime_info_copy_faults_is_undone(client):
    """kfd_debug.c: kfd_dbg_trap_enable (6.12.117) sets debug_trap_enabled before copying
    runtime_info out; a copy that faults undoes the enable (kfd_dbg_trap_deactivate, the debugger's
    count taken back, debug_trap_enabled false) and answers EFAULT, and the size is written back
    all the same. The target is not debug-enabled: DISABLE is EINVAL ("not debug enabled"), a
    second ENABLE is not EALREADY."""
    args = s.kfd_ioctl_dbg_trap_args(op=c.kfd_dbg_trap_operations.KFD_IOC_DBG_TRAP_ENABLE, pid=os.getpid())
    args.enable.dbg_fd, args.enable.rinfo_ptr, args.enable.rinfo_size = client.kfd.fd, 0x1000, 8
    args.enable.exception_mask = c.KFD_EC_MASK(c.EC_QUEUE_NEW)
    with pytest.raises(errors.BadAddress):
        client.kfd.ioctl("DBG_TRAP", args)
    assert args.enable.rinfo_size == ctypes.sizeof(s.kfd_runtime_info)
    with pytest.raises(errors.InvalidArgument):
        client.dbg("DISABLE")
    client.enable_debug()                             # not debug-enabled: enables again
    client.dbg("DISABLE")


def test_runlist_updates_follow_whether_a_queue_is_mapped(client, sim):
    """kfd_device_queue_manager.c (HWS): create_queue_cpsch and destroy_queue_cpsch run
    execute_queues_cpsch only for an active queue; process_termination_cpsch runs it once per
    device of an exiting process, whatever its queues were."""
    from kfdtool.cli.sim_cmd import spawn_workload
    gpu = client.gpus[0]

    def remaps(on=gpu):
        return client.ctl("status")["remaps"][str(on)]
    before = remaps()
    qid = client.rt.create_queue(gpu)                 # active: mapped
    assert remaps() == before + 1
    q = client.rt.queues[qid]
    client.kfd.ioctl("UPDATE_QUEUE", s.kfd_ioctl_update_queue_args(q["ring_base"], qid, q["ring_size"], 0, 7))
    inactive = remaps()
    client.rt.destroy_queue(qid)                      # not mapped: no runlist update
    assert remaps() == inactive
    client.ctl("evict", pid=os.getpid())              # a queue created while evicted is not mapped either
    evicted = remaps()
    qid = client.rt.create_queue(gpu)
    assert remaps() == evicted
    client.ctl("restore", pid=os.getpid())
    client.rt.destroy_queue(qid)
    pid = spawn_workload("mi308x", "exiting", queues=1)
    proc_dir = sim.sysfs_root / f"class/kfd/kfd/proc/{pid}"
    its_gpu = int((proc_dir / "queues" / os.listdir(proc_dir / "queues")[0] / "gpuid").read_text())
    at_exit = remaps(its_gpu)
    os.kill(pid, 9)
    deadline = time.monotonic() + 5
    while proc_dir.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert remaps(its_gpu) == at_exit + 1


def test_process_exit_removes_proc_entry(sim):
    from kfdtool.cli.sim_cmd import spawn_workload
    pid = spawn_workload("mi308x", "short-lived", queues=2)
    proc_dir = sim.sysfs_root / f"class/kfd/kfd/proc/{pid}"
    assert len(os.listdir(proc_dir / "queues")) == 2
    os.kill(pid, 9)
    os.waitpid(pid, 0) if False else None
    deadline = time.monotonic() + 5
    while proc_dir.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not proc_dir.exists()


NOBODY = 65534
CONTROL_AS_NOBODY = """
import json, socket, struct, sys
LEN = struct.Struct({len_fmt!r})
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
out = []
for op in ({ops}):
    body = b"C" + json.dumps(op).encode()
    s.sendall(LEN.pack(len(body)) + body)
    head = s.recv(LEN.size, socket.MSG_WAITALL)
    reply = s.recv(LEN.unpack(head)[0], socket.MSG_WAITALL)
    out.append(json.loads(reply[1:]))
print(json.dumps(out))
"""


SYSTEM_PYTHON = "/usr/bin/python3"          # the other user cannot run a Python under /root


@pytest.mark.skipif(os.geteuid() != 0 or not os.access(SYSTEM_PYTHON, os.X_OK),
                    reason="drops to another uid: needs root and a system Python")
def test_control_channel_belongs_to_the_machines_owner(sim_dir):
    """Any user may open the simulated /dev/kfd, only the owner (or root) may steer the simulation."""
    from kfdtool.sim.protocol import LEN
    machine = start("mi210")
    for d in [machine.dir, *machine.dir.parents]:           # let the other user reach the socket
        if d == Path("/"):
            break
        d.chmod(d.stat().st_mode | 0o001)
    ops = [{"op": "status"}, {"op": "adopt", "pid": 1, "uid": 0}, {"op": "shutdown"}]
    code = CONTROL_AS_NOBODY.format(len_fmt=LEN.format, ops=", ".join(map(repr, ops)))
    child = subprocess.run([SYSTEM_PYTHON, "-c", code, str(machine.socket)], capture_output=True, text=True,
                           timeout=30, preexec_fn=lambda: (os.setgid(NOBODY), os.setuid(NOBODY)), cwd="/")
    assert child.returncode == 0, child.stderr
    replies = json.loads(child.stdout)
    assert all("permission denied" in r.get("error", "") for r in replies)
    with machine.control() as ctl:                          # still running, nothing adopted
        assert 1 not in ctl("status")["processes"]
