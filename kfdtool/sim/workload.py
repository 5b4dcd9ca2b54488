"""Simulated GPU processes: what ROCr/HIP do against /dev/kfd, done against the simulated KFD.

`FakeRuntime` is the in-process part (RUNTIME_ENABLE at init, buffers and CREATE_QUEUE per
hardware queue, like ROCr's AqlQueue). `python -m kfdtool.sim.workload` is a whole process that
sets its name, creates queues, marks them busy and lives until killed or the simulator stops.
"""
import argparse
import ctypes
import os
import signal
import sys

from ..device import KfdDevice
from ..errors import Error, SimulatorError
from ..ioctls import constants as c
from ..ioctls import structs as s
from ..topology import read_topology
from .cwsr import node_cwsr, queue_save_area_bytes
from .memory import page_align

GTT = c.KFD_IOC_ALLOC_MEM_FLAGS_GTT | c.KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE
VRAM = c.KFD_IOC_ALLOC_MEM_FLAGS_VRAM | c.KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE
MAX_VRAM_GIB = 1 << 20          # far above any GPU's memory: the simulator refuses what does not fit
DEFAULT_RING = 1 << 20          # ROC_AQL_QUEUE_SIZE 16384 packets x 64 bytes


class FakeRuntime:
    def __init__(self, kfd, sysfs_root, runtime_enable=True):
        self.kfd = kfd
        self.topology = read_topology(sysfs_root)
        self.next_va = 0x1000_0000_0000
        self.queues = {}              # qid -> {gpu_id, ring_base, ring_size, ...}
        self.handles = []
        self.mapped = {}              # handle -> gpu_id we mapped it on (hsaKmtMapMemoryToGPU)
        self.runtime_enabled = False  # we turned the runtime on: close() turns it off
        if runtime_enable and kfd.supports("RUNTIME_ENABLE"):
            kfd.ioctl("RUNTIME_ENABLE", s.kfd_ioctl_runtime_enable_args(0, c.KFD_RUNTIME_ENABLE_MODE_ENABLE_MASK, 0))
            self.runtime_enabled = True

    def alloc(self, gpu_id, size, flags=GTT, map_to_gpu=False):
        """hsaKmtAllocMemory (ALLOC_MEMORY_OF_GPU); with map_to_gpu, then hsaKmtMapMemoryToGPU on
        `gpu_id` as well."""
        va = self.next_va
        self.next_va += page_align(size) + (1 << 21)
        args = s.kfd_ioctl_alloc_memory_of_gpu_args(va_addr=va, size=size, gpu_id=gpu_id, flags=flags)
        self.kfd.ioctl("ALLOC_MEMORY_OF_GPU", args)
        self.handles.append(args.handle)
        if map_to_gpu:
            self.map_to_gpu(args.handle, gpu_id)
        return va

    def map_to_gpu(self, handle, gpu_id):
        """MAP_MEMORY_TO_GPU of one BO on one GPU, as libhsakmt's hsaKmtMapMemoryToGPU."""
        self._on_gpu("MAP_MEMORY_TO_GPU", s.kfd_ioctl_map_memory_to_gpu_args, handle, gpu_id)
        self.mapped[handle] = gpu_id

    def _on_gpu(self, name, args_type, handle, gpu_id):
        """MAP or UNMAP_MEMORY_TO/FROM_GPU of one BO on one GPU."""
        ids = (ctypes.c_uint32 * 1)(gpu_id)
        self.kfd.ioctl(name, args_type(handle=handle, device_ids_array_ptr=ctypes.addressof(ids), n_devices=1))

    def create_queue(self, gpu_id, queue_type=c.KFD_IOC_QUEUE_TYPE_COMPUTE_AQL, priority=7, ring_size=DEFAULT_RING):
        """ROCr's and libhsakmt's queue creation: every buffer of the queue allocated and mapped on
        its GPU before CREATE_QUEUE (a kernel from 6.12 on looks each up as a GPU VA mapping)."""
        ring = self.alloc(gpu_id, ring_size, map_to_gpu=True)
        rptr, wptr = self.alloc(gpu_id, 4096, map_to_gpu=True), self.alloc(gpu_id, 4096, map_to_gpu=True)
        args = self.kfd.abi.layout("kfd_ioctl_create_queue_args")(
            ring_base_address=ring, write_pointer_address=wptr, read_pointer_address=rptr, ring_size=ring_size,
            gpu_id=gpu_id, queue_type=queue_type, queue_percentage=100, queue_priority=priority)
        compute = queue_type in (c.KFD_IOC_QUEUE_TYPE_COMPUTE, c.KFD_IOC_QUEUE_TYPE_COMPUTE_AQL)
        sizes = save_area_sizes(self.topology.find_gpu(gpu_id).props) if compute else None
        if sizes:
            ctx_save_restore_size, ctl_stack_size, mapping = sizes
            args.ctx_save_restore_address = self.alloc(gpu_id, mapping, map_to_gpu=True)
            args.ctx_save_restore_size = ctx_save_restore_size
            args.ctl_stack_size = ctl_stack_size
        self.kfd.ioctl("CREATE_QUEUE", args)
        self.queues[args.queue_id] = {"gpu_id": gpu_id, "ring_base": ring, "ring_size": ring_size,
                                      "type": queue_type, "priority": priority,
                                      "ctx_save_restore_address": args.ctx_save_restore_address}
        return args.queue_id

    def destroy_queue(self, qid):
        self.kfd.ioctl("DESTROY_QUEUE", s.kfd_ioctl_destroy_queue_args(qid, 0))
        self.queues.pop(qid, None)

    def close(self):
        """What ROCr's hsa_shut_down does: destroy our queues (a suspended queue of a debugged
        process makes that wait for its resume), unmap and free our memory and turn the runtime off
        (which, while a debugger is attached, waits for the debugger to answer)."""
        for qid in list(self.queues):
            self.destroy_queue(qid)
        for handle in self.handles:
            gpu_id = self.mapped.pop(handle, None)
            if gpu_id is not None:                # a mapped BO cannot be freed (EBUSY)
                self._on_gpu("UNMAP_MEMORY_FROM_GPU", s.kfd_ioctl_unmap_memory_from_gpu_args, handle, gpu_id)
            self.kfd.ioctl("FREE_MEMORY_OF_GPU", s.kfd_ioctl_free_memory_of_gpu_args(handle))
        self.handles.clear()
        self.mapped.clear()
        if self.runtime_enabled:
            self.runtime_enabled = False
            self.kfd.ioctl("RUNTIME_ENABLE", s.kfd_ioctl_runtime_enable_args(0, 0, 0))


