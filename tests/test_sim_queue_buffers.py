"""The simulated KFD's queue buffers as the kernel finds them: GPU VA mappings, held while the queue
lives. kfd_queue.c: kfd_queue_acquire_buffers looks each buffer of a new queue (write and read
pointers, ring, EOP buffer, CWSR area) up with kfd_queue_buffer_get in the VM of the queue's GPU
(amdgpu_vm_bo_lookup_mapping): a BO that was allocated but never mapped there with
MAP_MEMORY_TO_GPU has no mapping in it, and CREATE_QUEUE is -EINVAL. Each mapping found takes a
queue_refcount (struct amdgpu_bo_va, one per BO and GPU VM) that amdgpu_amdkfd_gpuvm.c:
unmap_bo_from_gpuvm answers with -EBUSY until pqm_destroy_queue gives it back
(kfd_queue_unref_bo_vas); FREE_MEMORY_OF_GPU of such a BO is -EBUSY because it is still mapped
(amdgpu_amdkfd_gpuvm_free_memory_of_gpu). Linux 6.12 (KFD 1.17) has all of it, 6.1 (KFD 1.11)
none: its CREATE_QUEUE checks no buffer."""
import ctypes
import errno
import threading

import pytest

from kfdtool import errors
from kfdtool.ioctls import constants as c
from kfdtool.ioctls import structs as s
from kfdtool.sim import runner
from kfdtool.sim.workload import save_area_sizes
from simhelpers import Client, start

RING = 1 << 16
OLD_KERNEL_MACHINE = "vega10"          # started at another ABI by the profile tests below, then stopped


class Queue:
    """A compute (AQL) queue's buffers on `gpu`, each allocated and, unless named in `unmapped`,
    mapped on `gpu` (as ROCr / libhsakmt do before CREATE_QUEUE)."""

    def __init__(self, cl, gpu, unmapped=()):
        self.cl, self.gpu = cl, gpu
        self.sizes = save_area_sizes(cl.rt.topology.find_gpu(gpu).props)
        self.va, self.handle = {}, {}
        for name, size in (("ring", RING), ("rptr", 4096), ("wptr", 4096), ("ctx", self.sizes[2])):
            self.va[name] = cl.rt.alloc(gpu, size, map_to_gpu=name not in unmapped)
            self.handle[name] = cl.rt.handles[-1]

    def args(self, **override):
        fields = dict(ring_base_address=self.va["ring"], ring_size=RING, read_pointer_address=self.va["rptr"],
                      write_pointer_address=self.va["wptr"], ctx_save_restore_address=self.va["ctx"],
                      ctx_save_restore_size=self.sizes[0], ctl_stack_size=self.sizes[1], gpu_id=self.gpu,
                      queue_type=c.KFD_IOC_QUEUE_TYPE_COMPUTE_AQL, queue_percentage=100, queue_priority=7)
        fields.update(override)
        return self.cl.kfd.abi.layout("kfd_ioctl_create_queue_args")(**fields)

    def create(self, **override):
        args = self.args(**override)
        self.cl.kfd.ioctl("CREATE_QUEUE", args)
        return args.queue_id

    def refused(self, **override):
        """CREATE_QUEUE's errno (AssertionError where it succeeds)."""
        with pytest.raises(errors.KfdIoctlError) as info:
            self.cl.kfd.ioctl("CREATE_QUEUE", self.args(**override))
        return info.value.errno

    def destroy(self, qid):
        self.cl.kfd.ioctl("DESTROY_QUEUE", s.kfd_ioctl_destroy_queue_args(qid, 0))


def _ids(*gpus):
    return (ctypes.c_uint32 * len(gpus))(*gpus)


def map_bo(cl, handle, *gpus):
    ids = _ids(*gpus)
    cl.kfd.ioctl("MAP_MEMORY_TO_GPU", s.kfd_ioctl_map_memory_to_gpu_args(
        handle=handle, device_ids_array_ptr=ctypes.addressof(ids), n_devices=len(gpus)))


def unmap_bo(cl, handle, *gpus):
    """UNMAP_MEMORY_FROM_GPU on `gpus`: None where it succeeds, else (errno, n_success)."""
    ids = _ids(*gpus)
    args = s.kfd_ioctl_unmap_memory_from_gpu_args(handle=handle, device_ids_array_ptr=ctypes.addressof(ids),
                                                   n_devices=len(gpus))
    try:
        cl.kfd.ioctl("UNMAP_MEMORY_FROM_GPU", args)
    except errors.KfdIoctlError as e:
        return e.errno, args.n_success
    if cl.rt.mapped.get(handle) in gpus:
        del cl.rt.mapped[handle]         # the runtime's teardown must not unmap it again
    return None


