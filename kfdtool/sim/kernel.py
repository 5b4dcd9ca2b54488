"""The simulated KFD: the ioctl dispatcher and queue/memory semantics of Linux 7.2's amdkfd
(kfd_chardev.c, kfd_process_queue_manager.c, kfd_device_queue_manager.c), as summarised with
line citations in ../shared/reference/kfd-abi.md. DBG_TRAP lives in dbg_trap.py.

Everything runs in the simulator server's single thread: one request at a time, like the
kernel's per-process and DQM locks taken together.
"""
import ctypes
import errno
import itertools
import os
import time
from collections import namedtuple
from dataclasses import dataclass
from pathlib import Path

import ioctl_opt

from ..ioctls import constants as c
from ..ioctls import structs as s
from ..ioctls.requests import BY_NR
from . import clock
from .cwsr import node_cwsr
from .dbg_trap import DbgTrap, ptrace_parent
from .errors import ENOTSUPP, Blocked, SimErrno
from .memory import BufferObject, UserMemory, access_ok, page_align
from .nodes import read_gpu_nodes
from .proc_sysfs import SYSFS_COMPUTE, SYSFS_SDMA, ProcSysfs
from .smi import SmiHub
from .state import SimProcess, SimQueue
from .timing import TimingModel

QUEUE_TYPES_SINCE = {c.KFD_IOC_QUEUE_TYPE_COMPUTE: 1, c.KFD_IOC_QUEUE_TYPE_SDMA: 1,
                     c.KFD_IOC_QUEUE_TYPE_COMPUTE_AQL: 1, c.KFD_IOC_QUEUE_TYPE_SDMA_XGMI: 1,
                     c.KFD_IOC_QUEUE_TYPE_SDMA_BY_ENG_ID: 17}
KFD_MMAP_TYPE_DOORBELL = 3 << 62
KFD_MMAP_TYPE_EVENTS = 2 << 62
KFD_MMAP_TYPE_MMIO = 0 << 62
MAX_CU_MASK_BITS = 1024              # kfd_ioctl_set_cu_mask: max_num_cus
SIGNAL_EVENT_TYPES = (c.KFD_IOC_EVENT_SIGNAL, c.KFD_IOC_EVENT_DEBUG_EVENT)   # ids from the signal page
DEFAULT_SIGNAL_SLOTS = 256           # kfd_events.c: allocate_event_notification_slot, "Oldest user mode"
KFD_FIRST_NONSIGNAL_EVENT_ID = 0x8000_0000    # kfd_events.h: KFD_EVENT_ID_NONSIGNAL_MASK
VRAM_AVAILABILITY_ALIGN = 2 << 20    # amdgpu_amdkfd.h: VRAM_AVAILABLITY_ALIGN (1 << 21)
# kfd_queue.c: kfd_queue_acquire_buffers (called by kfd_chardev.c: kfd_ioctl_create_queue) and the
# queue_refcount of a BO's mapping (amdgpu_object.h: struct amdgpu_bo_va) that makes
# amdgpu_amdkfd_gpuvm.c: unmap_bo_from_gpuvm refuse with -EBUSY: in Linux 6.12 (KFD 1.17), absent
# from 6.1 (KFD 1.11), whose CREATE_QUEUE and UPDATE_QUEUE check no queue buffer at all
QUEUE_BUFFERS_CHECKED_SINCE = 17
# kfd_device_queue_manager.c: update_queue's "queue is reset so inaccessable" -EACCES
# (pdd->has_reset_queue, set by kfd_hws_hang / set_queue_as_reset): in 6.12 (KFD 1.17), not in 6.1
RESET_QUEUE_EACCES_SINCE = 17
# kfd_device_queue_manager.c: allocate_doorbell: an SDMA queue's doorbell indexes amdgpu's
# sdma_doorbell_idx[] at node_id * get_num_all_sdma_engines + sdma_engine_id (6.12: partitions), and
# on GC 9.4.3 / 9.4.4 / 9.5.0 aligns the engine's first index to KFD_SDMA_SHADER_DOORBELL_GRANULARITY;
# 6.1 indexes it at sdma_engine_id alone and aligns nothing
SDMA_DOORBELL_PER_NODE_SINCE = 17
KFD_QUEUE_DOORBELL_MIRROR_OFFSET = 512           # kfd_priv.h
KFD_SDMA_SHADER_DOORBELL_GRANULARITY = 4         # kfd_priv.h (6.12)
SOC15_DOORBELL_SIZE = 8                          # kfd_device.c: device_info.doorbell_size, gfx9 (SOC15) on
# amdgpu's doorbell_index.sdma_engine[] (qword indices). vega10_doorbell_index_init (soc15.c: every
# gfx9 but Vega20, Arcturus, Aldebaran and aqua_vanjaram): AMDGPU_DOORBELL64_sDMA_ENGINE0/1. Every
# other layout puts engine i at 0x100 + 10 * i: vega20_doorbell_index_init, nv_init_doorbell_index,
# soc21_init_doorbell_index and soc24_init_doorbell_index (AMDGPU_VEGA20_ / AMDGPU_NAVI10_
# DOORBELL_sDMA_ENGINEi), aqua_vanjaram_doorbell_index_init (AMDGPU_DOORBELL_LAYOUT1_sDMA_ENGINE_START
# + i * (sdma_doorbell_range 20 >> 1), for every SDMA instance of the GPU, all its partitions')
VEGA10_SDMA_DOORBELLS = (0xF0, 0xF2)
SDMA_DOORBELLS = tuple(0x100 + 10 * i for i in range(16))
VEGA20_DOORBELL_LAYOUT = (90006, 90008, 90010)    # Vega20, Arcturus, Aldebaran
# SDMA counts of a node whose topology does not print them (a capture of a kernel older than
# num_sdma_engines & co.): kfd_device.c: kfd_device_info_set_sdma_info gives SDMA 4.0.0 (Vega10) 2
# queues per engine; sdma_v4_0.c: Vega10 has 2 instances
UNPUBLISHED_SDMA = {90000: (2, 0, 2)}

SignalPage = namedtuple("SignalPage", "size handle")     # handle None: allocated by the kernel itself
# where a kfd_event_data holds signal_event_data.last_event_age (the union at its start)
AGE_OFFSET = s.kfd_event_data._u.offset + s._kfd_event_data_union.signal_event_data.offset


def doorbell_slice(dev):
    """kfd_doorbell.c: kfd_doorbell_process_slice: a doorbell for each of a process's queues, 8
    bytes on SOC15 (gfx9 on) and 4 before, in whole pages."""
    size = 8 if dev.node.props.get("gfx_target_version", 90000) >= 90000 else 4
    return page_align(size * c.KFD_MAX_NUM_OF_QUEUES_PER_PROCESS)


def vram_charge(size, flags):
    """What a VRAM BO counts for: its size in whole pages, half of it for an AQL queue's ring,
    which is mapped twice (kfd_ioctl_alloc_memory_of_gpu's vram_usage, and the size that
    amdgpu_amdkfd_gpuvm_alloc_memory_of_gpu reserves: `if AQL_QUEUE_MEM: size >>= 1`)."""
    return page_align(size >> 1 if flags & c.KFD_IOC_ALLOC_MEM_FLAGS_AQL_QUEUE_MEM else size)


@dataclass(eq=False)
class SimEvent:
    """kfd_events.c: struct kfd_event, what user space can observe of it. `age` counts its sets
    (event_age: 1 at creation, one more on every set_event; 0 is never used, it means "not given"
    in a wait)."""
    type: int
    auto_reset: bool
    signaled: bool = False
    age: int = 1


