"""The simulated KFD's event, unmap, available-memory and debug-exception handlers against the
kernel's rules, one test per rule, each naming the kernel file and function it follows
(drivers/gpu/drm/amd/amdkfd/, drivers/gpu/drm/amd/amdgpu/). Tests that count events run in a
forked child, a brand-new KFD process with no events of earlier tests."""
import ctypes
import errno
import os

import pytest

from kfdtool import errors
from kfdtool.ioctls import constants as c
from kfdtool.ioctls import structs as s
from kfdtool.sim.workload import VRAM
from simhelpers import Client, in_child

COMPLETE, TIMEOUT, FAIL = (c.KFD_IOC_WAIT_RESULT_COMPLETE, c.KFD_IOC_WAIT_RESULT_TIMEOUT,
                           c.KFD_IOC_WAIT_RESULT_FAIL)


def create_event(kfd, event_type=c.KFD_IOC_EVENT_SIGNAL, auto_reset=False, page=0):
    args = s.kfd_ioctl_create_event_args(event_type=event_type, auto_reset=int(auto_reset), event_page_offset=page)
    kfd.ioctl("CREATE_EVENT", args)
    return args


def set_event(kfd, event_id, reset=False):
    if reset:
        kfd.ioctl("RESET_EVENT", s.kfd_ioctl_reset_event_args(event_id=event_id))
    else:
        kfd.ioctl("SET_EVENT", s.kfd_ioctl_set_event_args(event_id=event_id))


def wait(kfd, ids, wait_for_all=False, timeout_ms=0, ages=None):
    """WAIT_EVENTS on `ids` (each with its last_event_age from `ages`, 0: none given); returns the
    arguments as copied back (on error too). With `ages`, also the ages as written back."""
    data = (s.kfd_event_data * max(1, len(ids)))()
    for i, event_id in enumerate(ids):
        data[i].event_id = event_id
        data[i].signal_event_data.last_event_age = (ages or [0] * len(ids))[i]
    args = s.kfd_ioctl_wait_events_args(events_ptr=ctypes.addressof(data), num_events=len(ids),
                                        wait_for_all=int(wait_for_all), timeout=timeout_ms)
    try:
        kfd.ioctl("WAIT_EVENTS", args)
    except errors.KfdIoctlError as e:
        return args, e.errno
    if ages is not None:
        return args, [data[i].signal_event_data.last_event_age for i in range(len(ids))]
    return args, 0


def in_fresh_process(sim, fn):
    """fn(kfd of a brand-new KFD process), in a forked child."""
    def run():
        cl = Client(sim, runtime_enable=False)
        try:
            return fn(cl.kfd)
        finally:
            cl.close()
    return in_child(run)


# --- kfd_events.c -------------------------------------------------------------------------------------

def _ids_and_slots(kfd):
    signal = [create_event(kfd) for _ in range(3)]
    other = create_event(kfd, c.KFD_IOC_EVENT_MEMORY)
    kfd.ioctl("DESTROY_EVENT", s.kfd_ioctl_destroy_event_args(event_id=signal[1].event_id))
    again = create_event(kfd)
    return ([(a.event_id, a.event_slot_index, a.event_trigger_data, a.event_page_offset) for a in signal],
            (other.event_id, other.event_page_offset), again.event_id)


def test_event_ids_are_the_lowest_free_slot_and_other_types_start_at_the_nonsignal_range(sim):
    """kfd_events.c: kfd_event_init_process reserves id 0; create_signal_event takes the lowest
    free id (idr_alloc) and reports it as slot index and trigger data with the events mmap
    offset; create_other_event starts at KFD_FIRST_NONSIGNAL_EVENT_ID (0x80000000) with no
    offset; a destroyed id is handed out again."""
    signal, other, again = in_fresh_process(sim, _ids_and_slots)
    assert signal == [(i, i, i, 2 << 62) for i in (1, 2, 3)]
    assert other == (0x8000_0000, 0)
    assert again == 2


