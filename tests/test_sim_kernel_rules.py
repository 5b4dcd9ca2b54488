"""The simulated KFD against the Linux kernel's own rules, one test per rule, each naming the
kernel file and function it follows (drivers/gpu/drm/amd/amdkfd/). The test process is the GPU
process; children are separate processes, as a tester writing cases from the kernel source
would run them."""
import ctypes
import errno
import mmap
import os
import select
import socket
import threading
import time

import ioctl_opt
import pytest

from kfdtool import errors
from kfdtool.ioctls import constants as c
from kfdtool.ioctls import structs as s
from kfdtool.ioctls.requests import BY_NAME
from kfdtool.sim.workload import save_area_sizes
from simhelpers import Client, in_child

EVICTION = c.KFD_SMI_EVENT_QUEUE_EVICTION
RESTORE = c.KFD_SMI_EVENT_QUEUE_RESTORE


def mask_of(*events):
    return sum(c.KFD_SMI_EVENT_MASK_FROM_INDEX(e) for e in events).to_bytes(8, "little")


def evict_and_restore(client, times=1):
    for _ in range(times):
        client.ctl("evict", pid=os.getpid(), trigger=2)
        client.ctl("restore", pid=os.getpid())


def settle():
    time.sleep(0.05)                      # SMI writes reach the simulator asynchronously


def read_all(fd):
    out = b""
    while True:
        try:
            chunk = os.read(fd, 8192)
        except BlockingIOError:
            return out
        out += chunk


# --- kfd_smi_events.c ----------------------------------------------------------------------------

def test_smi_read_of_empty_fifo_is_eagain_even_when_blocking(client):
    """kfd_smi_events.c: kfd_smi_ev_read returns -EAGAIN when the fifo is empty, whatever
    O_NONBLOCK says."""
    fd = client.open_smi(client.gpus[0], EVICTION)
    try:
        os.set_blocking(fd, True)
        t0 = time.monotonic()
        with pytest.raises(BlockingIOError):
            os.read(fd, 4096)
        assert time.monotonic() - t0 < 0.5
    finally:
        os.close(fd)


def test_smi_write_takes_the_first_8_bytes_and_ignores_short_writes(client):
    """kfd_smi_events.c: kfd_smi_ev_write: fewer than 8 bytes is -EFAULT (mask unchanged);
    otherwise the mask is the first 8 bytes (the rest is not consumed)."""
    client.rt.create_queue(client.gpus[0])
    fd = client.open_smi(client.gpus[0])              # mask 0
    try:
        os.write(fd, mask_of(EVICTION) + bytes(8))    # 16 bytes: the first 8 count
        settle()
        os.write(fd, b"\0\0\0\0")                     # short: must not clear the mask
        settle()
        evict_and_restore(client)
        settle()
        kinds = [line.split()[0] for line in read_all(fd).decode().splitlines()]
        assert kinds and set(kinds) == {"9"}          # evictions only, restores were not asked for
        os.write(fd, bytes(8) + mask_of(EVICTION))    # first 8 bytes zero: nothing enabled
        settle()
        evict_and_restore(client)
        settle()
        assert read_all(fd) == b""
    finally:
        os.close(fd)


def event_kinds(fd):
    return {line.split()[0] for line in read_all(fd).decode().splitlines()}


def test_smi_back_to_back_mask_writes_each_replace_the_mask(client):
    """kfd_smi_events.c: kfd_smi_ev_write: every write() is handled alone and replaces the mask,
    so of two writes made without a pause the second one counts."""
    client.rt.create_queue(client.gpus[0])
    fd = client.open_smi(client.gpus[0], EVICTION)
    try:
        os.write(fd, bytes(8))
        os.write(fd, mask_of(EVICTION, RESTORE))
        settle()
        evict_and_restore(client)
        settle()
        assert event_kinds(fd) == {"9", "a"}
    finally:
        os.close(fd)


def test_smi_short_write_is_not_spliced_into_the_next(client):
    """kfd_smi_events.c: kfd_smi_ev_write: a write shorter than 8 bytes fails (-EFAULT) and is
    gone; the next 8-byte write alone sets the mask (its bytes are not shifted by the short one)."""
    client.rt.create_queue(client.gpus[0])
    fd = client.open_smi(client.gpus[0])
    try:
        os.write(fd, b"\0\0\0\0")
        os.write(fd, mask_of(EVICTION))
        os.write(fd, b"")                 # nothing: neither a mask nor the end of the fd
        settle()
        evict_and_restore(client)
        settle()
        assert event_kinds(fd) == {"9"}
    finally:
        os.close(fd)


