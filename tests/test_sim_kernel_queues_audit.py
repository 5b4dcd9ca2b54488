"""CREATE_QUEUE and UPDATE_QUEUE of the simulated KFD against the Linux kernel's text
(drivers/gpu/drm/amd/amdkfd/): how kfd_queue_buffer_get finds a queue's buffers, the ring size
kfd_queue_acquire_buffers looks for per kernel version, the doorbell CREATE_QUEUE hands back
(allocate_doorbell), SDMA queues running out (allocate_sdma_queue) and update_queue's -EACCES.
Each test names the kernel function it follows."""
import errno
import os

import pytest

from kfdtool import errors
from kfdtool.ioctls import constants as c
from kfdtool.ioctls import structs as s
from kfdtool.sim import runner
from kfdtool.sim.workload import save_area_sizes
from kfdtool.topology import read_topology
from simhelpers import Client, in_child, start

RING = 1 << 16
SDMA = c.KFD_IOC_QUEUE_TYPE_SDMA
AQL = c.KFD_IOC_QUEUE_TYPE_COMPUTE_AQL
KFD_MMAP_TYPE_DOORBELL = 3 << 62                  # kfd_priv.h
OLD_KERNEL_MACHINE = "mi300x-cpx"                 # started at 1.17 below, then stopped: others run it at 1.23


def create(cl, gpu, queue_type=AQL, ring_size=RING, ring_bo=None, offsets=None, **fields):
    """CREATE_QUEUE with buffers allocated and mapped on `gpu` as libhsakmt does (a page each for
    the read and write pointers). With `offsets` (ring, rptr, wptr, CWSR area) the two pointers
    share one page instead (as in ROCr's amd_queue_t) and each address sits that many bytes into
    its buffer. Returns the argument as copied back."""
    ring = cl.rt.alloc(gpu, ring_bo or ring_size, map_to_gpu=True)
    rptr = cl.rt.alloc(gpu, 4096, map_to_gpu=True)
    wptr = rptr if offsets else cl.rt.alloc(gpu, 4096, map_to_gpu=True)
    offsets = offsets or (0, 0, 0, 0)
    args = cl.kfd.abi.layout("kfd_ioctl_create_queue_args")(
        ring_base_address=ring + offsets[0], ring_size=ring_size, read_pointer_address=rptr + offsets[1],
        write_pointer_address=wptr + offsets[2], gpu_id=gpu, queue_type=queue_type, queue_percentage=100,
        queue_priority=7)
    if queue_type in (AQL, c.KFD_IOC_QUEUE_TYPE_COMPUTE):
        ctx_size, ctl_stack, mapping = save_area_sizes(cl.rt.topology.find_gpu(gpu).props)
        args.ctx_save_restore_address = cl.rt.alloc(gpu, mapping, map_to_gpu=True) + offsets[3]
        args.ctx_save_restore_size, args.ctl_stack_size = ctx_size, ctl_stack
    for name, value in fields.items():
        setattr(args, name, value)
    cl.kfd.ioctl("CREATE_QUEUE", args)
    return args


def refused(cl, gpu, **kw):
    """CREATE_QUEUE's errno (AssertionError where it succeeds)."""
    with pytest.raises(errors.KfdIoctlError) as info:
        create(cl, gpu, **kw)
    return info.value.errno


def destroy(cl, qid):
    cl.kfd.ioctl("DESTROY_QUEUE", s.kfd_ioctl_destroy_queue_args(qid, 0))


def doorbell(args):
    """The doorbell's byte offset in the process's doorbell pages, after checking the mmap offset's
    type and GPU bits (kfd_chardev.c: kfd_ioctl_create_queue)."""
    assert args.doorbell_offset >> 46 == (KFD_MMAP_TYPE_DOORBELL >> 46) | args.gpu_id
    return args.doorbell_offset & ((1 << 46) - 1)