def _create_until_full(kfd):
    ids = []
    while True:
        try:
            ids.append(create_event(kfd).event_id)
        except errors.KfdIoctlError as e:
            return ids, e.errno, create_event(kfd, c.KFD_IOC_EVENT_HW_EXCEPTION).event_id


def test_signal_events_run_out_after_255_without_an_event_page(sim):
    """kfd_events.c: allocate_event_notification_slot gives a kernel-allocated signal page 256
    slots, slot 0 reserved, so create_signal_event answers -ENOSPC for the 256th; events of
    other types do not use slots and can still be created."""
    ids, err, other = in_fresh_process(sim, _create_until_full)
    assert ids == list(range(1, 256)) and err == errno.ENOSPC
    assert other == 0x8000_0000


def _event_page(kfd, gpu):
    alloc = s.kfd_ioctl_alloc_memory_of_gpu_args(va_addr=0x7F00_0000_0000, size=4096, gpu_id=gpu,
                                                 flags=c.KFD_IOC_ALLOC_MEM_FLAGS_GTT)
    kfd.ioctl("ALLOC_MEMORY_OF_GPU", alloc)
    page = alloc.handle
    results = {}
    for name, offset in (("bad gpu", (0xFFFF << 32) | (page & 0xFFFF_FFFF)), ("bad handle", page + 50)):
        try:
            create_event(kfd, page=offset)
        except errors.KfdIoctlError as e:
            results[name] = e.errno
    ids = []
    first = create_event(kfd, page=page)
    ids.append(first.event_id)
    try:
        create_event(kfd, page=page)
    except errors.KfdIoctlError as e:
        results["page twice"] = e.errno
    try:
        while True:
            ids.append(create_event(kfd).event_id)
    except errors.KfdIoctlError as e:
        results["full"] = e.errno
    try:
        kfd.ioctl("FREE_MEMORY_OF_GPU", s.kfd_ioctl_free_memory_of_gpu_args(page))
    except errors.KfdIoctlError as e:
        results["free page"] = e.errno
    return results, len(ids)


def test_an_event_page_from_user_space_sets_the_slot_count_once(sim, client):
    """kfd_chardev.c: kfd_ioctl_create_event: a non-zero event_page_offset is the handle of the
    BO to use as signal page (kfd_events.c: kfd_kmap_event_page): a GPU the process lacks or an
    unknown BO is -EINVAL, a second page is -EINVAL; the page's size sets the slots (4096 bytes:
    512 slots, 511 events). kfd_ioctl_free_memory_of_gpu refuses to free it (-EPERM)."""
    results, created = in_fresh_process(sim, lambda kfd: _event_page(kfd, client.gpus[0]))
    assert results == {"bad gpu": errno.EINVAL, "bad handle": errno.EINVAL, "page twice": errno.EINVAL,
                       "full": errno.ENOSPC, "free page": errno.EPERM}
    assert created == 511


def _page_of(kfd, gpu, size, flags, offset=0):
    """Signal events a BO of `size` bytes and `flags` takes as event page: their count, or the errno."""
    alloc = s.kfd_ioctl_alloc_memory_of_gpu_args(va_addr=0x7F00_0000_0000, size=size, gpu_id=gpu, flags=flags,
                                                 mmap_offset=offset)
    kfd.ioctl("ALLOC_MEMORY_OF_GPU", alloc)
    created = []
    try:
        created.append(create_event(kfd, page=alloc.handle))
        while True:
            created.append(create_event(kfd))
    except errors.KfdIoctlError as e:
        return len(created) if created else e.errno


def test_an_event_page_holds_whole_pages_and_cannot_be_a_userptr(sim, client):
    """kfd_events.c: kfd_kmap_event_page maps the BO with amdgpu_amdkfd_gpuvm_map_gtt_bo_to_kernel,
    whose size is the BO's, page-aligned: a 100-byte BO gives 512 slots (511 events); a userptr BO
    cannot be mapped into the kernel (-EINVAL). A review found 11 events and a userptr page taken."""
    gpu = client.gpus[0]
    assert in_fresh_process(sim, lambda kfd: _page_of(kfd, gpu, 100, c.KFD_IOC_ALLOC_MEM_FLAGS_GTT)) == 511
    userptr = in_fresh_process(sim, lambda kfd: _page_of(kfd, gpu, 4096, c.KFD_IOC_ALLOC_MEM_FLAGS_USERPTR,
                                                         offset=0x7E00_0000_0000))
    assert userptr == errno.EINVAL