def test_smi_fifo_keeps_whole_records_up_to_8k(client):
    """kfd_smi_events.c: add_event_to_kfifo puts a record in only if all of it fits
    (kfifo_avail >= len), in a MAX_KFIFO_SIZE fifo; a reader that falls behind loses whole
    records, never parts."""
    client.rt.create_queue(client.gpus[0])
    fd = client.open_smi(client.gpus[0], EVICTION, RESTORE)
    try:
        evict_and_restore(client, times=160)          # ~11 KB of records, nobody reading
        settle()
        data = read_all(fd)
        assert 8192 - 96 < len(data) <= 8192
        lines = data.decode().split("\n")
        assert lines[-1] == ""                        # ends on a record boundary
        assert all(ln.split()[0] in ("9", "a") and ln.split()[2] == f"-{os.getpid()}" for ln in lines[:-1])
        evict_and_restore(client)                     # room again: new records arrive
        settle()
        assert read_all(fd).count(b"\n") == 2
    finally:
        os.close(fd)


def test_smi_poll_reports_input_only_when_the_fifo_has_data(client):
    """kfd_smi_events.c: kfd_smi_ev_poll: EPOLLIN | EPOLLRDNORM iff the fifo is not empty."""
    client.rt.create_queue(client.gpus[0])
    fd = client.open_smi(client.gpus[0], EVICTION)
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        assert poller.poll(50) == []
        evict_and_restore(client)
        assert poller.poll(2000) == [(fd, select.POLLIN)]
        read_all(fd)
        assert poller.poll(50) == []
    finally:
        os.close(fd)


def test_smi_event_without_a_task_reaches_every_enabled_client(client, sim):
    """kfd_smi_events.c: kfd_smi_ev_enabled passes pid-0 events (here PROCESS_START) to every
    client with the bit set, whoever opened it; the record names the task (its comm)."""
    fd = client.open_smi(client.gpus[0], c.KFD_SMI_EVENT_PROCESS_START)
    try:
        child = in_child(_open_kfd_and_report_pid, sim)
        settle()
        records = read_all(fd).decode().splitlines()
        with open("/proc/self/comm") as f:              # a forked child keeps its parent's name
            comm = f.read().strip()
        assert f"c {child:x} {comm}" in records, records
    finally:
        os.close(fd)


def _open_kfd_and_report_pid(sim):
    Client(sim, runtime_enable=False)
    return os.getpid()


def _open_smi_and_pass_it(sim, gpu, sock, event):
    cl = Client(sim, runtime_enable=False)
    fd = cl.open_smi(gpu, event)
    socket.send_fds(sock, [b"fd"], [fd])
    return os.getpid()                       # and exits: the fd lives on in the parent only


def test_an_smi_fd_outlives_the_process_that_opened_it(client, sim):
    """kfd_smi_events.c: kfd_smi_ev_release removes a client at its file's last close; nothing in
    process teardown does. An SMI fd passed to another process keeps reading records after its
    opener exits (a review found it ended at the opener's exit)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    opener = in_child(_open_smi_and_pass_it, sim, client.gpus[0], theirs, c.KFD_SMI_EVENT_PROCESS_START)
    _, [fd], _, _ = socket.recv_fds(ours, 16, 1)
    try:
        settle()
        read_all(fd)                                     # whatever came before
        child = in_child(_open_kfd_and_report_pid, sim)
        settle()
        records = read_all(fd).decode().splitlines()
        assert child != opener and any(r.startswith(f"c {child:x} ") for r in records), records
    finally:
        os.close(fd)
        ours.close()
        theirs.close()


def test_smi_events_need_a_gpu_of_the_process(client):
    """kfd_chardev.c: kfd_ioctl_smi_events: a gpuid the process has no device data for is -EINVAL."""
    with pytest.raises(errors.InvalidArgument):
        client.kfd.ioctl("SMI_EVENTS", s.kfd_ioctl_smi_events_args(gpuid=0xFFFF_FFF0))


# --- kfd_chardev.c: kfd_ioctl (the dispatcher) ---------------------------------------------------

def _use_inherited_fd(client, nr_request, arg):
    """In a forked child: use the parent's KfdDevice from the main thread and from a new thread."""
    results = []

    def call():
        try:
            client.kfd.raw_ioctl(nr_request, arg)
            results.append(0)
        except errors.KfdIoctlError as e:
            results.append(e.errno)
    call()
    worker = threading.Thread(target=call)
    worker.start()
    worker.join()
    proc_dir = client.sim.sysfs_root / f"class/kfd/kfd/proc/{os.getpid()}"
    return results, proc_dir.exists()