def save_area_sizes(props):
    """(ctx_save_restore_size, ctl_stack_size, bytes to map) for a compute queue, chosen as
    libhsakmt does (queues.c: update_ctx_save_restore_size): the node's published cwsr_size and
    ctl_stack_size where sysfs has them, else its own copy of the kernel's computation (here the
    simulated kernel's, not kfdtool's). None where the node has no CWSR."""
    computed = node_cwsr(props)
    if computed is None:
        return None
    if props.get("cwsr_size") and props.get("ctl_stack_size"):
        computed = computed._replace(cwsr_size=props["cwsr_size"], ctl_stack_size=props["ctl_stack_size"])
    return computed.cwsr_size, computed.ctl_stack_size, queue_save_area_bytes(computed, computed.cwsr_size)


def set_process_name(name):
    """prctl(PR_SET_NAME): what `ps` and psutil show as the process name."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m kfdtool.sim.workload")
    parser.add_argument("--sim", required=True, help="simulated machine name")
    parser.add_argument("--role", default="gpu-worker", help="process name to show")
    parser.add_argument("--gpus", type=int, default=1, help="spread queues over this many GPUs")
    parser.add_argument("--first-gpu", type=_count(0), default=0, help="index of the first GPU to use")
    parser.add_argument("--queues", type=int, default=2, help="compute queues per GPU")
    parser.add_argument("--sdma", type=int, default=0, help="SDMA queues per GPU")
    parser.add_argument("--priority", type=int, default=7)
    parser.add_argument("--waves", type=int, default=512, help="resident waves per compute queue")
    parser.add_argument("--vram-gib", type=_gib, default=2.0, help="VRAM to allocate per GPU")
    parser.add_argument("--no-runtime-enable", action="store_true",
                        help="skip RUNTIME_ENABLE (a non-ROCr process: debugger suspend is refused)")
    args = parser.parse_args(argv)
    from . import runner
    set_process_name(args.role)
    try:
        sim = runner.machine(args.sim)
        if not sim.is_running():
            raise SimulatorError(f"simulated {args.sim} is not running (start it: kfdtool sim start {args.sim})")
        kfd = KfdDevice(sim.open_kfd())
        rt = FakeRuntime(kfd, sim.sysfs_root, runtime_enable=not args.no_runtime_enable)
    except Error as e:
        parser.exit(1, f"{parser.prog}: {e}\n")
    gpus = [n.gpu_id for n in rt.topology.for_each_gpu()]
    if not 0 < args.gpus <= len(gpus):
        parser.exit(1, f"{parser.prog}: --gpus {args.gpus}: simulated {args.sim} has {len(gpus)} GPUs\n")
    chosen = [gpus[(args.first_gpu + i) % len(gpus)] for i in range(args.gpus)]
    try:
        for gpu in chosen:
            rt.alloc(gpu, int(args.vram_gib * (1 << 30)), VRAM)
            for _ in range(args.queues):
                rt.create_queue(gpu, priority=args.priority)
            for _ in range(args.sdma):
                rt.create_queue(gpu, c.KFD_IOC_QUEUE_TYPE_SDMA, ring_size=1 << 16)
    except Error as e:                             # one line for whoever started us (`kfdtool sim workload`)
        parser.exit(1, f"{parser.prog}: {e}\n")
    with sim.control() as ctl:
        ctl("set_waves", pid=os.getpid(), waves=args.waves)
    signal.signal(signal.SIGUSR1, _shut_down)     # before "ready": whoever reads it may signal at once
    print(f"ready {os.getpid()}", flush=True)
    try:
        kfd.backend.sock.recv(1)           # until the simulator goes away or we are killed, or:
    except OSError:
        pass
    except ShutDown:                       # SIGUSR1: exit as a program returning from main does
        rt.close()
    return 0


def _count(low):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"wants a whole number, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value
    return parse


def _gib(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"wants a number of GiB, got {text!r}") from None
    if not 0 <= value <= MAX_VRAM_GIB:
        raise argparse.ArgumentTypeError(f"must be between 0 and {MAX_VRAM_GIB} GiB, got {text}")
    return value


class ShutDown(Exception):
    pass


def _shut_down(signum, frame):
    raise ShutDown


if __name__ == "__main__":
    sys.exit(main())