def test_unknown_event_ids_are_einval(client):
    """kfd_events.c: kfd_event_destroy, kfd_set_event and kfd_reset_event look the id up
    (lookup_event_by_id; id 0 is reserved, never an event): unknown -> -EINVAL. kfd_wait_on_events
    fails the same way (init_event_waiter) and reports KFD_IOC_WAIT_RESULT_FAIL."""
    for event_id in (0, 0x7FFF_FFFF):
        for name, args in (("DESTROY_EVENT", s.kfd_ioctl_destroy_event_args(event_id=event_id)),
                           ("SET_EVENT", s.kfd_ioctl_set_event_args(event_id=event_id)),
                           ("RESET_EVENT", s.kfd_ioctl_reset_event_args(event_id=event_id))):
            with pytest.raises(errors.InvalidArgument):
                client.kfd.ioctl(name, args)
        args, err = wait(client.kfd, [event_id])
        assert (err, args.wait_result) == (errno.EINVAL, FAIL)


def test_only_signal_events_can_be_set_from_the_cpu(client):
    """kfd_events.c: kfd_set_event / kfd_reset_event: event_can_be_cpu_signaled is true for
    KFD_IOC_EVENT_SIGNAL only; a debug or memory event is -EINVAL."""
    events = [create_event(client.kfd, t).event_id for t in (c.KFD_IOC_EVENT_DEBUG_EVENT, c.KFD_IOC_EVENT_MEMORY)]
    try:
        for event_id in events:
            for reset in (False, True):
                with pytest.raises(errors.InvalidArgument):
                    set_event(client.kfd, event_id, reset)
    finally:
        for event_id in events:
            client.kfd.ioctl("DESTROY_EVENT", s.kfd_ioctl_destroy_event_args(event_id=event_id))


@pytest.fixture
def events(client):
    """Two manual-reset and two auto-reset signal events of the test process, destroyed after."""
    made = {name: create_event(client.kfd, auto_reset=name.startswith("auto")).event_id
            for name in ("manual1", "manual2", "auto1", "auto2")}
    yield made
    for event_id in made.values():
        client.kfd.ioctl("DESTROY_EVENT", s.kfd_ioctl_destroy_event_args(event_id=event_id))


def test_auto_reset_event_is_consumed_by_a_wait_and_manual_reset_is_not(client, events):
    """kfd_events.c: init_event_waiter: a signaled event fires the wait and, when auto-reset,
    is no longer signaled after it; a manual-reset event stays signaled until RESET_EVENT."""
    kfd = client.kfd
    set_event(kfd, events["manual1"])
    set_event(kfd, events["auto1"])
    assert [wait(kfd, [events["manual1"]])[0].wait_result for _ in range(2)] == [COMPLETE, COMPLETE]
    assert [wait(kfd, [events["auto1"]])[0].wait_result for _ in range(2)] == [COMPLETE, TIMEOUT]
    set_event(kfd, events["manual1"], reset=True)
    assert wait(kfd, [events["manual1"]])[0].wait_result == TIMEOUT


def test_wait_any_and_all_with_timeout_zero(client, events):
    """kfd_events.c: kfd_wait_on_events with timeout 0 (KFD_EVENT_TIMEOUT_IMMEDIATE) checks once:
    any -> COMPLETE if one fired, all -> only if every one did, else TIMEOUT, with no error.
    test_event_condition: an empty list is COMPLETE in both modes."""
    kfd = client.kfd
    pair = [events["manual1"], events["manual2"]]
    set_event(kfd, events["manual1"])
    assert wait(kfd, pair)[0].wait_result == COMPLETE
    assert wait(kfd, pair, wait_for_all=True)[0].wait_result == TIMEOUT
    set_event(kfd, events["manual2"])
    assert wait(kfd, pair, wait_for_all=True)[0].wait_result == COMPLETE
    assert wait(kfd, [])[0].wait_result == COMPLETE
    assert wait(kfd, [], wait_for_all=True)[0].wait_result == COMPLETE