def test_inherited_fd_is_ebadf_in_the_child_from_any_thread(client):
    """kfd_chardev.c: kfd_ioctl: `process->lead_thread != current->group_leader` -> -EBADF; the
    child does not become a KFD process by using the parent's fd."""
    request = client.kfd.abi.request("GET_VERSION")
    results, became_kfd_process = in_child(_use_inherited_fd, client, request, s.kfd_ioctl_get_version_args())
    assert results == [errno.EBADF, errno.EBADF]
    assert not became_kfd_process
    client.kfd.ioctl("GET_VERSION", s.kfd_ioctl_get_version_args())      # the parent's fd still works


def test_unknown_nr_from_another_process_is_enotty(client):
    """kfd_chardev.c: kfd_ioctl checks the nr (-ENOTTY) before the fd's owner (-EBADF)."""
    request = ioctl_opt.IOWR(ord("K"), 0x7F, ctypes.c_uint64)
    results, _ = in_child(_use_inherited_fd, client, request, ctypes.c_uint64())
    assert results == [errno.ENOTTY, errno.ENOTTY]


def _own_kfd_in_child(sim):
    cl = Client(sim, runtime_enable=False)
    version = s.kfd_ioctl_get_version_args()
    cl.kfd.ioctl("GET_VERSION", version)
    return (version.major_version, version.minor_version,
            (sim.sysfs_root / f"class/kfd/kfd/proc/{os.getpid()}").is_dir())


def test_a_child_that_opens_its_own_fd_is_its_own_kfd_process(sim):
    """kfd_chardev.c: kfd_open creates the caller's kfd_process (and proc/<pid>)."""
    assert in_child(_own_kfd_in_child, sim) == (1, 23, True)


# --- GET_QUEUE_WAVE_STATE: kfd_device_queue_manager.c get_wave_state, kfd_mqd_manager_v9.c ------

def _suspended_queue_with_waves(client, waves=300):
    qid = client.rt.create_queue(client.gpus[0])
    client.ctl("set_waves", pid=os.getpid(), qid=qid, waves=waves)
    client.enable_debug()
    client.snapshot()                                  # clears EC_QUEUE_NEW
    assert client.suspend([qid])[0] == 1
    return qid


def test_wave_state_header_into_ordinary_memory_follows_the_mqd(client):
    """kfd_mqd_manager_v9.c: get_wave_state writes {cp_hqd_cntl_stack_offset, ctl_stack_used,
    cp_hqd_wg_state_offset, save_area_used} at ctl_stack_address, where the control stack grows
    down from ctl_stack_size and the save area up from it, then copies the used control stack to
    ctl_stack_address + cntl_stack_offset. Any writable user address will do."""
    qid = _suspended_queue_with_waves(client)
    ctl_stack_size = 20480                             # the node's; the buffer is the caller's
    buf = (ctypes.c_ubyte * ctl_stack_size)(*([0xEE] * ctl_stack_size))
    ws = s.kfd_ioctl_get_queue_wave_state_args(ctl_stack_address=ctypes.addressof(buf), queue_id=qid)
    client.kfd.ioctl("GET_QUEUE_WAVE_STATE", ws)
    header = s.kfd_context_save_area_header_wave_state.from_buffer_copy(bytes(buf)[:16])
    # the ctl_stack_size the queue was created with (published in sysfs, or libhsakmt's own computation)
    node_ctl_stack = save_area_sizes(client.rt.topology.find_gpu(client.gpus[0]).props)[1]
    assert ws.ctl_stack_used_size > 0 and ws.save_area_used_size > 0
    assert header.control_stack_size == ws.ctl_stack_used_size
    assert header.wave_state_size == ws.save_area_used_size
    assert header.control_stack_offset == node_ctl_stack - ws.ctl_stack_used_size
    assert header.wave_state_offset == node_ctl_stack + ws.save_area_used_size
    raw = bytes(buf)
    assert raw[header.control_stack_offset:node_ctl_stack] == bytes(ws.ctl_stack_used_size)   # copied out
    assert raw[16:header.control_stack_offset] == b"\xEE" * (header.control_stack_offset - 16)  # untouched
    client.dbg("DISABLE")