def free_bo(cl, handle):
    """FREE_MEMORY_OF_GPU: None where it succeeds, else the errno."""
    try:
        cl.kfd.ioctl("FREE_MEMORY_OF_GPU", s.kfd_ioctl_free_memory_of_gpu_args(handle))
    except errors.KfdIoctlError as e:
        return e.errno
    cl.rt.handles.remove(handle)
    return None


@pytest.mark.parametrize("unmapped", ["ring", "rptr", "wptr", "ctx"])
def test_create_queue_refuses_a_buffer_allocated_but_not_mapped(client, unmapped):
    """kfd_queue.c: kfd_queue_buffer_get finds no mapping of a BO that MAP_MEMORY_TO_GPU never
    mapped (-EINVAL, which kfd_ioctl_create_queue returns); once it is mapped the same
    CREATE_QUEUE succeeds."""
    gpu = client.gpus[0]
    q = Queue(client, gpu, unmapped=(unmapped,))
    before = set(client.queues())
    assert q.refused() == errno.EINVAL
    assert set(client.queues()) == before
    client.rt.map_to_gpu(q.handle[unmapped], gpu)
    qid = q.create()
    assert client.queues()[qid]["active"] is True
    q.destroy(qid)


def test_a_ring_mapped_on_another_gpu_only_is_not_the_queues(client):
    """kfd_queue_acquire_buffers looks in the VM of the queue's GPU (pdd->drm_priv): a mapping of
    the ring in another GPU's VM does not count (-EINVAL); mapped on the queue's GPU as well, it
    does."""
    gpu, other = client.gpus[0], client.gpus[1]
    q = Queue(client, gpu, unmapped=("ring",))
    map_bo(client, q.handle["ring"], other)
    assert q.refused() == errno.EINVAL
    map_bo(client, q.handle["ring"], gpu)
    qid = q.create()
    q.destroy(qid)
    assert unmap_bo(client, q.handle["ring"], other, gpu) is None


def test_unmap_and_free_of_a_live_queues_buffers_are_ebusy_until_destroy(client):
    """amdgpu_amdkfd_gpuvm.c: unmap_bo_from_gpuvm: a mapping with a queue_refcount is -EBUSY and
    stays mapped; kfd_ioctl_unmap_memory_from_gpu stops there with n_success counting the GPUs
    done before (the refcount is per GPU VM: the ring's mapping on another GPU unmaps). The BO
    being still mapped, FREE_MEMORY_OF_GPU is -EBUSY and keeps the handle. After DESTROY_QUEUE
    (pqm_destroy_queue: kfd_queue_unref_bo_vas) both succeed."""
    gpu, other = client.gpus[0], client.gpus[1]
    q = Queue(client, gpu)
    map_bo(client, q.handle["ring"], other)
    qid = q.create()
    assert unmap_bo(client, q.handle["ring"], other, gpu) == (errno.EBUSY, 1)
    assert unmap_bo(client, q.handle["ring"], gpu) == (errno.EBUSY, 0)
    for name in ("rptr", "wptr", "ctx"):
        assert unmap_bo(client, q.handle[name], gpu) == (errno.EBUSY, 0), name
    assert free_bo(client, q.handle["ring"]) == errno.EBUSY
    assert client.queues()[qid]["active"] is True
    q.destroy(qid)
    assert unmap_bo(client, q.handle["ring"], gpu) is None
    assert free_bo(client, q.handle["ring"]) is None


def test_each_queue_holds_its_own_reference(client):
    """queue_refcount counts the queues using a mapping: two queues on one set of pointer and
    CWSR buffers keep them unmappable until both are destroyed."""
    gpu = client.gpus[0]
    q = Queue(client, gpu)
    second_ring = client.rt.alloc(gpu, RING, map_to_gpu=True)
    first, second = q.create(), q.create(ring_base_address=second_ring)
    q.destroy(first)
    assert unmap_bo(client, q.handle["rptr"], gpu) == (errno.EBUSY, 0)
    assert unmap_bo(client, q.handle["ring"], gpu) is None            # the first queue's alone
    q.destroy(second)
    assert unmap_bo(client, q.handle["rptr"], gpu) is None