def test_a_wait_with_an_event_age_fires_on_any_set_since_and_says_the_age_now(client, events):
    """kfd_events.c: kfd_event_create starts event_age at 1 and set_event adds one; init_event_waiter:
    a SIGNAL event waited on with a last_event_age (0: none given) fires if its age differs, even
    after RESET_EVENT; copy_signaled_event_data writes the age back into a COMPLETE wait's entry.
    How ROCr misses no set between two of its waits (a review found the ages ignored)."""
    kfd, manual = client.kfd, events["manual1"]
    assert wait(kfd, [manual], ages=[1])[0].wait_result == TIMEOUT          # never set: age 1
    assert wait(kfd, [manual], ages=[5])[0].wait_result == COMPLETE         # another age than its own
    set_event(kfd, manual)
    set_event(kfd, manual, reset=True)                                      # set, then reset: age 2
    args, ages = wait(kfd, [manual], ages=[1])
    assert args.wait_result == COMPLETE and ages == [2]
    set_event(kfd, manual)                                                  # age 3, and signaled
    args, ages = wait(kfd, [manual], ages=[3])
    assert args.wait_result == COMPLETE and ages == [3]                     # fired by being signaled
    set_event(kfd, manual, reset=True)
    assert wait(kfd, [manual], ages=[3])[0].wait_result == TIMEOUT          # seen: nothing since


def test_a_wait_consumes_every_signaled_auto_reset_event_it_names_even_when_it_fails(client, events):
    """kfd_events.c: init_event_waiter consumes each signaled auto-reset event as it joins the
    wait, and free_waiters gives them back only when a signal interrupted the wait: so a
    wait-all that times out, and a wait that stops at an unknown id, still use them up."""
    kfd = client.kfd
    set_event(kfd, events["auto1"])
    assert wait(kfd, [events["auto1"], events["auto2"]], wait_for_all=True)[0].wait_result == TIMEOUT
    assert wait(kfd, [events["auto1"]])[0].wait_result == TIMEOUT          # used up by the failed wait
    set_event(kfd, events["auto1"])
    args, err = wait(kfd, [events["auto1"], 0x7FFF_FFFF])
    assert (err, args.wait_result) == (errno.EINVAL, FAIL)
    assert wait(kfd, [events["auto1"]])[0].wait_result == TIMEOUT


def test_wait_events_with_an_unreadable_array_is_efault(client):
    """kfd_events.c: kfd_wait_on_events copies each kfd_event_data from user memory: -EFAULT."""
    args = s.kfd_ioctl_wait_events_args(events_ptr=0x10, num_events=1, wait_for_all=0, timeout=0)
    with pytest.raises(errors.BadAddress):
        client.kfd.ioctl("WAIT_EVENTS", args)


# --- kfd_chardev.c: kfd_ioctl_unmap_memory_from_gpu --------------------------------------------

def _map_args(name, handle, ids, n_devices, n_success=0):
    cls = s.kfd_ioctl_map_memory_to_gpu_args if name == "MAP" else s.kfd_ioctl_unmap_memory_from_gpu_args
    return cls(handle=handle, device_ids_array_ptr=ctypes.addressof(ids), n_devices=n_devices, n_success=n_success)