def test_wave_state_into_read_only_memory_is_efault_with_sizes(client):
    """kfd_mqd_manager_v9.c: get_wave_state: copy_to_user fails -> -EFAULT; the sizes were set
    first and the dispatcher (kfd_ioctl) copies the argument back even on error."""
    qid = _suspended_queue_with_waves(client)
    page = LIBC.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    try:
        ws = s.kfd_ioctl_get_queue_wave_state_args(ctl_stack_address=page, queue_id=qid)
        with pytest.raises(errors.BadAddress):
            client.kfd.ioctl("GET_QUEUE_WAVE_STATE", ws)
        assert ws.ctl_stack_used_size > 0 and ws.save_area_used_size > 0
        assert ctypes.string_at(page, 4096) == bytes(4096)
    finally:
        LIBC.munmap(page, 4096)
        client.dbg("DISABLE")


LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.mmap.restype = ctypes.c_void_p
LIBC.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
LIBC.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


def test_suspend_writes_the_same_header_into_the_cwsr_area(client):
    """kfd_device_queue_manager.c: copy_context_work_handler runs get_wave_state for every compute
    queue of the process at its ctx_save_restore_address after a suspend."""
    qid = _suspended_queue_with_waves(client)
    ws = s.kfd_ioctl_get_queue_wave_state_args(queue_id=qid,
                                               ctl_stack_address=client.rt.queues[qid]["ctx_save_restore_address"])
    client.kfd.ioctl("GET_QUEUE_WAVE_STATE", ws)
    data = client.ctl("read_memory", pid=os.getpid(), addr=ws.ctl_stack_address, length=16)["data"]
    header = s.kfd_context_save_area_header_wave_state.from_buffer_copy(bytes.fromhex(data))
    # the ctl_stack_size the queue was created with (published in sysfs, or libhsakmt's own computation)
    node_ctl_stack = save_area_sizes(client.rt.topology.find_gpu(client.gpus[0]).props)[1]
    assert (header.control_stack_size, header.wave_state_size) == (ws.ctl_stack_used_size, ws.save_area_used_size)
    assert header.wave_state_offset == node_ctl_stack + ws.save_area_used_size
    client.dbg("DISABLE")


# --- what is not simulated answers EOPNOTSUPP instead of succeeding with no effect --------------

@pytest.mark.parametrize("name", ["ACQUIRE_VM", "SET_MEMORY_POLICY", "SET_SCRATCH_BACKING_VA",
                                  "SET_TRAP_HANDLER", "GET_TILE_CONFIG"])
def test_ioctls_without_a_simulated_effect_are_eopnotsupp(client, name):
    """kfd_chardev.c: these program hardware state (VM, apertures, scratch, trap handler) or report
    hardware registers (tile config) that a simulator without a GPU does not have."""
    arg = client.kfd.abi.layout(BY_NAME[name].struct.__name__)()
    if hasattr(arg, "gpu_id"):
        arg.gpu_id = client.gpus[0]
    with pytest.raises(errors.NotSupported) as info:
        client.kfd.ioctl(name, arg)
    assert info.value.errno == errno.EOPNOTSUPP


@pytest.mark.parametrize("op", ["SET_WAVE_LAUNCH_OVERRIDE", "SET_WAVE_LAUNCH_MODE"])
def test_dbg_trap_ops_without_a_simulated_effect_are_eopnotsupp(client, op):
    """kfd_chardev.c: kfd_ioctl_set_debug_trap: the permission checks run first, then the op."""
    with pytest.raises(errors.InvalidArgument):        # not debug-enabled: EINVAL before the op
        client.dbg(op)
    client.enable_debug()
    try:
        with pytest.raises(errors.NotSupported) as info:
            client.dbg(op)
        assert info.value.errno == errno.EOPNOTSUPP
    finally:
        client.dbg("DISABLE")


# --- memory: kfd_chardev.c ------------------------------------------------------------------------