def test_update_queue_moves_the_rings_reference(client):
    """kfd_process_queue_manager.c: pqm_update_queue_properties: a new ring must be a mapping on
    the queue's GPU (-EFAULT where it is only allocated); it takes a queue_refcount and the old
    ring's mapping gives its one back (kfd_queue_unref_bo_va). A NULL ring (the queue disabled)
    keeps the current ring's."""
    gpu = client.gpus[0]
    q = Queue(client, gpu)
    qid = q.create()
    new_ring = client.rt.alloc(gpu, RING, map_to_gpu=True)
    new_handle = client.rt.handles[-1]
    unmapped_ring = client.rt.alloc(gpu, RING)

    def update(ring):
        client.kfd.ioctl("UPDATE_QUEUE", s.kfd_ioctl_update_queue_args(ring, qid, RING, 100, 7))
    with pytest.raises(errors.KfdIoctlError) as info:
        update(unmapped_ring)
    assert info.value.errno == errno.EFAULT
    assert unmap_bo(client, q.handle["ring"], gpu) == (errno.EBUSY, 0)
    update(new_ring)
    assert unmap_bo(client, q.handle["ring"], gpu) is None
    update(0)
    assert client.queues()[qid]["active"] is False
    assert unmap_bo(client, new_handle, gpu) == (errno.EBUSY, 0)
    q.destroy(qid)
    assert unmap_bo(client, new_handle, gpu) is None


def test_a_destroy_asleep_on_a_suspended_queue_has_given_its_buffers_back(client):
    """pqm_destroy_queue calls kfd_queue_unref_bo_vas before dqm's destroy_queue, whose
    wait_on_destroy_queue sleeps (p->mutex dropped) while a debugged process's queue is
    suspended: meanwhile its ring unmaps. The destroy ends at the resume."""
    gpu = client.gpus[0]
    q = Queue(client, gpu)
    qid = q.create()
    client.enable_debug()
    client.snapshot()
    client.suspend([qid])
    done = threading.Event()

    def destroy():
        q.destroy(qid)
        done.set()
    t = threading.Thread(target=destroy)
    t.start()
    try:
        assert not done.wait(0.3)             # asleep in the kernel
        assert unmap_bo(client, q.handle["ring"], gpu) is None
    finally:
        client.resume([qid])
        assert done.wait(5)
        t.join()
        client.dbg("DISABLE")
    assert qid not in client.queues()


def _on_profile(abi, check):
    """Run check(client) as a KFD process of OLD_KERNEL_MACHINE started at ABI `abi`."""
    runner.stop(OLD_KERNEL_MACHINE)           # it may run at another ABI
    cl = Client(start(OLD_KERNEL_MACHINE, abi))
    try:
        assert str(cl.kfd.abi) == abi
        check(cl)
    finally:
        cl.close()
        runner.stop(OLD_KERNEL_MACHINE)


def test_linux_6_1_checks_no_queue_buffer(sim_dir):
    """Linux 6.1 (KFD 1.11) has no kfd_queue_acquire_buffers: kfd_ioctl_create_queue takes a ring
    that is only allocated, or not even that, and a live queue's ring unmaps and frees (no
    queue_refcount yet)."""
    def check(cl):
        gpu = cl.gpus[0]
        q = Queue(cl, gpu, unmapped=("ring",))
        unmapped = q.create()
        nowhere = q.create(ring_base_address=0x7000_0000_0000)
        cl.rt.map_to_gpu(q.handle["ring"], gpu)
        mapped = q.create()
        assert unmap_bo(cl, q.handle["ring"], gpu) is None
        assert free_bo(cl, q.handle["ring"]) is None
        assert set(cl.queues()) == {unmapped, nowhere, mapped}
        for qid in (unmapped, nowhere, mapped):
            q.destroy(qid)
    _on_profile("1.11", check)


def test_linux_6_12_needs_the_mapping_and_holds_it(sim_dir):
    """Linux 6.12 (KFD 1.17) already has kfd_queue_buffer_get and the bo_va queue_refcount: an
    unmapped ring is -EINVAL, a live queue's ring unmap -EBUSY until DESTROY_QUEUE."""
    def check(cl):
        gpu = cl.gpus[0]
        q = Queue(cl, gpu, unmapped=("ring",))
        assert q.refused() == errno.EINVAL
        cl.rt.map_to_gpu(q.handle["ring"], gpu)
        qid = q.create()
        assert unmap_bo(cl, q.handle["ring"], gpu) == (errno.EBUSY, 0)
        q.destroy(qid)
        assert unmap_bo(cl, q.handle["ring"], gpu) is None
    _on_profile("1.17", check)