def test_unmap_follows_the_map_protocol_and_needs_a_mapping(client):
    """kfd_chardev.c: kfd_ioctl_unmap_memory_from_gpu: no devices or n_success > n_devices ->
    -EINVAL; an unknown handle -> -ENOMEM; devices from n_success on, each counted in n_success;
    a device where the BO is not mapped stops it with -EINVAL (amdgpu_amdkfd_gpuvm.c:
    amdgpu_amdkfd_gpuvm_unmap_memory_from_gpu, "the BO wasn't actually mapped"), so a second
    unmap fails; mapping again where mapped is no error."""
    kfd = client.kfd
    gpu, other = client.gpus[0], client.gpus[1]
    client.rt.alloc(gpu, 4096)
    handle = client.rt.handles[-1]
    ids = (ctypes.c_uint32 * 2)(gpu, other)
    for bad in (_map_args("UNMAP", handle, ids, 0), _map_args("UNMAP", handle, ids, 1, n_success=2)):
        with pytest.raises(errors.InvalidArgument):
            kfd.ioctl("UNMAP_MEMORY_FROM_GPU", bad)
    with pytest.raises(errors.KfdIoctlError) as info:
        kfd.ioctl("UNMAP_MEMORY_FROM_GPU", _map_args("UNMAP", handle + 1000, ids, 1))
    assert info.value.errno == errno.ENOMEM
    kfd.ioctl("MAP_MEMORY_TO_GPU", _map_args("MAP", handle, ids, 1))         # mapped on gpu only
    kfd.ioctl("MAP_MEMORY_TO_GPU", _map_args("MAP", handle, ids, 1))         # again: nothing to do
    part = _map_args("UNMAP", handle, ids, 2)
    with pytest.raises(errors.InvalidArgument):
        kfd.ioctl("UNMAP_MEMORY_FROM_GPU", part)                            # not mapped on `other`
    assert part.n_success == 1
    again = _map_args("UNMAP", handle, ids, 1)
    with pytest.raises(errors.InvalidArgument):
        kfd.ioctl("UNMAP_MEMORY_FROM_GPU", again)                           # unmapped already
    assert again.n_success == 0
    kfd.ioctl("MAP_MEMORY_TO_GPU", _map_args("MAP", handle, ids, 2))
    done = _map_args("UNMAP", handle, ids, 2)
    kfd.ioctl("UNMAP_MEMORY_FROM_GPU", done)
    assert done.n_success == 2


# --- kfd_chardev.c: kfd_ioctl_get_available_memory ----------------------------------------------

def available(kfd, gpu):
    args = s.kfd_ioctl_get_available_memory_args(gpu_id=gpu)
    kfd.ioctl("AVAILABLE_MEMORY", args)
    return args.available


def test_available_memory_counts_vram_in_2_mib_steps_for_every_process(sim, client):
    """kfd_chardev.c: kfd_ioctl_get_available_memory: a gpu_id that is not one of the process's
    devices -> -EINVAL. amdgpu_amdkfd_gpuvm.c: amdgpu_amdkfd_get_available_memory: a multiple of
    VRAM_AVAILABLITY_ALIGN (2 MiB); each VRAM BO of any process takes its size rounded up to it
    (vram_used_aligned), so a 4 KiB BO takes 2 MiB; GTT takes none; freeing gives it back."""
    kfd, gpu = client.kfd, client.gpus[2]
    with pytest.raises(errors.InvalidArgument):
        available(kfd, 0xFFFF)
    before = available(kfd, gpu)
    assert before % (2 << 20) == 0 and before > 0
    client.rt.alloc(gpu, 4096)                                               # GTT
    assert available(kfd, gpu) == before
    client.rt.alloc(gpu, 4096, flags=VRAM)
    assert available(kfd, gpu) == before - (2 << 20)
    client.rt.alloc(gpu, (2 << 20) + 1, flags=VRAM)
    assert available(kfd, gpu) == before - 3 * (2 << 20)
    seen_by_another = in_fresh_process(sim, lambda other: available(other, gpu))
    assert seen_by_another == before - 3 * (2 << 20)
    for handle in client.rt.handles[-2:]:
        kfd.ioctl("FREE_MEMORY_OF_GPU", s.kfd_ioctl_free_memory_of_gpu_args(handle))
    del client.rt.handles[-2:]
    assert available(kfd, gpu) == before


def vram_usage(client, gpu):
    return int((client.sim.sysfs_root / f"class/kfd/kfd/proc/{os.getpid()}/vram_{gpu}").read_text())