def node_id(cl, gpu):
    """kfd_topology.c: kfd_topology_add_device: a partition's location_id is pci_dev_id | node_id;
    every GPU of these captures is PCI function 0 of its bus (pci_dev_id's low byte 0)."""
    return cl.rt.topology.find_gpu(gpu).props["location_id"] & 0xFF


def aqua_vanjaram_sdma_doorbell(node, engine, engines_per_node=2):
    """amdgpu: aqua_vanjaram_doorbell_index_init: engine i of the GPU starts at
    AMDGPU_DOORBELL_LAYOUT1_sDMA_ENGINE_START (0x100) + i * (sdma_doorbell_range 20 >> 1);
    kfd_device_queue_manager.c: allocate_doorbell takes index node_id * engines + engine and, on
    GC 9.4.3, aligns it to KFD_SDMA_SHADER_DOORBELL_GRANULARITY (4)."""
    base = 0x100 + 10 * (node * engines_per_node + engine)
    return -(-base // 4) * 4


# --- kfd_queue_buffer_get compares GPU page numbers ------------------------------------------------
def _offsets_inside_the_first_page(sim, gpu):
    cl = Client(sim, runtime_enable=False)
    made = create(cl, gpu, offsets=(0x100, 0x40, 0x80, 0x40))          # every buffer off its start
    past_first_page = refused(cl, gpu, ring_bo=2 * RING, offsets=(RING, 0, 8, 0))
    second_page_pointer = refused(cl, gpu, offsets=(0, 4096 + 0x40, 0, 0))   # beyond the pointers' page
    destroy(cl, made.queue_id)
    return past_first_page, second_page_pointer


def test_kfd_queue_buffer_get_takes_any_address_in_a_mappings_first_page(sim, client):
    """kfd_queue.c: kfd_queue_buffer_get shifts the address to a GPU page number and wants it to be
    the mapping's start page (`user_addr != mapping->start`), and the mapping `expected_size >> 12`
    pages long: a ring, read and write pointers and CWSR area a few bytes into their buffers (the
    two pointers in one page) make a queue; a ring address in its buffer's second page is -EINVAL,
    and so is a pointer past the one page its mapping has."""
    gpu = client.gpus[-1]
    assert in_child(_offsets_inside_the_first_page, sim, gpu) == (errno.EINVAL, errno.EINVAL)


# --- the ring size kfd_queue_acquire_buffers looks for --------------------------------------------
def _small_rings(sim, gpu):
    cl = Client(sim, runtime_enable=False)
    out = []
    for ring_size, bo in ((1024, 8192), (2048, 8192), (4096, 8192), (1024, 4096)):
        try:
            args = create(cl, gpu, ring_size=ring_size, ring_bo=bo)
        except errors.KfdIoctlError as e:
            out.append(e.errno)
        else:
            destroy(cl, args.queue_id)
            out.append(0)
    return out


def test_kfd_queue_acquire_buffers_page_aligns_the_ring_in_7_2(sim, client):
    """Linux 7.2: kfd_queue.c: kfd_queue_acquire_buffers looks the ring up at
    PAGE_ALIGN(queue_size + metadata_queue_size): a 1 KiB or 2 KiB ring must be a one-page mapping
    (-EINVAL in an 8 KiB one); a 4 KiB ring in 8 KiB is -EINVAL as in every version."""
    gpu = client.gpus[-2]
    assert in_child(_small_rings, sim, gpu) == [errno.EINVAL, errno.EINVAL, errno.EINVAL, 0]


def _sdma_doorbells(sim, gpu):
    cl = Client(sim, runtime_enable=False)
    made = [create(cl, gpu, SDMA) for _ in range(4)]
    offsets = [doorbell(a) for a in made]
    for a in made:
        destroy(cl, a.queue_id)
    return offsets, node_id(cl, gpu)


def test_linux_6_12_looks_the_ring_up_at_its_size_and_partitions_own_sdma_doorbells(sim_dir):
    """Linux 6.12 (KFD 1.17): kfd_queue_acquire_buffers passes queue_size as given, so a ring under a
    page has only its start checked (kfd_queue_buffer_get: size >> 12 == 0) and an 8 KiB mapping
    takes it; a 4 KiB ring still wants a one-page mapping. allocate_doorbell's SDMA doorbells index
    sdma_doorbell_idx at node_id * engines + engine, aligned on GC 9.4.3 (an MI300X CPX partition)."""
    runner.stop(OLD_KERNEL_MACHINE)
    machine = start(OLD_KERNEL_MACHINE, "1.17")
    try:
        gpus = [n.gpu_id for n in read_topology(machine.sysfs_root).for_each_gpu()]
        assert in_child(_small_rings, machine, gpus[0]) == [0, 0, errno.EINVAL, 0]
        for gpu in (gpus[1], gpus[3]):
            offsets, node = in_child(_sdma_doorbells, machine, gpu)
            assert node in (1, 3)
            b0, b1 = aqua_vanjaram_sdma_doorbell(node, 0), aqua_vanjaram_sdma_doorbell(node, 1)
            assert offsets == [8 * b0, 8 * b1, 8 * (b0 + 512), 8 * (b1 + 512)]
    finally:
        runner.stop(OLD_KERNEL_MACHINE)


# --- allocate_doorbell ---------------------------------------------------------------------------
def _compute_doorbells(sim, gpu, other):
    cl = Client(sim, runtime_enable=False)
    a0 = create(cl, gpu)
    b0 = create(cl, other)                 # another device: its own doorbell bitmap
    sdma = create(cl, gpu, SDMA)           # static doorbell, none of the bitmap's
    a1 = create(cl, gpu)
    destroy(cl, a0.queue_id)
    a2 = create(cl, gpu)                   # deallocate_doorbell gave bit 0 back
    out = [(a.queue_id, doorbell(a)) for a in (a0, b0, a1, a2)]
    for a in (b0, sdma, a1, a2):
        destroy(cl, a.queue_id)
    return out


def test_allocate_doorbell_gives_a_compute_queue_the_lowest_free_doorbell_of_its_device(sim, client):
    """kfd_device_queue_manager.c: allocate_doorbell: on SOC15 a compute queue takes the lowest
    free bit of its process's doorbell bitmap on the queue's device (not its queue id, which counts
    every device and SDMA queues too), freed by deallocate_doorbell; pqm_create_queue and
    kfd_ioctl_create_queue return it as a byte offset, 8 bytes a doorbell."""
    got = in_child(_compute_doorbells, sim, client.gpus[-3], client.gpus[-4])
    assert got == [(0, 0), (1, 0), (3, 8), (0, 0)]


def _sdma_until_refused(cl, gpu):
    """SDMA queues created on `gpu` until the kernel refuses one: (their args, the refusal's errno)."""
    made = []
    while True:
        try:
            made.append(create(cl, gpu, SDMA, ring_size=4096))
        except errors.KfdIoctlError as e:
            return made, e.errno
        assert len(made) <= 64


def _sdma_queues(sim, gpu, extra=0):
    """Every SDMA queue the device gives, in order: their doorbells, the errno that ends it, then
    what an SDMA_XGMI queue gets and whether a queue freed is taken again."""
    cl = Client(sim, runtime_enable=False)
    made, end = _sdma_until_refused(cl, gpu)
    xgmi = None
    try:
        made.append(create(cl, gpu, c.KFD_IOC_QUEUE_TYPE_SDMA_XGMI, ring_size=4096))
    except errors.KfdIoctlError as e:
        xgmi = e.errno
    destroy(cl, made[2].queue_id)
    again = create(cl, gpu, SDMA, ring_size=4096)
    offsets = [doorbell(a) for a in made]
    for a in made[:2] + made[3:] + [again]:
        destroy(cl, a.queue_id)
    return offsets, end, xgmi, doorbell(again), node_id(cl, gpu)


def test_allocate_sdma_queue_runs_out_with_enomem_and_sdma_doorbells_are_per_engine(sim, client):
    """kfd_device_queue_manager.c: allocate_sdma_queue takes the lowest free bit of the device's
    SDMA bitmap (get_num_sdma_queues: num_sdma_engines 2 x 8 queues on an MI308X partition), engine
    = bit % 2, queue = bit / 2; the bitmap empty, -ENOMEM ("No more SDMA queue to allocate"); a node
    without XGMI SDMA engines has no SDMA_XGMI queue at all (-ENOMEM). allocate_doorbell: an SDMA
    queue's doorbell is its engine's first (aqua_vanjaram layout, the partition's engines, aligned
    to 4) + (queue & 1) * KFD_QUEUE_DOORBELL_MIRROR_OFFSET + (queue >> 1)."""
    gpu = client.gpus[-5]
    offsets, end, xgmi, again, node = in_child(_sdma_queues, sim, gpu)
    b = [aqua_vanjaram_sdma_doorbell(node, 0), aqua_vanjaram_sdma_doorbell(node, 1)]
    expected = [8 * (b[bit % 2] + (bit // 2 & 1) * 512 + (bit // 2 >> 1)) for bit in range(16)]
    assert offsets == expected
    assert (end, xgmi) == (errno.ENOMEM, errno.ENOMEM)
    assert again == expected[2]


def _fill_device(sim, gpu, ready_w, go_r):
    cl = Client(sim, runtime_enable=False)
    made = []
    while True:
        try:
            made.append(create(cl, gpu, SDMA, ring_size=4096))
        except errors.KfdIoctlError:
            break
    os.write(ready_w, bytes([len(made)]))
    os.read(go_r, 1)
    for a in made:
        destroy(cl, a.queue_id)
    return len(made)


def _one_sdma_queue(sim, gpu):
    cl = Client(sim, runtime_enable=False)
    try:
        a = create(cl, gpu, SDMA, ring_size=4096)
    except errors.KfdIoctlError as e:
        return e.errno
    destroy(cl, a.queue_id)
    return 0


def test_the_sdma_bitmap_is_the_devices_not_the_processes(sim, client):
    """allocate_sdma_queue works on dqm->sdma_bitmap, one per device (kfd_node) for every process:
    while one process holds all of a device's SDMA queues another one's CREATE_QUEUE is -ENOMEM,
    and it succeeds once they are destroyed."""
    import threading
    gpu = client.gpus[-6]
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    filled = []
    t = threading.Thread(target=lambda: filled.append(in_child(_fill_device, sim, gpu, ready_w, go_r)))
    t.start()
    try:
        assert os.read(ready_r, 1) == bytes([16])
        assert in_child(_one_sdma_queue, sim, gpu) == errno.ENOMEM
    finally:
        os.write(go_w, b"x")
        t.join(10)
    assert filled == [16]
    assert in_child(_one_sdma_queue, sim, gpu) == 0


def _by_engine(sim, gpu):
    cl = Client(sim, runtime_enable=False)
    first = create(cl, gpu, SDMA, ring_size=4096)                       # bit 0: engine 0
    on_1 = create(cl, gpu, c.KFD_IOC_QUEUE_TYPE_SDMA_BY_ENG_ID, ring_size=4096, sdma_engine_id=1)
    engine_0 = []
    while True:
        try:
            engine_0.append(create(cl, gpu, c.KFD_IOC_QUEUE_TYPE_SDMA_BY_ENG_ID, ring_size=4096,
                                   sdma_engine_id=0))
        except errors.KfdIoctlError as e:
            end = e.errno
            break
    plain = create(cl, gpu, SDMA, ring_size=4096)                       # engine 1 has room
    out = (doorbell(on_1), len(engine_0), end, doorbell(plain), node_id(cl, gpu))
    for a in [first, on_1, plain] + engine_0:
        destroy(cl, a.queue_id)
    return out


def test_an_sdma_queue_by_engine_id_takes_that_engines_first_free_queue(sim, client):
    """allocate_sdma_queue, KFD_QUEUE_TYPE_SDMA_BY_ENG_ID: the bitmap's bits of the named engine
    only (engine, engine + engines, ...), -ENOMEM once that engine's 8 queues are taken, while a
    plain SDMA queue still gets one on the other engine."""
    gpu = client.gpus[-7]
    on_1, count, end, plain, node = in_child(_by_engine, sim, gpu)
    b0, b1 = aqua_vanjaram_sdma_doorbell(node, 0), aqua_vanjaram_sdma_doorbell(node, 1)
    assert on_1 == 8 * b1                            # bit 1: engine 1, queue 0
    assert (count, end) == (7, errno.ENOMEM)         # engine 0's queues 1..7 (queue 0 is `first`'s)
    assert plain == 8 * (b1 + 512)                   # bit 3: engine 1, queue 1
    del b0


def _navi33(sim):
    cl = Client(sim, runtime_enable=False)
    gpu = next(g for g in cl.gpus if cl.rt.topology.find_gpu(g).props["gfx_target_version"] == 110002)
    made, end = _sdma_until_refused(cl, gpu)
    offsets = [doorbell(a) for a in made]
    for a in made:
        destroy(cl, a.queue_id)
    return offsets, end


def test_gfx11_sdma_queues_skip_the_reserved_ones(sim_dir):
    """kfd_device.c: kfd_device_info_set_sdma_info: SDMA 6.x (a Navi33, GC 11.0.2) has 8 queues per
    engine and reserves 2 (paging, gfx): init_sdma_bitmaps masks bits 0..3 out of sdma_bitmap, so
    the first queue is bit 4 (engine 0, queue 2) and 12 fit (2 engines x 6, as the topology's
    num_sdma_queues_per_engine says), then -ENOMEM. soc21_init_doorbell_index: engine 0 starts at
    0x100, engine 1 at 0x10A."""
    try:
        offsets, end = in_child(_navi33, start("composite"))
    finally:
        runner.stop("composite")          # other tests start it with another ABI
    base = (0x100, 0x10A)
    assert offsets == [8 * (base[bit % 2] + (bit // 2 & 1) * 512 + (bit // 2 >> 1)) for bit in range(4, 16)]
    assert end == errno.ENOMEM


# --- update_queue's -EACCES comes after the properties are written --------------------------------
def _kernel(tmp_path, preset, abi, **params):
    """An in-process simulated kernel: a user cannot make a queue reset (kfd_hws_hang and
    set_queue_as_reset need an HWS that hangs), so the test sets pdd->has_reset_queue itself."""
    from kfdtool.sim.kernel import SimKfd
    from kfdtool.sim.machine import DEFAULT_PARAMETERS, PROFILES, materialize
    root = tmp_path / f"{preset}-{abi}"
    materialize(preset, root, PROFILES[abi])
    return SimKfd(root, PROFILES[abi], {**DEFAULT_PARAMETERS, **params}), root


def _ioctl(kfd, proc, name, args, mem=None):
    from kfdtool.sim.memory import UserMemory
    ret, out = kfd.ioctl(proc, proc.pid, kfd.abi.request(name), bytes(args), mem or UserMemory())
    return ret, (type(args).from_buffer_copy(out) if out else None)


def _sdma_queue_in_process(kfd, proc, gpu):
    """An SDMA queue of `proc` on `gpu` with a RING-byte ring; returns its qid and the address of a
    spare ring of RING // 2 bytes, mapped on `gpu`."""
    import ctypes
    from kfdtool.sim.memory import UserMemory
    vas = []
    for i, size in enumerate((RING, 4096, 4096, RING // 2)):
        va = 0x1000_0000_0000 + i * (1 << 24)
        ret, out = _ioctl(kfd, proc, "ALLOC_MEMORY_OF_GPU", s.kfd_ioctl_alloc_memory_of_gpu_args(
            va_addr=va, size=size, gpu_id=gpu, flags=c.KFD_IOC_ALLOC_MEM_FLAGS_GTT))
        assert ret == 0
        ids = bytearray(ctypes.c_uint32(gpu))
        ret, _ = _ioctl(kfd, proc, "MAP_MEMORY_TO_GPU", s.kfd_ioctl_map_memory_to_gpu_args(
            handle=out.handle, device_ids_array_ptr=0x7000_0000, n_devices=1), UserMemory({0x7000_0000: ids}))
        assert ret == 0
        vas.append(va)
    args = kfd.abi.layout("kfd_ioctl_create_queue_args")(
        ring_base_address=vas[0], ring_size=RING, read_pointer_address=vas[1], write_pointer_address=vas[2],
        gpu_id=gpu, queue_type=SDMA, queue_percentage=100, queue_priority=7)
    ret, out = _ioctl(kfd, proc, "CREATE_QUEUE", args)
    assert ret == 0
    return out.queue_id, vas[3]


@pytest.mark.parametrize("preset,abi,refused", [("mi308x", "1.23", True), ("composite", "1.23", True),
                                                ("mi308x", "1.17", True), ("mi308x", "1.11", False)])
def test_update_queue_of_a_process_with_a_reset_queue_writes_the_properties_then_says_eacces(
        tmp_path, preset, abi, refused):
    """kfd_process_queue_manager.c: pqm_update_queue_properties writes queue_address, queue_size,
    queue_percent, priority and pm4_target_xcc before dqm's update_queue
    (kfd_device_queue_manager.c), which under HWS, MES included (composite's last node, gfx12), and
    once the queues are unmapped, returns -EACCES for a process with a reset queue: the ioctl
    fails, yet procfs's queues/<qid>/size (kfd_procfs_queue_show) already shows the new size.
    Linux 6.1 (KFD 1.11) has no has_reset_queue: the update goes through."""
    kfd, root = _kernel(tmp_path, preset, abi)
    proc = kfd.open_process(os.getpid(), os.getuid())
    gpu = list(kfd.devices)[-1]
    if preset == "composite":
        assert kfd.devices[gpu].uses_mes
    qid, ring = _sdma_queue_in_process(kfd, proc, gpu)
    proc.has_reset_queue = True
    ret, _ = _ioctl(kfd, proc, "UPDATE_QUEUE", s.kfd_ioctl_update_queue_args(ring, qid, RING // 2, 50, 3))
    assert ret == (-errno.EACCES if refused else 0)
    assert proc.queues[qid].ring_base == ring
    size = root / f"class/kfd/kfd/proc/{os.getpid()}/queues/{qid}/size"
    assert int(size.read_text()) == RING // 2
    assert (proc.queues[qid].percent, proc.queues[qid].priority) == (50, 3)


def test_update_queue_under_sched_policy_2_has_no_eacces(tmp_path):
    """kfd_device_queue_manager.c: update_queue checks has_reset_queue only where sched_policy is
    not KFD_SCHED_POLICY_NO_HWS."""
    kfd, _ = _kernel(tmp_path, "mi308x", "1.23", sched_policy=2)
    proc = kfd.open_process(os.getpid(), os.getuid())
    gpu = list(kfd.devices)[-1]
    qid, ring = _sdma_queue_in_process(kfd, proc, gpu)
    proc.has_reset_queue = True
    ret, _ = _ioctl(kfd, proc, "UPDATE_QUEUE", s.kfd_ioctl_update_queue_args(ring, qid, RING // 2, 100, 7))
    assert ret == 0