def test_alloc_handle_is_gpu_id_and_lowest_free_idr(client):
    """kfd_chardev.c: kfd_ioctl_alloc_memory_of_gpu returns MAKE_HANDLE(gpu_id, idr handle), the
    idr handle being the device's lowest free one (kfd_process.c:
    kfd_process_device_create_obj_handle); free of an unknown handle is EINVAL."""
    gpu = client.gpus[1]
    first = client.rt.alloc(gpu, 4096)
    handles = client.rt.handles[-1:]
    client.rt.alloc(gpu, 4096)
    handles.append(client.rt.handles[-1])
    assert all(h >> 32 == gpu for h in handles) and handles[1] == handles[0] + 1
    client.kfd.ioctl("FREE_MEMORY_OF_GPU", s.kfd_ioctl_free_memory_of_gpu_args(handles[0]))
    client.rt.handles.remove(handles[0])
    args = s.kfd_ioctl_alloc_memory_of_gpu_args(va_addr=first, size=4096, gpu_id=gpu,
                                                flags=c.KFD_IOC_ALLOC_MEM_FLAGS_GTT)
    client.kfd.ioctl("ALLOC_MEMORY_OF_GPU", args)        # reuses the freed id
    client.rt.handles.append(args.handle)
    assert args.handle == handles[0]
    with pytest.raises(errors.InvalidArgument):
        client.kfd.ioctl("FREE_MEMORY_OF_GPU", s.kfd_ioctl_free_memory_of_gpu_args(handles[1] + 77))


def test_map_memory_counts_devices_in_n_success(client):
    """kfd_chardev.c: kfd_ioctl_map_memory_to_gpu: n_success > n_devices is EINVAL; devices are
    mapped from n_success on, n_success counting them; a gpu_id the process lacks stops with
    EINVAL after the ones done (the argument is copied back on error); an unknown handle is
    ENOMEM."""
    gpu, other = client.gpus[0], client.gpus[1]
    client.rt.alloc(gpu, 4096)
    handle = client.rt.handles[-1]
    ids = (ctypes.c_uint32 * 3)(gpu, other, 0xBAD)

    def mapping(n_devices, n_success=0, h=handle):
        return s.kfd_ioctl_map_memory_to_gpu_args(handle=h, device_ids_array_ptr=ctypes.addressof(ids),
                                                  n_devices=n_devices, n_success=n_success)
    ok = mapping(2)
    client.kfd.ioctl("MAP_MEMORY_TO_GPU", ok)
    assert ok.n_success == 2
    with pytest.raises(errors.InvalidArgument):
        client.kfd.ioctl("MAP_MEMORY_TO_GPU", mapping(2, n_success=3))
    bad = mapping(3)
    with pytest.raises(errors.InvalidArgument):
        client.kfd.ioctl("MAP_MEMORY_TO_GPU", bad)
    assert bad.n_success == 2
    with pytest.raises(errors.KfdIoctlError) as info:
        client.kfd.ioctl("MAP_MEMORY_TO_GPU", mapping(1, h=handle + 1000))
    assert info.value.errno == errno.ENOMEM
    unmap = s.kfd_ioctl_unmap_memory_from_gpu_args(handle=handle, device_ids_array_ptr=ctypes.addressof(ids),
                                                    n_devices=2)
    client.kfd.ioctl("UNMAP_MEMORY_FROM_GPU", unmap)     # the runtime frees it at teardown


def test_free_of_a_mapped_bo_is_ebusy_and_keeps_the_handle(client):
    """amdgpu_amdkfd_gpuvm.c: amdgpu_amdkfd_gpuvm_free_memory_of_gpu: a BO still mapped on a GPU
    (mapped_to_gpu_memory > 0) -> EBUSY before anything is released, so kfd_ioctl_free_memory_of_gpu
    keeps its handle; once unmapped it frees."""
    gpu = client.gpus[0]
    client.rt.alloc(gpu, 4096)
    handle = client.rt.handles[-1]
    ids = (ctypes.c_uint32 * 1)(gpu)
    client.kfd.ioctl("MAP_MEMORY_TO_GPU", s.kfd_ioctl_map_memory_to_gpu_args(
        handle=handle, device_ids_array_ptr=ctypes.addressof(ids), n_devices=1))
    with pytest.raises(errors.KfdIoctlError) as info:
        client.kfd.ioctl("FREE_MEMORY_OF_GPU", s.kfd_ioctl_free_memory_of_gpu_args(handle))
    assert info.value.errno == errno.EBUSY
    client.kfd.ioctl("UNMAP_MEMORY_FROM_GPU", s.kfd_ioctl_unmap_memory_from_gpu_args(
        handle=handle, device_ids_array_ptr=ctypes.addressof(ids), n_devices=1))
    client.kfd.ioctl("FREE_MEMORY_OF_GPU", s.kfd_ioctl_free_memory_of_gpu_args(handle))
    client.rt.handles.remove(handle)