def test_vram_is_counted_in_whole_pages_and_an_aql_ring_at_half(client):
    """kfd_chardev.c: kfd_ioctl_alloc_memory_of_gpu adds PAGE_ALIGN(size) to the process's
    vram_usage, half the size for AQL_QUEUE_MEM (the ring is mapped twice); amdgpu_amdkfd_gpuvm.c
    reserves the same half for AVAILABLE_MEMORY. A review found raw bytes and full AQL sizes."""
    kfd, gpu = client.kfd, client.gpus[3]
    usage, free = vram_usage(client, gpu), available(kfd, gpu)
    client.rt.alloc(gpu, 100, flags=VRAM)
    assert vram_usage(client, gpu) == usage + 4096
    client.rt.alloc(gpu, 8 << 20, flags=VRAM | c.KFD_IOC_ALLOC_MEM_FLAGS_AQL_QUEUE_MEM)
    assert vram_usage(client, gpu) == usage + 4096 + (4 << 20)
    assert available(kfd, gpu) == free - (2 << 20) - (4 << 20)
    for handle in client.rt.handles[-2:]:
        kfd.ioctl("FREE_MEMORY_OF_GPU", s.kfd_ioctl_free_memory_of_gpu_args(handle))
    del client.rt.handles[-2:]
    assert vram_usage(client, gpu) == usage and available(kfd, gpu) == free


@pytest.mark.parametrize("flags,offset,size,err", [
    (c.KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE, 0, 4096, errno.EINVAL),             # no domain
    (c.KFD_IOC_ALLOC_MEM_FLAGS_USERPTR, 0, 4096, errno.EINVAL),              # a userptr without its address
    (VRAM, 0, 1 << 50, errno.ENOMEM),                                        # more VRAM than the GPU has
    (c.KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL, 0, 4096, errno.EINVAL),             # not the doorbell slice (8 KiB)
    (c.KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP, 0, 8192, errno.EINVAL),           # not one page
    (c.KFD_IOC_ALLOC_MEM_FLAGS_GTT | c.KFD_IOC_ALLOC_MEM_FLAGS_USERPTR, 0, 4096, 0),   # GTT's branch: fine
    (c.KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL | c.KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP, 0, 8192, 0),   # a doorbell
])
def test_alloc_needs_a_domain_the_right_size_and_room(client, flags, offset, size, err):
    """amdgpu_amdkfd_gpuvm.c: amdgpu_amdkfd_gpuvm_alloc_memory_of_gpu: none of VRAM, GTT, USERPTR,
    DOORBELL, MMIO_REMAP -> -EINVAL; a USERPTR whose mmap_offset (its user address) is 0 ->
    -EINVAL; amdgpu_amdkfd_reserve_mem_limit: VRAM beyond what is left -> -ENOMEM;
    kfd_chardev.c: kfd_ioctl_alloc_memory_of_gpu: a DOORBELL that is not the process's doorbell
    slice, or an MMIO_REMAP that is not one page -> -EINVAL."""
    args = s.kfd_ioctl_alloc_memory_of_gpu_args(va_addr=0x7A00_0000_0000, size=size, gpu_id=client.gpus[0],
                                                flags=flags, mmap_offset=offset)
    if not err:                                 # the kernel's else-if branches take it
        client.kfd.ioctl("ALLOC_MEMORY_OF_GPU", args)
        client.kfd.ioctl("FREE_MEMORY_OF_GPU", s.kfd_ioctl_free_memory_of_gpu_args(args.handle))
        return
    with pytest.raises(errors.KfdIoctlError) as info:
        client.kfd.ioctl("ALLOC_MEMORY_OF_GPU", args)
    assert info.value.errno == err


# --- kfd_debug.c: SET_EXCEPTIONS_ENABLED ----------------------------------------------------------

def query_debug_event(client, clear=0):
    try:
        _, args = client.dbg("QUERY_DEBUG_EVENT", "query_debug_event", exception_mask=clear)
    except errors.KfdIoctlError as e:
        return e.errno
    q = args.query_debug_event
    return q.exception_mask, q.gpu_id, q.queue_id