@dataclass(frozen=True)
class SdmaLayout:
    """What the device queue manager knows of a node's SDMA engines (kfd_device_queue_manager.c:
    get_num_sdma_queues, init_sdma_bitmaps, allocate_doorbell)."""
    engines: int                 # kfd_get_num_sdma_engines: PCIe-optimised, engine ids 0..engines-1
    xgmi_engines: int            # kfd_get_num_xgmi_sdma_engines: the ids after them
    queues_per_engine: int       # device_info.num_sdma_queues_per_engine, the reserved ones included
    reserved: int                # num_reserved_sdma_queues_per_engine: sdma_bitmap's first engines * reserved
                                 # bits are masked out (reserved_sdma_queues_bitmap; SDMA 6.x / 7.x)
    doorbells: tuple             # each engine's first doorbell index (qwords); () before SOC15

    @classmethod
    def of(cls, node, node_id, abi_minor):
        props, gfxv = node.props, node.gfx_target_version
        if "num_sdma_engines" in props:
            # kfd_topology.c: kfd_topology_add_device publishes num_sdma_queues_per_engine without the
            # reserved queues
            engines, xgmi = props["num_sdma_engines"], props.get("num_sdma_xgmi_engines", 0)
            published = props.get("num_sdma_queues_per_engine", 0)
        else:
            engines, xgmi, published = UNPUBLISHED_SDMA.get(gfxv, (0, 0, 0))
        # kfd_device.c: kfd_device_info_set_sdma_info: SDMA 6.x and 7.x (GC 11 and 12) keep one queue
        # per engine for paging and one for gfx
        reserved = 2 if gfxv >= 110000 else 0
        doorbells = ()
        if gfxv >= 90000:                                        # KFD_IS_SOC15
            table = (VEGA10_SDMA_DOORBELLS if gfxv < 100000 and gfxv not in VEGA20_DOORBELL_LAYOUT
                     and not 90400 <= gfxv < 90600 else SDMA_DOORBELLS)
            first = node_id * (engines + xgmi) if abi_minor >= SDMA_DOORBELL_PER_NODE_SINCE else 0
            doorbells = table[first:first + engines + xgmi]
            if 90400 <= gfxv < 90600 and abi_minor >= SDMA_DOORBELL_PER_NODE_SINCE:
                g = KFD_SDMA_SHADER_DOORBELL_GRANULARITY
                doorbells = tuple(-(-base // g) * g for base in doorbells)
        return cls(engines, xgmi, published + reserved, reserved, doorbells)


def partition_index(node, nodes):
    """kfd_node.node_id, the node's partition of its GPU: kfd_topology.c: kfd_topology_add_device
    publishes location_id = pci_dev_id | node_id where the GPU has several nodes, so it is the node's
    location_id less the lowest one among the nodes of its GPU (same domain, unique_id and bus)."""
    def gpu(n):
        return n.props.get("domain"), n.props.get("unique_id"), n.props.get("location_id", 0) >> 8
    siblings = [n.props.get("location_id", 0) for n in nodes if gpu(n) == gpu(node)]
    return node.props.get("location_id", 0) - min(siblings)


@dataclass(eq=False)
class SimDevice:
    gpu_id: int
    node: object                     # nodes.SimNode: the node as the kernel published it
    cwsr: object                     # cwsr.NodeCwsr (what the kernel computed) or None
    cwsr_enabled: bool
    uses_mes: bool                   # gfx11+: MES firmware, no HWS runlists, grace period ignored
    max_queues_per_process: int
    remaps: int = 0                  # device-wide unmap+map cycles (HWS runlist refreshes)
    node_id: int = 0                 # kfd_node.node_id: its partition of the GPU (0 unpartitioned)
    sdma: SdmaLayout = None
    # kfd_device_queue_manager.c: dqm->trap_debug_vmid != 0: the device's debug VMID is reserved
    # (reserve_debug_trap_vmid), by whichever process: the dqm records no holder, and
    # release_debug_trap_vmid frees it for any caller
    trap_debug_vmid_reserved: bool = False

    @property
    def gfx_target_version(self):
        return self.node.gfx_target_version

    @property
    def svm(self):
        return self.gfx_target_version >= 90000

    @property
    def num_xcc(self):
        return self.node.num_xcc

    @property
    def cus_in_pairs(self):
        """pqm_update_mqd's pairwise CU mask check: GC 10.0.0 <= version < 12.1.0."""
        return 100000 <= self.gfx_target_version < 120100

    @property
    def has_cwsr_workaround(self):
        """kfd_debug.h: kfd_dbg_has_cwsr_workaround: GC 11.0.0 to 11.0.3."""
        return 110000 <= self.gfx_target_version <= 110003

    @property
    def mqd_per_xcc(self):
        """GC 9.4.3 / 9.4.4 / 9.5.0 keep one MQD per XCC (kfd_mqd_manager_v9.c: the *_v9_4_3 ops)."""
        return 90400 <= self.gfx_target_version < 90600


class SimKfd:
    def __init__(self, sysfs_root, profile, parameters):
        # (pid) -> bool: the server watches pid for its exit (the kernel's mm notifier); False where
        # it cannot. None: nothing watches (an in-process kernel in tests), so none is created
        self.watch_exit = None
        self.profile = profile
        self.abi = profile.abi
        self.params = parameters
        kfd_dir = Path(sysfs_root) / "class" / "kfd" / "kfd"
        self.devices = {}
        nodes = read_gpu_nodes(kfd_dir / "topology")         # the topology this kernel published
        for node in nodes:
            gfxv = node.gfx_target_version
            sizes = node_cwsr(node.props)
            node_id = partition_index(node, nodes)
            self.devices[node.gpu_id] = SimDevice(
                node.gpu_id, node, sizes, bool(parameters.get("cwsr_enable", 1)) and sizes is not None,
                gfxv >= 110000, 255 if gfxv in (90403, 90402, 90404, 90500) else 127,
                node_id=node_id, sdma=SdmaLayout.of(node, node_id, self.abi.minor))
        self.processes = {}
        self.signal_pages = {}        # pid -> SignalPage, once the process has one (kfd_process.signal_page)
        self.mapped_on = {}           # (pid, handle) -> gpu_ids the BO is mapped on (kfd_mem_attachment.is_mapped)
        self.patched_preempt = False
        self.sysfs = ProcSysfs(kfd_dir / "proc", profile)
        self.smi = SmiHub(profile)
        self.timing = TimingModel(self)
        self._handlers = {
            "GET_VERSION": self.get_version, "CREATE_QUEUE": self.create_queue,
            "DESTROY_QUEUE": self.destroy_queue, "UPDATE_QUEUE": self.update_queue,
            "SET_CU_MASK": self.set_cu_mask, "GET_QUEUE_WAVE_STATE": self.get_queue_wave_state,
            "ALLOC_MEMORY_OF_GPU": self.alloc_memory, "FREE_MEMORY_OF_GPU": self.free_memory,
            "MAP_MEMORY_TO_GPU": self.map_memory, "UNMAP_MEMORY_FROM_GPU": self.map_memory,
            "AVAILABLE_MEMORY": self.available_memory,
            "GET_CLOCK_COUNTERS": self.get_clock_counters,
            "GET_PROCESS_APERTURES_NEW": self.get_process_apertures_new,
            "CREATE_EVENT": self.create_event, "DESTROY_EVENT": self.destroy_event,
            "SET_EVENT": self.set_event, "RESET_EVENT": self.set_event, "WAIT_EVENTS": self.wait_events,
            "SET_XNACK_MODE": self.set_xnack_mode, "SMI_EVENTS": self.smi_events,
            "CRIU_OP": self.criu_op, "PROFILER": self.profiler,
        }
        self.dbg = DbgTrap(self)
        self._handlers["RUNTIME_ENABLE"] = self.dbg.runtime_enable
        self._handlers["DBG_TRAP"] = self.dbg.dbg_trap

    # --- process lifetime ---------------------------------------------------------------------
    def open_process(self, pid, uid):
        """kfd_open: creates the kfd_process and proc/<pid> (kfd_process.c:828-875)."""
        proc = self.processes.get(pid)
        if proc is None:
            # its name read now: at its PROCESS_END /proc may show it no more
            proc = SimProcess(pid, uid, tuple(self.devices), _comm(pid))
            self.processes[pid] = proc
            self.sysfs.add_process(pid, proc.gpu_ids, {g for g, d in self.devices.items() if d.svm})
            self.smi.emit(c.KFD_SMI_EVENT_PROCESS_START, 0, f"{pid:x} {proc.comm}\n", self.devices)
        return proc

    def create_process(self, pid):
        """kfd_process.c: kfd_create_process for a process that has not opened /dev/kfd, as DBG_TRAP
        ENABLE does for its ptrace parent. None where it cannot be made (the pid is gone, or its exit
        cannot be watched, which the kernel's release needs)."""
        if self.watch_exit is None or not self.watch_exit(pid):
            return None
        try:
            uid = os.stat(f"/proc/{pid}").st_uid
        except OSError:
            return None
        return self.open_process(pid, uid)

    def release_process(self, pid):
        """kfd_process_notifier_release_internal: the process's mm is gone (exit, kill -9).
        Debug-disables itself and every target it was debugging, which resumes their suspended
        queues (kfd-abi.md §2b'), then destroys its queues and memory."""
        proc = self.processes.pop(pid, None)
        if proc is None:
            return
        proc.alive = False
        if proc.debug_trap_enabled:
            self.dbg.disable(proc)
        if proc.debugged_count > 0:
            for target in list(self.processes.values()):
                if target.debugger is proc:
                    self.dbg.disable(target)
                    if proc.debugged_count == 0:
                        break                         # as the kernel: it stops counting down at zero
        had_active = {q.gpu_id for q in proc.queues.values() if q.is_active}
        for q in list(proc.queues.values()):
            self._remove_queue(proc, q)
        for gpu in proc.gpu_ids:
            dev = self.devices[gpu]
            # process_termination_cpsch: one runlist update per HWS device of the process, queues or
            # not; on MES a REMOVE_QUEUE only for the queues that were mapped
            if not dev.uses_mes or gpu in had_active:
                self.execute_queues(dev)
        self.signal_pages.pop(pid, None)
        for key in [k for k in self.mapped_on if k[0] == pid]:
            del self.mapped_on[key]
        # its SMI fds stay: kfd_smi_ev_release ends a client at its file's last close only (one
        # passed to another process outlives the opener), which the hub sees as the peer's hangup
        self.sysfs.remove_process(pid)
        self.smi.emit(c.KFD_SMI_EVENT_PROCESS_END, 0, f"{pid:x} {proc.comm}\n", self.devices)

    # --- the dispatcher (kfd_chardev.c: kfd_ioctl) ---------------------------------------------
    def ioctl(self, proc, caller_pid, request, user_arg, mem, caller_uid=0):
        """kfd_chardev.c: kfd_ioctl. `proc` is the KFD process that opened this fd (None for a
        connection that never opened one), `caller_pid` the process making the call.
        Returns (retcode, bytes copied back to the caller's argument). Raises Blocked."""
        nr = ioctl_opt.IOC_NR(request)
        entry = BY_NR.get(nr)
        patched = nr in (0x87, 0x88) and self.patched_preempt
        if not patched and (entry is None or not self.abi.supports(entry.name)):
            return -errno.ENOTTY, b""             # the nr is checked before the fd's owner
        # only the opener may use the fd; for CRIU_OP also the opener's ptrace parent:
        # kfd_chardev.c: kfd_ioctl, `ptrace_parent(process->lead_thread) == current`, the calling
        # *thread* (ptrace attaches a thread to a thread), known and checked as DBG_TRAP's is
        # (DbgTrap._current / _is_current: by id and start time, after the tracer is read). Where the
        # calling thread is not known (the server names it only for calls from the opener's own
        # process), the calling process stands for it, as for DBG_TRAP
        criu_by_tracer = (proc is not None and entry is not None and entry.name == "CRIU_OP"
                          and self.dbg._is_current(ptrace_parent(proc.pid), self.dbg._current(caller_pid)))
        if proc is None or (caller_pid != proc.pid and not criu_by_tracer):
            return -errno.EBADF, b""
        if patched:
            return self._patched_preempt(proc, nr, user_arg)
        usize = ioctl_opt.IOC_SIZE(request)
        layout = self.abi.layout(entry.struct.__name__) if entry.struct else None
        ksize = ctypes.sizeof(layout) if layout else 0
        kdata = bytearray(max(usize, ksize))       # past usize it stays zero
        if "W" in entry.direction:
            # copy_from_user of usize bytes: what the caller did not ship is memory the simulator
            # cannot read, so the copy faults (-EFAULT, nothing copied back)
            if len(user_arg) < usize:
                return -errno.EFAULT, b""
            kdata[:usize] = user_arg[:usize]
        args = layout.from_buffer(kdata) if layout else None
        handler = self._handlers.get(entry.name, self.not_simulated)
        try:
            ret = handler(proc, args, mem, caller_uid) or 0
        except SimErrno as e:
            ret = -e.errno
        del args                                   # release the buffer export before slicing
        out = bytes(kdata[:usize]) if "R" in entry.direction else b""   # copied back even on error
        return ret, out

    def _patched_preempt(self, proc, nr, user_arg):
        """A patched kernel's PREEMPT_QUEUE (0x87) / RESUME_QUEUE (0x88) on the caller's own queue:
        {queue_id, preempt_type, timeout_ms, pad}. Not in any real kernel (kfd-abi.md §3)."""
        qid = int.from_bytes(bytes(user_arg[:4]), "little")
        q = proc.queues.get(qid)
        if q is None:
            return -errno.EINVAL, bytes(user_arg)
        dev = self.devices[q.gpu_id]
        q.sync_progress()
        if nr == 0x87 and not q.is_suspended:
            if q.is_active:
                self.timing.save_waves(dev, q, grace_period=None)
            q.is_suspended = True
            self.execute_queues(dev)
        elif nr == 0x88 and q.is_suspended:
            q.is_suspended = False
            self.execute_queues(dev)
            if q.is_active:
                self.timing.restore_waves(dev, q)
        q.sync_progress()
        return 0, bytes(user_arg)

    def write_wave_state_headers(self, proc):
        """kfd_device_queue_manager.c: copy_context_work_handler, run after a debugger suspend:
        the MQD's get_wave_state for every compute queue of the process, active or not, written
        at its ctx_save_restore_address in the target's memory; errors are ignored. The
        target's memory the simulator can reach is its GPU buffer objects."""
        target_memory = UserMemory()
        for q in proc.queues.values():
            if q.is_compute:
                try:
                    self.mqd_get_wave_state(self.devices[q.gpu_id], q, q.ctx_save_restore_address,
                                            target_memory, proc)
                except SimErrno:
                    pass

    def mqd_get_wave_state(self, dev, q, ctl_stack, mem, proc):
        """The MQD manager's get_wave_state (kfd_mqd_manager_v9.c / _v10.c / _v11.c / _v12.c:
        get_wave_state). The MQD's control stack grows down from cp_hqd_cntl_stack_size
        (= the queue's ctl_stack_size) and the wave save area grows up from it, so
        cp_hqd_cntl_stack_offset = ctl_stack_size - ctl_stack_used_size and
        cp_hqd_wg_state_offset = ctl_stack_size + save_area_used_size. gfx9 writes the 16-byte
        header at `ctl_stack` and copies the control stack (kept one page after the MQD) to
        ctl_stack + cntl_stack_offset; GC 9.4.3+ repeats both per XCC at
        ctl_stack + xcc * ctx_save_restore_area_size (get_wave_state_v9_4_3); gfx10 and later
        write the header only (their control stack is already in user memory); gfx8 (VI)
        writes nothing. Returns XCC 0's (ctl_stack_used_size, save_area_used_size)."""
        ctl_used, wave_used = q.saved_ctl_stack_bytes, q.saved_wave_bytes
        cntl_stack_offset = q.ctl_stack_size - ctl_used
        header = bytes(s.kfd_context_save_area_header_wave_state(
            cntl_stack_offset, ctl_used, q.ctl_stack_size + wave_used, wave_used))
        gfxv = dev.gfx_target_version
        if gfxv < 90000:
            return ctl_used, wave_used
        for xcc in range(dev.num_xcc if dev.mqd_per_xcc else 1):
            base = ctl_stack + xcc * q.ctx_save_restore_size
            mem.write(base, header, proc.bos.values())
            if gfxv < 100000:
                # no waves run here: the saved control stack's contents are zeros
                mem.write(base + cntl_stack_offset, bytes(ctl_used), proc.bos.values())
        return ctl_used, wave_used

    def not_simulated(self, proc, args, mem, uid):
        raise SimErrno(errno.EOPNOTSUPP, "not simulated")

    # --- helpers -------------------------------------------------------------------------------
    def device(self, gpu_id):
        dev = self.devices.get(gpu_id)
        if dev is None:
            raise SimErrno(errno.EINVAL, f"no GPU with gpu_id {gpu_id}")
        return dev

    @property
    def checks_queue_buffers(self):
        """kfd_queue_acquire_buffers and the BOs' queue_refcount exist (QUEUE_BUFFERS_CHECKED_SINCE)."""
        return self.abi.minor >= QUEUE_BUFFERS_CHECKED_SINCE

    def find_bo(self, proc, gpu_id, addr, size, what):
        """kfd_queue.c: kfd_queue_buffer_get, which works in GPU pages (AMDGPU_GPU_PAGE_SHIFT 12):
        amdgpu_vm_bo_lookup_mapping(vm, addr >> 12) in the VM of GPU `gpu_id` (the queue's) finds the
        mapping holding that page (a BO allocated but not mapped there with MAP_MEMORY_TO_GPU has none
        in it); the page must be the mapping's first (`user_addr != mapping->start`: an address
        anywhere inside the first page passes) and, unless `size >> 12` is 0 (then only the start is
        checked), the mapping's last page must be `size >> 12 - 1` pages further
        (`user_addr + size - 1 != mapping->last`). Anything else is -EINVAL."""
        page, pages = addr >> 12, size >> 12
        for bo in proc.bos.values():
            first = bo.va >> 12                          # a mapping covers the BO's whole pages
            last = first + (page_align(bo.size) >> 12) - 1
            if first <= page <= last:
                if gpu_id not in self.mapped_on.get((proc.pid, bo.handle), ()):
                    raise SimErrno(errno.EINVAL, f"{what}: the BO at {bo.va:#x} is not mapped on {gpu_id:#x}")
                if page != first:
                    raise SimErrno(errno.EINVAL, f"{what}: {addr:#x} is past the first page of a mapping "
                                                 f"that starts at {bo.va:#x}")
                if pages and page + pages - 1 != last:
                    raise SimErrno(errno.EINVAL, f"{what}: mapping is {last - first + 1} pages, "
                                                 f"expected {pages}")
                return bo
        raise SimErrno(errno.EINVAL, f"{what}: {addr:#x} is not mapped")

    def acquire_queue_buffers(self, proc, dev, a, meta, is_compute):
        """kfd_queue.c: kfd_queue_acquire_buffers, in its order: the write and read pointers (one page
        each), the ring, then for compute queues the EOP buffer where one is given and the CWSR area
        (its sizes first), each looked up as a GPU VA mapping on the queue's GPU (find_bo). Returns
        the BOs found, by name: the queue keeps them (SimQueue.buffers), and each is a queue_refcount
        on its mapping until the queue gives it back (`queue_holds`). On an error none is kept, as
        the kernel gives back those it took (kfd_queue_unref_bo_vas)."""
        gpu, cwsr = dev.gpu_id, dev.cwsr
        taken = {"wptr": self.find_bo(proc, gpu, a.write_pointer_address, 4096, "wptr"),
                 "rptr": self.find_bo(proc, gpu, a.read_pointer_address, 4096, "rptr")}
        # the ring as expected_queue_size: PAGE_ALIGN(queue_size + metadata_queue_size) in 7.2,
        # queue_size as given in 6.12 (under a page: only the ring's start is checked)
        ring = a.ring_size + meta
        if self.profile.queue_size_page_aligned:
            ring = page_align(ring)
        taken["ring"] = self.find_bo(proc, gpu, a.ring_base_address, ring, "ring")
        if is_compute and a.eop_buffer_address:
            # an EOP buffer, where one is given (AQL queues on gfx9.4.x need none), is at least
            # the node's size and one mapping of that, in pages
            eop_size = cwsr.eop_buffer_size if cwsr else 4096
            if a.eop_buffer_size < eop_size:
                raise SimErrno(errno.EINVAL, f"eop_buffer_size {a.eop_buffer_size} < the node's {eop_size}")
            taken["eop"] = self.find_bo(proc, gpu, a.eop_buffer_address, page_align(a.eop_buffer_size), "eop")
        if is_compute and dev.cwsr_enabled:
            if a.ctl_stack_size != cwsr.ctl_stack_size:
                raise SimErrno(errno.EINVAL, "ctl_stack_size must equal the node's")
            if a.ctx_save_restore_size < cwsr.cwsr_size:
                raise SimErrno(errno.EINVAL, "ctx_save_restore_size < cwsr_size")
            mapping = page_align((a.ctx_save_restore_size + cwsr.debug_memory_size) * cwsr.num_xcc)
            # (the kernel's fallback, an SVM range, does not exist here: SVM is not simulated)
            taken["cwsr"] = self.find_bo(proc, gpu, a.ctx_save_restore_address, mapping, "cwsr")
        return taken

    @staticmethod
    def queue_holds(proc, handle, gpu_id):
        """The BO's mapping on `gpu_id` has a queue_refcount (struct amdgpu_bo_va, one per BO and VM):
        a live queue of the process on that GPU took it (kfd_queue_buffer_get) and has not given it
        back (pqm_destroy_queue, pqm_update_queue_properties: kfd_queue_unref_bo_va)."""
        bo = proc.bos.get(handle)
        return any(b is bo for q in proc.queues_on(gpu_id) for b in q.buffers.values())

    def execute_queues(self, dev, grace_period=None):
        """HWS: unmap every dynamic queue of the device, then map the active ones again
        (execute_queues_cpsch). The timing model charges the stall to every active queue."""
        dev.remaps += 1
        return self.timing.device_remap(dev, grace_period)

    # --- queues (kfd_chardev.c:252-470, kfd_queue.c:234-341) ----------------------------------
    def create_queue(self, proc, a, mem, uid):
        if (a.queue_percentage & 0xFF) > c.KFD_MAX_QUEUE_PERCENTAGE:
            raise SimErrno(errno.EINVAL)
        if a.queue_priority > c.KFD_MAX_QUEUE_PRIORITY:
            raise SimErrno(errno.EINVAL)
        # set_queue_properties_from_user's order: the ring's address, its size a power of 2 or 0,
        # then a size below the minimum clamped to it (copied back: CREATE_QUEUE is IOWR), then the
        # other pointers
        if not access_ok(a.ring_base_address):
            raise SimErrno(errno.EFAULT)
        if a.ring_size and a.ring_size & (a.ring_size - 1):
            raise SimErrno(errno.EINVAL)
        a.ring_size = max(a.ring_size, c.KFD_MIN_QUEUE_RING_SIZE)
        meta = getattr(a, "metadata_ring_size", 0)
        if meta and meta & (meta - 1):
            raise SimErrno(errno.EINVAL)
        for addr in (a.write_pointer_address, a.read_pointer_address, a.eop_buffer_address,
                     a.ctx_save_restore_address):
            if not access_ok(addr):
                raise SimErrno(errno.EFAULT)
        if QUEUE_TYPES_SINCE.get(a.queue_type, 99) > self.abi.minor:
            raise SimErrno(ENOTSUPP)
        dev = self.device(a.gpu_id)
        sdma_engine_id = getattr(a, "sdma_engine_id", 0)
        if a.queue_type == c.KFD_IOC_QUEUE_TYPE_SDMA_BY_ENG_ID:
            if sdma_engine_id >= dev.sdma.engines + dev.sdma.xgmi_engines:
                raise SimErrno(errno.EINVAL)
        is_compute = a.queue_type in (c.KFD_IOC_QUEUE_TYPE_COMPUTE, c.KFD_IOC_QUEUE_TYPE_COMPUTE_AQL)
        # kfd_ioctl_create_queue: kfd_queue_acquire_buffers before pqm_create_queue, whose failure
        # gives the buffers back (err_create_queue: kfd_queue_unref_bo_vas, kfd_queue_release_buffers):
        # here they are held only by the queue made below
        taken = self.acquire_queue_buffers(proc, dev, a, meta, is_compute) if self.checks_queue_buffers else {}
        if len(proc.queues_on(dev.gpu_id)) >= dev.max_queues_per_process:
            raise SimErrno(errno.ENOSPC)
        qid = proc.lowest_free_qid()
        if qid is None:
            raise SimErrno(errno.ENOMEM)
        # dqm's create_queue (create_queue_cpsch / _nocpsch): allocate_sdma_queue, then allocate_doorbell
        sdma = None if is_compute else self.allocate_sdma_queue(dev, a.queue_type, sdma_engine_id)
        # kfd_device_queue_manager.c: allocate_sdma_queue turns an SDMA_BY_ENG_ID queue into
        # KFD_QUEUE_TYPE_SDMA or KFD_QUEUE_TYPE_SDMA_XGMI by the engine it got (q->properties.type),
        # before pqm_create_queue adds its procfs entry: sysfs `type` (kfd_process.c:
        # kfd_procfs_queue_show prints properties.type) and the DBG_TRAP queue snapshot
        # (set_queue_type_for_user) show that type, never SDMA_BY_ENG_ID
        queue_type = a.queue_type
        if queue_type == c.KFD_IOC_QUEUE_TYPE_SDMA_BY_ENG_ID:
            queue_type = c.KFD_IOC_QUEUE_TYPE_SDMA_XGMI if sdma[0] else c.KFD_IOC_QUEUE_TYPE_SDMA
        q = SimQueue(qid, dev.gpu_id, queue_type, a.ring_base_address, a.ring_size,
                     a.write_pointer_address, a.read_pointer_address, a.ctx_save_restore_address,
                     a.ctx_save_restore_size, a.ctl_stack_size, a.queue_percentage & 0xFF, a.queue_priority,
                     (a.queue_percentage >> 8) & 0xFF, meta, buffers=taken)
        if sdma is not None:
            q.sdma_xgmi, q.sdma_id, q.sdma_engine_id, q.sdma_queue_id = sdma
        q.doorbell_id = self.allocate_doorbell(proc, dev, q)
        q.is_evicted = proc.evicted_since is not None
        # kfd_device_queue_manager.c: create_queue_cpsch: a debugged process's new queue on a
        # GC 11.0.0-11.0.3 device starts under the debugger's CU workaround
        q.is_dbg_wa = proc.debug_trap_enabled and dev.has_cwsr_workaround
        proc.queues = {qid: q, **proc.queues}            # list_add: the newest queue comes first
        self.sysfs.add_queue(proc.pid, qid, q.ring_size, self._sysfs_type(q.queue_type), dev.gpu_id)
        if q.is_active:                                  # create_queue_cpsch maps only an active queue
            self.execute_queues(dev)
        a.queue_id = qid
        # kfd_ioctl_create_queue: the doorbell's mmap offset names the GPU and, on SOC15, the
        # doorbell's byte offset in the process's doorbell pages (pqm_create_queue: (doorbell_off -
        # first_db_index) * 4, amdgpu_doorbell_index_on_bar counting 8-byte doorbells in dwords)
        a.doorbell_offset = KFD_MMAP_TYPE_DOORBELL | (dev.gpu_id << 46)
        if dev.gfx_target_version >= 90000:
            a.doorbell_offset |= q.doorbell_id * SOC15_DOORBELL_SIZE
        return 0

    def allocate_sdma_queue(self, dev, queue_type, engine_id):
        """kfd_device_queue_manager.c: allocate_sdma_queue: the lowest free bit of the device's SDMA
        bitmap (every process's SDMA queues on it share it; reserved queues masked out), engine =
        bit % engines and queue = bit / engines; SDMA_XGMI the same in the XGMI bitmap, its engines
        numbered after the PCIe ones; SDMA_BY_ENG_ID the first free bit of the named engine. A full
        bitmap (no SDMA engine of that kind at all, included) is -ENOMEM. Returns (xgmi, sdma_id,
        sdma_engine_id, sdma_queue_id)."""
        sd = dev.sdma
        used = {False: set(), True: set()}
        for p in self.processes.values():
            for q in p.queues_on(dev.gpu_id):
                if q.sdma_id is not None:
                    used[q.sdma_xgmi].add(q.sdma_id)
        pcie = [i for i in range(sd.engines * sd.reserved, sd.engines * sd.queues_per_engine)
                if i not in used[False]]
        xgmi = [i for i in range(sd.xgmi_engines * sd.queues_per_engine) if i not in used[True]]
        if queue_type == c.KFD_IOC_QUEUE_TYPE_SDMA_BY_ENG_ID:
            on_xgmi = engine_id >= sd.engines
            engines = sd.xgmi_engines if on_xgmi else sd.engines
            start = engine_id - sd.engines if on_xgmi else engine_id
            free = [i for i in (xgmi if on_xgmi else pcie) if i >= start and (i - start) % engines == 0]
            if not free:
                raise SimErrno(errno.ENOMEM, f"no more SDMA queue to allocate for engine {engine_id}")
            return on_xgmi, free[0], engine_id, free[0] // engines
        if queue_type == c.KFD_IOC_QUEUE_TYPE_SDMA_XGMI:
            if not xgmi:
                raise SimErrno(errno.ENOMEM, "no more XGMI SDMA queue to allocate")
            return True, xgmi[0], sd.engines + xgmi[0] % sd.xgmi_engines, xgmi[0] // sd.xgmi_engines
        if not pcie:
            raise SimErrno(errno.ENOMEM, "no more SDMA queue to allocate")
        return False, pcie[0], pcie[0] % sd.engines, pcie[0] // sd.engines

    def allocate_doorbell(self, proc, dev, q):
        """kfd_device_queue_manager.c: allocate_doorbell: before SOC15 the queue id; an SDMA queue's
        is static, its engine's first doorbell (amdgpu's sdma_doorbell_idx) + (queue & 1) *
        KFD_QUEUE_DOORBELL_MIRROR_OFFSET + (queue >> 1); a compute queue takes the lowest free bit
        of its process's doorbell bitmap on the device (qpd->doorbell_bitmap, which only compute
        queues use: deallocate_doorbell frees it at destroy). init_doorbell_bitmap reserves the
        non-CP range first_non_cp..last_non_cp (and 512 above): it starts at 0xF0 or later, past
        any bit a process's 127 (255 on GC 9.4.3+) queues reach, and -EBUSY (none free) cannot
        happen either."""
        if dev.gfx_target_version < 90000:
            return q.qid
        if q.sdma_id is not None:
            base = dev.sdma.doorbells[q.sdma_engine_id]
            return base + (q.sdma_queue_id & 1) * KFD_QUEUE_DOORBELL_MIRROR_OFFSET + (q.sdma_queue_id >> 1)
        taken = {other.doorbell_id for other in proc.queues_on(dev.gpu_id) if other.sdma_id is None}
        return next(i for i in itertools.count() if i not in taken)

    def _sysfs_type(self, queue_type):
        if queue_type in (c.KFD_IOC_QUEUE_TYPE_COMPUTE, c.KFD_IOC_QUEUE_TYPE_COMPUTE_AQL):
            return SYSFS_COMPUTE
        if queue_type == c.KFD_IOC_QUEUE_TYPE_SDMA:
            return SYSFS_SDMA
        shift = 1 if self.profile.has_diq else 0
        return (3 if queue_type == c.KFD_IOC_QUEUE_TYPE_SDMA_XGMI else 4) + shift

    def find_queue(self, proc, qid, err=errno.EFAULT):
        q = proc.queues.get(qid)
        if q is None:
            raise SimErrno(err, f"no queue {qid} in process {proc.pid}")
        return q

    def destroy_queue(self, proc, a, mem, uid):
        q = self.find_queue(proc, a.queue_id, errno.EINVAL)
        # kfd_process_queue_manager.c: pqm_destroy_queue gives back the queue_refcount of its buffers'
        # mappings (kfd_queue_unref_bo_vas) before dqm's destroy_queue, so they drop even while that
        # sleeps on a suspended queue (and a second destroy's EBUSY has none left to give)
        q.buffers = {}
        # its procfs entry goes once dqm's destroy_queue has returned (pqm_destroy_queue calls
        # kfd_procfs_del_queue after it since 6.12; 6.1 before it, which no 6.1 call can tell: its
        # destroy never sleeps on a suspended queue, having no DBG_TRAP): listed while the destroy
        # sleeps, and after a second destroy's EBUSY
        if q.is_suspended and proc.debug_trap_enabled:
            if q.being_destroyed:
                raise SimErrno(errno.EBUSY)
            q.being_destroyed = True                # sleeps until the debugger resumes the queue
            raise Blocked(ready=lambda: not q.is_suspended or not proc.alive,
                          finish=lambda: self._finish_destroy(proc, q))
        return self._finish_destroy(proc, q)

    def _finish_destroy(self, proc, q):
        q.being_destroyed = False
        if proc.queues.get(q.qid) is q:
            was_active = q.is_active
            self._remove_queue(proc, q)
            if was_active:                               # destroy_queue_cpsch unmaps only an active queue
                self.execute_queues(self.devices[q.gpu_id])
            if proc.debug_trap_enabled:                  # ... and raises a device event for a debugger
                mask = c.KFD_EC_MASK(c.EC_DEVICE_QUEUE_DELETE)       # (kfd_dbg_ev_raise, source -1)
                proc.device_exceptions[q.gpu_id] = proc.device_exceptions.get(q.gpu_id, 0) | mask
        return 0

    def _remove_queue(self, proc, q):
        q.sync_progress()
        proc.queues.pop(q.qid, None)
        q.buffers = {}                                   # kfd_queue_release_buffers
        self.sysfs.remove_queue(proc.pid, q.qid)

    def update_queue(self, proc, a, mem, uid):
        """kfd_chardev.c: kfd_ioctl_update_queue, kfd_process_queue_manager.c:
        pqm_update_queue_properties and kfd_device_queue_manager.c: update_queue."""
        if (a.queue_percentage & 0xFF) > c.KFD_MAX_QUEUE_PERCENTAGE or a.queue_priority > c.KFD_MAX_QUEUE_PRIORITY:
            raise SimErrno(errno.EINVAL)
        if a.ring_base_address and not access_ok(a.ring_base_address):
            raise SimErrno(errno.EFAULT)
        if a.ring_size and a.ring_size & (a.ring_size - 1):
            raise SimErrno(errno.EINVAL)
        ring_size = max(a.ring_size, c.KFD_MIN_QUEUE_RING_SIZE)
        q = self.find_queue(proc, a.queue_id)
        dev = self.devices[q.gpu_id]
        if self.checks_queue_buffers and a.ring_base_address and ring_size:
            # kfd_process_queue_manager.c: pqm_update_queue_properties: the new ring is looked up in
            # the queue's GPU VM (kfd_queue_buffer_get, which passes the size as it is: under a page
            # only the start counts), -EFAULT if it is not one mapping of that size; then the old
            # ring's mapping gives back its queue_refcount (kfd_queue_unref_bo_va) and the new one
            # keeps the one just taken. A NULL ring (disabling the queue) keeps the old ring's.
            try:
                ring = self.find_bo(proc, q.gpu_id, a.ring_base_address, ring_size + q.metadata_ring_size, "ring")
            except SimErrno:
                raise SimErrno(errno.EFAULT, "the ring is not one mapping of its size on the queue's GPU") from None
            q.buffers["ring"] = ring
        # pqm_update_queue_properties writes the queue's properties, then calls dqm's update_queue
        q.sync_progress()
        was_active = q.is_active
        q.ring_base, q.ring_size = a.ring_base_address, ring_size
        q.percent, q.priority = a.queue_percentage & 0xFF, a.queue_priority
        q.pm4_target_xcc = (a.queue_percentage >> 8) & 0xFF
        self.sysfs.set_queue_size(proc.pid, q.qid, q.ring_size)     # kfd_procfs_queue_show: queue_size
        # kfd_device_queue_manager.c: update_queue: under HWS (MES or not), once the queues are
        # unmapped, a process with a reset queue gets -EACCES ("queue is reset so inaccessable"):
        # the properties above stay written, the MQD is not updated and nothing is mapped again.
        # (Nothing in the simulator resets a queue yet: has_reset_queue stays False.)
        if (proc.has_reset_queue and self.abi.minor >= RESET_QUEUE_EACCES_SINCE
                and self.params.get("sched_policy", 0) != 2):
            q.sync_progress()
            raise SimErrno(errno.EACCES, "queue is reset so inaccessable")
        if was_active and not q.is_active:
            self.timing.save_waves(dev, q, grace_period=None)
        self.execute_queues(dev)
        q.sync_progress()
        return 0

    def set_cu_mask(self, proc, a, mem, uid):
        """kfd_chardev.c: kfd_ioctl_set_cu_mask (a bit count of 0 or not a multiple of 32 is
        EINVAL; more than 1024 bits are cut to 1024; the words are copied in, EFAULT), then
        kfd_process_queue_manager.c: pqm_update_mqd: unknown qid EFAULT; a queue under the
        debugger's CU workaround EBUSY; on GC 10.0.0 up to (not incl.) 12.1.0, whose CUs come in
        WGP pairs, a pair with one CU enabled EINVAL."""
        if a.num_cu_mask == 0 or a.num_cu_mask % 32:
            raise SimErrno(errno.EINVAL)
        bits = min(a.num_cu_mask, MAX_CU_MASK_BITS)
        raw = mem.read(a.cu_mask_ptr, bits // 8)
        q = self.find_queue(proc, a.queue_id)
        if q.is_dbg_wa:
            raise SimErrno(errno.EBUSY, "the debugger's CU workaround masks this queue")
        dev = self.devices[q.gpu_id]
        mask = int.from_bytes(raw, "little")
        if dev.cus_in_pairs and any((mask >> i) & 0b11 in (0b01, 0b10) for i in range(0, bits, 2)):
            raise SimErrno(errno.EINVAL, "CUs must be enabled in adjacent pairs")
        q.cu_mask = tuple(int.from_bytes(raw[i:i + 4], "little") for i in range(0, len(raw), 4))
        self.execute_queues(dev)
        q.is_user_cu_masked = True
        return 0

    def get_queue_wave_state(self, proc, a, mem, uid):
        """kfd_process_queue_manager.c: pqm_get_wave_state (unknown qid: EFAULT), then
        kfd_device_queue_manager.c: get_wave_state (EINVAL unless an inactive compute queue on a
        device with CWSR), then the MQD's get_wave_state into the caller's memory at
        ctl_stack_address. The sizes are filled before the copies, so they come back even when
        a copy faults."""
        q = self.find_queue(proc, a.queue_id)
        dev = self.devices[q.gpu_id]
        if not q.is_compute or q.is_active or not dev.cwsr_enabled:
            raise SimErrno(errno.EINVAL)
        a.ctl_stack_used_size, a.save_area_used_size = q.saved_ctl_stack_bytes, q.saved_wave_bytes
        self.mqd_get_wave_state(dev, q, a.ctl_stack_address, mem, proc)
        return 0

    # --- memory ---------------------------------------------------------------------------------
    def alloc_memory(self, proc, a, mem, uid):
        """kfd_chardev.c: kfd_ioctl_alloc_memory_of_gpu and amdgpu_amdkfd_gpuvm.c:
        amdgpu_amdkfd_gpuvm_alloc_memory_of_gpu: a size and a domain (VRAM, GTT, USERPTR,
        DOORBELL or MMIO_REMAP) are needed, a USERPTR its user address in mmap_offset (-EINVAL);
        VRAM beyond what the partition has left is -ENOMEM (amdgpu_amdkfd_reserve_mem_limit)."""
        dev = self.device(a.gpu_id)
        domains = (c.KFD_IOC_ALLOC_MEM_FLAGS_VRAM | c.KFD_IOC_ALLOC_MEM_FLAGS_GTT | c.KFD_IOC_ALLOC_MEM_FLAGS_USERPTR
                   | c.KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL | c.KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP)
        if a.size == 0 or not access_ok(a.va_addr) or not a.flags & domains:
            raise SimErrno(errno.EINVAL)
        # the gpuvm allocator's branches go VRAM, GTT, then USERPTR, then DOORBELL or MMIO_REMAP: a
        # userptr's address is asked only where neither of the first two is
        plain = a.flags & (c.KFD_IOC_ALLOC_MEM_FLAGS_VRAM | c.KFD_IOC_ALLOC_MEM_FLAGS_GTT)
        if not plain and a.flags & c.KFD_IOC_ALLOC_MEM_FLAGS_USERPTR and not a.mmap_offset:
            raise SimErrno(errno.EINVAL, "a userptr allocation names its user address in mmap_offset")
        # kfd_ioctl_alloc_memory_of_gpu: the process's doorbell slice (kfd_doorbell_process_slice: a
        # doorbell per queue, 8 bytes on SOC15, whole pages), else one page of MMIO
        if a.flags & c.KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL:
            if a.size != doorbell_slice(dev):
                raise SimErrno(errno.EINVAL, f"a doorbell allocation is {doorbell_slice(dev)} bytes")
        elif a.flags & c.KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP and a.size != 4096:
            raise SimErrno(errno.EINVAL, "an MMIO remap allocation is one page")
        # amdgpu_amdkfd_reserve_mem_limit: VRAM used in page-aligned bytes (vram_used; the 2 MiB
        # steps are AVAILABLE_MEMORY's count, vram_used_aligned) plus this BO beyond the partition's
        if a.flags & c.KFD_IOC_ALLOC_MEM_FLAGS_VRAM and (
                self._vram_used(dev) + vram_charge(a.size, a.flags) > self._vram_size(dev)):
            raise SimErrno(errno.ENOMEM)
        if any(bo.va < a.va_addr + a.size and a.va_addr < bo.va + bo.size for bo in proc.bos.values()):
            raise SimErrno(errno.EINVAL, "VA range overlaps an existing mapping")
        # MAKE_HANDLE(gpu_id, idr_handle): the lowest free id of the device's alloc_idr
        # (kfd_process.c: kfd_process_device_create_obj_handle)
        in_use = {h & 0xFFFF_FFFF for h in proc.bos if h >> 32 == dev.gpu_id}
        handle = (dev.gpu_id << 32) | next(i for i in range(len(in_use) + 1) if i not in in_use)
        proc.bos[handle] = BufferObject(handle, a.va_addr, a.size, a.gpu_id, a.flags)
        if a.flags & c.KFD_IOC_ALLOC_MEM_FLAGS_VRAM:
            proc.vram[a.gpu_id] = proc.vram.get(a.gpu_id, 0) + vram_charge(a.size, a.flags)
            self.sysfs.set(proc.pid, f"vram_{a.gpu_id}", proc.vram[a.gpu_id])
        a.handle = handle
        # MMIO is mapped through the kfd device: a kfd mmap offset naming the GPU; other BOs' offsets
        # are DRM's (here a stand-in)
        a.mmap_offset = (KFD_MMAP_TYPE_MMIO | (dev.gpu_id << 46) if a.flags & c.KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP
                         else handle << 12)
        return 0

    def free_memory(self, proc, a, mem, uid):
        """kfd_chardev.c: kfd_ioctl_free_memory_of_gpu: the process's signal page BO -> EPERM; no
        device for the handle's gpu_id, or no such idr handle -> EINVAL; a BO still mapped on a GPU
        -> EBUSY and the handle stays (amdgpu_amdkfd_gpuvm.c: amdgpu_amdkfd_gpuvm_free_memory_of_gpu
        checks mapped_to_gpu_memory before anything is released). That is also what refuses to free
        a live queue's buffer from 6.12 on: it stays mapped, its unmap being -EBUSY (map_memory);
        the free path itself never looks at queue_refcount."""
        page = self.signal_pages.get(proc.pid)
        if page is not None and page.handle == a.handle:
            raise SimErrno(errno.EPERM)
        if a.handle not in proc.bos:
            raise SimErrno(errno.EINVAL)
        if self.mapped_on.get((proc.pid, a.handle)):
            raise SimErrno(errno.EBUSY)
        bo = proc.bos.pop(a.handle)
        self.mapped_on.pop((proc.pid, a.handle), None)
        if bo.flags & c.KFD_IOC_ALLOC_MEM_FLAGS_VRAM:
            proc.vram[bo.gpu_id] -= vram_charge(bo.size, bo.flags)
            self.sysfs.set(proc.pid, f"vram_{bo.gpu_id}", proc.vram[bo.gpu_id])
        return 0

    def map_memory(self, proc, a, mem, uid):
        """kfd_chardev.c: kfd_ioctl_map_memory_to_gpu / kfd_ioctl_unmap_memory_from_gpu, in their
        order: no devices or n_success > n_devices -> EINVAL; the id array is copied in (EFAULT);
        the handle's gpu_id must be one of the process's devices (EINVAL) and the handle known
        (ENOMEM); then devices n_success.. are done one by one, n_success counting them, so a
        bad gpu_id part-way leaves n_success at the devices done (copied back with the EINVAL).
        Mapping where the BO is mapped already does nothing; unmapping where it is not mapped
        is -EINVAL (amdgpu_amdkfd_gpuvm.c: amdgpu_amdkfd_gpuvm_unmap_memory_from_gpu, "the BO
        wasn't actually mapped"), and where a queue holds its mapping on that GPU (the bo_va's
        queue_refcount, kfd_queue.c: kfd_queue_buffer_get; 6.12 on) -EBUSY (unmap_bo_from_gpuvm):
        it stays mapped there, n_success counting the devices done before."""
        if a.n_devices == 0 or a.n_success > a.n_devices:
            raise SimErrno(errno.EINVAL)
        raw = mem.read(a.device_ids_array_ptr, 4 * a.n_devices)
        if a.handle >> 32 not in proc.gpu_ids:
            raise SimErrno(errno.EINVAL)
        if a.handle not in proc.bos:
            raise SimErrno(errno.ENOMEM)
        mapped_on = self.mapped_on.setdefault((proc.pid, a.handle), set())
        unmap = isinstance(a, s.kfd_ioctl_unmap_memory_from_gpu_args)
        for i in range(a.n_success, a.n_devices):
            gpu_id = int.from_bytes(raw[4 * i:4 * i + 4], "little")
            if gpu_id not in proc.gpu_ids or (unmap and gpu_id not in mapped_on):
                raise SimErrno(errno.EINVAL)
            if unmap and self.queue_holds(proc, a.handle, gpu_id):
                raise SimErrno(errno.EBUSY, f"a queue uses this BO's mapping on GPU {gpu_id:#x}")
            (mapped_on.discard if unmap else mapped_on.add)(gpu_id)
            a.n_success = i + 1
        return 0

    def available_memory(self, proc, a, mem, uid):
        """kfd_chardev.c: kfd_ioctl_get_available_memory: a gpu_id not among the process's devices
        is -EINVAL; amdgpu_amdkfd_gpuvm.c: amdgpu_amdkfd_get_available_memory: the partition's
        VRAM less every process's VRAM BOs, each counted rounded up to VRAM_AVAILABLITY_ALIGN
        (vram_used_aligned), rounded down to it and never below 0. The kernel also subtracts
        page-table, pinned and RAS reserves this simulator does not know."""
        if a.gpu_id not in proc.gpu_ids:
            raise SimErrno(errno.EINVAL)
        a.available = self._vram_left(self.device(a.gpu_id)) // VRAM_AVAILABILITY_ALIGN * VRAM_AVAILABILITY_ALIGN
        return 0

    def _vram_left(self, dev):
        """AVAILABLE_MEMORY's count: the partition's VRAM less every process's VRAM BOs, each
        rounded up to VRAM_AVAILABLITY_ALIGN (vram_used_aligned), never below 0."""
        return max(0, self._vram_size(dev) - self._vram_used(dev, VRAM_AVAILABILITY_ALIGN))

    @staticmethod
    def _vram_size(dev):
        return sum(bank.get("size_in_bytes", 0) for bank in dev.node.mem_banks) or 64 << 30

    def _vram_used(self, dev, step=1):
        """Every process's VRAM BOs on `dev`, each charged as reserve_mem_limit does (vram_charge),
        rounded up to `step`."""
        return sum(-(-vram_charge(bo.size, bo.flags) // step) * step
                   for p in self.processes.values() for bo in p.bos.values()
                   if bo.gpu_id == dev.gpu_id and bo.flags & c.KFD_IOC_ALLOC_MEM_FLAGS_VRAM)

    def get_clock_counters(self, proc, a, mem, uid):
        self.device(a.gpu_id)
        now = clock.now_ns()
        a.gpu_clock_counter = now // 10          # 100 MHz reference clock
        a.cpu_clock_counter = a.system_clock_counter = now
        a.system_clock_freq = 1_000_000_000
        return 0

    def get_process_apertures_new(self, proc, a, mem, uid):
        if a.num_of_nodes == 0:
            a.num_of_nodes = len(proc.gpu_ids)
            return 0
        n = min(a.num_of_nodes, len(proc.gpu_ids))
        entry = s.kfd_process_device_apertures
        out = bytearray()
        for i, gpu in enumerate(proc.gpu_ids[:n]):
            base = (i + 1) << 48
            out += bytes(entry(base, base + (1 << 32) - 1, base + (2 << 32), base + (3 << 32) - 1,
                               0x1000_0000, (1 << 47) - 1, gpu, 0))
        mem.write(a.kfd_process_device_apertures_ptr, bytes(out))
        a.num_of_nodes = n
        return 0

    # --- events (kfd_events.c) ---------------------------------------------------------------------
    def create_event(self, proc, a, mem, uid):
        """kfd_chardev.c: kfd_ioctl_create_event, kfd_events.c: kfd_event_create. A non-zero
        event_page_offset names the BO to use as signal page (kfd_kmap_event_page). Signal and
        debug events take the lowest free id below the page's slot count (id 0 is reserved at
        kfd_event_init_process; a page the kernel allocates itself has 256 slots), -ENOSPC when
        the slots are used up (create_signal_event); others the lowest free id from
        KFD_FIRST_NONSIGNAL_EVENT_ID (create_other_event)."""
        if a.event_page_offset:
            self._set_signal_page(proc, a.event_page_offset)
        a.event_page_offset = 0
        if a.event_type in SIGNAL_EVENT_TYPES:
            slots = self.signal_pages.setdefault(proc.pid, SignalPage(DEFAULT_SIGNAL_SLOTS * 8, None)).size // 8
            in_use = 1 + sum(ev.type in SIGNAL_EVENT_TYPES for ev in proc.events.values())
            event_id = next((i for i in range(1, slots) if i not in proc.events), None)
            if in_use == slots or event_id is None:
                raise SimErrno(errno.ENOSPC)
            a.event_page_offset, a.event_slot_index = KFD_MMAP_TYPE_EVENTS, event_id
        else:
            event_id = next(i for i in itertools.count(KFD_FIRST_NONSIGNAL_EVENT_ID) if i not in proc.events)
        proc.events[event_id] = SimEvent(a.event_type, a.auto_reset != 0)
        a.event_id = a.event_trigger_data = event_id
        return 0

    def _set_signal_page(self, proc, handle):
        """kfd_events.c: kfd_kmap_event_page: only before any signal page exists, the handle's
        GPU must be one of the process's and the BO known (-EINVAL); its size sets the slots."""
        if proc.pid in self.signal_pages or handle >> 32 not in proc.gpu_ids or handle not in proc.bos:
            raise SimErrno(errno.EINVAL)
        bo = proc.bos[handle]
        # amdgpu_amdkfd_gpuvm_map_gtt_bo_to_kernel: a userptr BO cannot be mapped into the kernel,
        # and the page is the BO's size, whole pages
        if bo.flags & c.KFD_IOC_ALLOC_MEM_FLAGS_USERPTR:
            raise SimErrno(errno.EINVAL, "userptr can't be mapped to kernel")
        self.signal_pages[proc.pid] = SignalPage(page_align(bo.size), handle)

    def destroy_event(self, proc, a, mem, uid):
        """kfd_events.c: kfd_event_destroy: an unknown id (0 included) is -EINVAL."""
        if proc.events.pop(a.event_id, None) is None:
            raise SimErrno(errno.EINVAL)
        return 0

    def set_event(self, proc, a, mem, uid):
        """kfd_events.c: kfd_set_event / kfd_reset_event: unknown ids and events that only the GPU
        or the driver may signal (any type but SIGNAL, event_can_be_cpu_signaled) are -EINVAL.
        Nobody is ever asleep in a simulated wait, so a set event stays signaled until a wait
        consumes it (set_event: signaled = !auto_reset || !waitqueue_active)."""
        ev = proc.events.get(a.event_id)
        if ev is None or ev.type != c.KFD_IOC_EVENT_SIGNAL:
            raise SimErrno(errno.EINVAL)
        ev.signaled = isinstance(a, s.kfd_ioctl_set_event_args)
        if ev.signaled:                          # set_event: ++event_age, never wrapping back to 0 or 1
            ev.age = ev.age + 1 if ev.age < (1 << 64) - 1 else 2
        return 0

    def wait_events(self, proc, a, mem, uid):
        """kfd_events.c: kfd_wait_on_events. Each id in turn joins the wait (init_event_waiter):
        it counts as fired if signaled, and an auto-reset event is consumed by it, even when
        the wait then times out or a later id is unknown (-EINVAL, wait_result FAIL). COMPLETE
        when any (all, with wait_for_all) fired; no events at all is COMPLETE either way
        (test_event_condition). No GPU signals an event here, so the simulator answers at once:
        TIMEOUT where the kernel would sleep up to `timeout` for another thread's SET_EVENT.
        A SIGNAL event whose entry gives a last_event_age (0: none given) has fired if it was set
        since that age (init_event_waiter: event_age != last_event_age), and a COMPLETE wait writes
        each fired one's age back there (copy_signaled_event_data): how ROCr's waits miss no set
        that came between two of them."""
        a.wait_result = c.KFD_IOC_WAIT_RESULT_FAIL
        size = ctypes.sizeof(s.kfd_event_data)
        raw = mem.read(a.events_ptr, size * a.num_events)
        fired, aged = [], []
        for i in range(a.num_events):
            entry = s.kfd_event_data.from_buffer_copy(raw, i * size)
            ev = proc.events.get(entry.event_id)
            if ev is None:
                raise SimErrno(errno.EINVAL)
            activated = ev.signaled
            ev.signaled = ev.signaled and not ev.auto_reset
            if ev.type == c.KFD_IOC_EVENT_SIGNAL and entry.signal_event_data.last_event_age:
                activated = activated or ev.age != entry.signal_event_data.last_event_age
                aged.append((i, ev))
            fired.append(activated)
        done = all(fired) if a.wait_for_all or not fired else any(fired)
        a.wait_result = c.KFD_IOC_WAIT_RESULT_COMPLETE if done else c.KFD_IOC_WAIT_RESULT_TIMEOUT
        if done:
            for i, ev in aged:
                if fired[i]:
                    mem.write(a.events_ptr + i * size + AGE_OFFSET, ev.age.to_bytes(8, "little"))
        return 0

    def set_xnack_mode(self, proc, a, mem, uid):
        if a.xnack_enabled >= 0:
            if proc.queues:
                raise SimErrno(errno.EBUSY)
            proc.xnack = a.xnack_enabled
        a.xnack_enabled = proc.xnack
        return 0

    def smi_events(self, proc, a, mem, uid):
        if a.gpuid not in proc.gpu_ids:
            raise SimErrno(errno.EINVAL)
        a.anon_fd = self.smi.open_client(proc.pid, a.gpuid, suser=(uid == 0))
        return 0

    # --- CRIU pause (whole-process eviction) -------------------------------------------------
    def criu_op(self, proc, a, mem, uid):
        if uid != 0:
            raise SimErrno(errno.EACCES)
        if a.op == c.KFD_CRIU_OP_PROCESS_INFO:
            # kfd_chardev.c: criu_process_info + criu_get_process_object_info: objects are the
            # queues, events and SVM ranges (none here)
            self.evict_process(proc, c.KFD_QUEUE_EVICTION_CRIU_CHECKPOINT)
            proc.queues_paused = True
            a.pid = proc.pid
            a.num_devices, a.num_bos = len(proc.gpu_ids), len(proc.bos)
            a.num_objects = len(proc.queues) + len(proc.events)
            return 0
        if a.op == c.KFD_CRIU_OP_UNPAUSE:
            if not proc.queues_paused:
                raise SimErrno(errno.EINVAL)
            proc.queues_paused = False
            self.restore_process(proc)
            return 0
        raise SimErrno(errno.EOPNOTSUPP, "checkpoint/restore payloads are not simulated")

    def evict_process(self, proc, trigger):
        """kfd_process_evict_queues: SMI QUEUE_EVICTION per GPU, every queue unmapped."""
        if proc.evicted_since is not None:
            return
        proc.evicted_since = time.monotonic()
        ns = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        for gpu in proc.gpu_ids:
            self.smi.emit(c.KFD_SMI_EVENT_QUEUE_EVICTION, proc.pid, f"{ns} -{proc.pid} {gpu:x} {int(trigger)}\n",
                          [gpu])
        for dev in {self.devices[q.gpu_id] for q in proc.queues.values()}:
            for q in proc.queues_on(dev.gpu_id):
                q.sync_progress()
                was_active = q.is_active
                q.is_evicted = True
                if was_active:
                    self.timing.save_waves(dev, q, grace_period=None)
            self.execute_queues(dev)

    def restore_process(self, proc):
        if proc.evicted_since is None:
            return
        elapsed_ms = int((time.monotonic() - proc.evicted_since) * 1000)
        proc.evicted_since = None
        ns = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        for gpu in proc.gpu_ids:
            proc.evicted_ms[gpu] = proc.evicted_ms.get(gpu, 0) + elapsed_ms
            self.sysfs.set(proc.pid, f"stats_{gpu}/evicted_ms", proc.evicted_ms[gpu])
            self.smi.emit(c.KFD_SMI_EVENT_QUEUE_RESTORE, proc.pid, f"{ns} -{proc.pid} {gpu:x} 0\n", [gpu])
        for dev in {self.devices[q.gpu_id] for q in proc.queues.values()}:
            for q in proc.queues_on(dev.gpu_id):
                q.is_evicted = False
            self.execute_queues(dev)
            for q in proc.queues_on(dev.gpu_id):
                q.sync_progress()

    # --- profiler (1.23) -----------------------------------------------------------------------
    def profiler(self, proc, a, mem, uid):
        if a.op == c.KFD_IOC_PROFILER_VERSION:
            a.version = c.KFD_IOC_PROFILER_VERSION_NUM
            return 0
        if a.op == c.KFD_IOC_PROFILER_PMC:
            if uid != 0:
                raise SimErrno(errno.EPERM)            # perfmon_capable()
            self.device(a.pmc.gpu_id)
            # kfd_chardev.c: profile_lock_device: lock 1 takes the device (EALREADY if ours, EBUSY
            # if another's); lock 0 frees it if ours; anything else stays -EINVAL
            holder = next((p for p in self.processes.values() if a.pmc.gpu_id in p.profiler_locked), None)
            if a.pmc.lock == 1:
                if holder is proc:
                    raise SimErrno(errno.EALREADY)
                if holder is not None:
                    raise SimErrno(errno.EBUSY)
                proc.profiler_locked.add(a.pmc.gpu_id)
                return 0
            if a.pmc.lock == 0 and holder is proc:
                proc.profiler_locked.discard(a.pmc.gpu_id)
                return 0
            raise SimErrno(errno.EINVAL)
        raise SimErrno(errno.EINVAL)

    # --- GET_VERSION -----------------------------------------------------------------------------
    def get_version(self, proc, a, mem, uid):
        a.major_version, a.minor_version = self.abi.major, self.abi.minor
        return 0


def _comm(pid):
    """The task's comm, as KFD_EVENT_FMT_PROCESS prints it (kfd_smi_events.c:
    kfd_smi_event_process); empty once /proc no longer shows the process."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""