def test_set_exceptions_enabled_decides_what_query_debug_event_reports(client):
    """kfd_debug.c: kfd_dbg_set_enabled_debug_exception_mask replaces the enabled mask;
    kfd_dbg_ev_query_debug_event reports the first queue (newest first) whose pending
    exceptions the mask enables, with its whole status, GPU and id, clears the bits asked, and
    is -EAGAIN when nothing enabled is pending. A new queue's EC_QUEUE_NEW is pending until then."""
    new = c.KFD_EC_MASK(c.EC_QUEUE_NEW)
    older = client.rt.create_queue(client.gpus[0])
    newer = client.rt.create_queue(client.gpus[1])
    client.enable_debug()
    try:
        assert query_debug_event(client) == errno.EAGAIN                     # nothing enabled
        client.dbg("SET_EXCEPTIONS_ENABLED", "set_exceptions_enabled", exception_mask=new)
        assert query_debug_event(client) == (new, client.gpus[1], newer)      # not cleared: again
        assert query_debug_event(client, clear=new) == (new, client.gpus[1], newer)
        assert query_debug_event(client, clear=new) == (new, client.gpus[0], older)
        assert query_debug_event(client) == errno.EAGAIN
        client.dbg("SET_EXCEPTIONS_ENABLED", "set_exceptions_enabled", exception_mask=0)
    finally:
        client.dbg("DISABLE")
        for qid in (older, newer):
            client.rt.destroy_queue(qid)


def test_an_mmio_remap_page_is_mapped_through_the_kfd_device(client):
    """kfd_chardev.c: kfd_ioctl_alloc_memory_of_gpu: an MMIO_REMAP BO's mmap offset is a kfd one,
    KFD_MMAP_TYPE_MMIO | KFD_MMAP_GPU_ID(gpu_id); a doorbell slice of 8 KiB (SOC15) is taken."""
    gpu = client.gpus[1]
    mmio = s.kfd_ioctl_alloc_memory_of_gpu_args(va_addr=0x7B00_0000_0000, size=4096, gpu_id=gpu,
                                                flags=c.KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP)
    client.kfd.ioctl("ALLOC_MEMORY_OF_GPU", mmio)
    assert mmio.mmap_offset == (0 << 62) | (gpu << 46)
    bells = s.kfd_ioctl_alloc_memory_of_gpu_args(va_addr=0x7C00_0000_0000, size=8192, gpu_id=gpu,
                                                 flags=c.KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL)
    client.kfd.ioctl("ALLOC_MEMORY_OF_GPU", bells)
    for args in (mmio, bells):
        client.kfd.ioctl("FREE_MEMORY_OF_GPU", s.kfd_ioctl_free_memory_of_gpu_args(args.handle))


def test_vram_runs_out_by_page_aligned_bytes_not_by_2_mib_steps(client):
    """amdgpu_amdkfd_gpuvm.c: amdgpu_amdkfd_reserve_mem_limit refuses (-ENOMEM) by vram_used, the
    page-aligned bytes; the 2 MiB steps (vram_used_aligned) are only AVAILABLE_MEMORY's count. After
    a 4 KiB BO, all that AVAILABLE_MEMORY reported before but 1 MiB still fits (a review found each
    small BO charged 2 MiB against ENOMEM)."""
    kfd, gpu = client.kfd, client.gpus[3]
    before = available(kfd, gpu)
    client.rt.alloc(gpu, 4096, flags=VRAM)
    big = s.kfd_ioctl_alloc_memory_of_gpu_args(va_addr=0x7D00_0000_0000, size=before - (1 << 20), gpu_id=gpu,
                                               flags=VRAM)
    kfd.ioctl("ALLOC_MEMORY_OF_GPU", big)
    kfd.ioctl("FREE_MEMORY_OF_GPU", s.kfd_ioctl_free_memory_of_gpu_args(big.handle))
    kfd.ioctl("FREE_MEMORY_OF_GPU", s.kfd_ioctl_free_memory_of_gpu_args(client.rt.handles.pop()))
