"""The ioctl table: request numbers (computed with ioctl-opt) and ABI-version gates.

Every entry names the macro (``AMDKFD_IOC_<name>``), its nr, direction, argument struct and the
KFD minor version that introduced it (``kfd_ioctl.h`` version history, 1.1 = "initial version").
"""
import ctypes
from dataclasses import dataclass

import ioctl_opt

from . import structs as s

AMDKFD_IOCTL_BASE = ord("K")
AMDKFD_COMMAND_START = 0x01
AMDKFD_COMMAND_END = 0x29          # 1.23; 0x24 in 1.11, 0x27 in 1.13-1.18


@dataclass(frozen=True)
class Ioctl:
    name: str                      # AMDKFD_IOC_<name>
    nr: int
    direction: str                 # "", "R", "W" or "RW", from the caller's point of view
    struct: type | None
    since_minor: int

    @property
    def macro(self):
        return f"AMDKFD_IOC_{self.name}"

    def request(self, struct=None):
        """The request number for `struct` (default: this entry's newest layout)."""
        struct = struct or self.struct
        if self.direction == "":
            return ioctl_opt.IO(AMDKFD_IOCTL_BASE, self.nr)
        make = {"R": ioctl_opt.IOR, "W": ioctl_opt.IOW, "RW": ioctl_opt.IOWR}[self.direction]
        return make(AMDKFD_IOCTL_BASE, self.nr, struct)


IOCTLS = (
    Ioctl("GET_VERSION", 0x01, "R", s.kfd_ioctl_get_version_args, 1),
    Ioctl("CREATE_QUEUE", 0x02, "RW", s.kfd_ioctl_create_queue_args, 1),
    Ioctl("DESTROY_QUEUE", 0x03, "RW", s.kfd_ioctl_destroy_queue_args, 1),
    Ioctl("SET_MEMORY_POLICY", 0x04, "W", s.kfd_ioctl_set_memory_policy_args, 1),
    Ioctl("GET_CLOCK_COUNTERS", 0x05, "RW", s.kfd_ioctl_get_clock_counters_args, 1),
    Ioctl("GET_PROCESS_APERTURES", 0x06, "R", s.kfd_ioctl_get_process_apertures_args, 1),
    Ioctl("UPDATE_QUEUE", 0x07, "W", s.kfd_ioctl_update_queue_args, 1),
    Ioctl("CREATE_EVENT", 0x08, "RW", s.kfd_ioctl_create_event_args, 1),
    Ioctl("DESTROY_EVENT", 0x09, "W", s.kfd_ioctl_destroy_event_args, 1),
    Ioctl("SET_EVENT", 0x0A, "W", s.kfd_ioctl_set_event_args, 1),
    Ioctl("RESET_EVENT", 0x0B, "W", s.kfd_ioctl_reset_event_args, 1),
    Ioctl("WAIT_EVENTS", 0x0C, "RW", s.kfd_ioctl_wait_events_args, 1),
    Ioctl("DBG_REGISTER_DEPRECATED", 0x0D, "W", s.kfd_ioctl_dbg_register_args, 1),
    Ioctl("DBG_UNREGISTER_DEPRECATED", 0x0E, "W", s.kfd_ioctl_dbg_unregister_args, 1),
    Ioctl("DBG_ADDRESS_WATCH_DEPRECATED", 0x0F, "W", s.kfd_ioctl_dbg_address_watch_args, 1),
    Ioctl("DBG_WAVE_CONTROL_DEPRECATED", 0x10, "W", s.kfd_ioctl_dbg_wave_control_args, 1),
    Ioctl("SET_SCRATCH_BACKING_VA", 0x11, "RW", s.kfd_ioctl_set_scratch_backing_va_args, 1),
    Ioctl("GET_TILE_CONFIG", 0x12, "RW", s.kfd_ioctl_get_tile_config_args, 1),
    Ioctl("SET_TRAP_HANDLER", 0x13, "W", s.kfd_ioctl_set_trap_handler_args, 1),
    Ioctl("GET_PROCESS_APERTURES_NEW", 0x14, "RW", s.kfd_ioctl_get_process_apertures_new_args, 1),
    Ioctl("ACQUIRE_VM", 0x15, "W", s.kfd_ioctl_acquire_vm_args, 1),
    Ioctl("ALLOC_MEMORY_OF_GPU", 0x16, "RW", s.kfd_ioctl_alloc_memory_of_gpu_args, 1),
    Ioctl("FREE_MEMORY_OF_GPU", 0x17, "W", s.kfd_ioctl_free_memory_of_gpu_args, 1),
    Ioctl("MAP_MEMORY_TO_GPU", 0x18, "RW", s.kfd_ioctl_map_memory_to_gpu_args, 1),
    Ioctl("UNMAP_MEMORY_FROM_GPU", 0x19, "RW", s.kfd_ioctl_unmap_memory_from_gpu_args, 1),
    Ioctl("SET_CU_MASK", 0x1A, "W", s.kfd_ioctl_set_cu_mask_args, 1),
    Ioctl("GET_QUEUE_WAVE_STATE", 0x1B, "RW", s.kfd_ioctl_get_queue_wave_state_args, 1),
    Ioctl("GET_DMABUF_INFO", 0x1C, "RW", s.kfd_ioctl_get_dmabuf_info_args, 1),
    Ioctl("IMPORT_DMABUF", 0x1D, "RW", s.kfd_ioctl_import_dmabuf_args, 1),
    Ioctl("ALLOC_QUEUE_GWS", 0x1E, "RW", s.kfd_ioctl_alloc_queue_gws_args, 1),
    Ioctl("SMI_EVENTS", 0x1F, "RW", s.kfd_ioctl_smi_events_args, 3),
    Ioctl("SVM", 0x20, "RW", s.kfd_ioctl_svm_args, 5),
    Ioctl("SET_XNACK_MODE", 0x21, "RW", s.kfd_ioctl_set_xnack_mode_args, 5),
    Ioctl("CRIU_OP", 0x22, "RW", s.kfd_ioctl_criu_args, 7),
    Ioctl("AVAILABLE_MEMORY", 0x23, "RW", s.kfd_ioctl_get_available_memory_args, 9),
    Ioctl("EXPORT_DMABUF", 0x24, "RW", s.kfd_ioctl_export_dmabuf_args, 12),
    Ioctl("RUNTIME_ENABLE", 0x25, "RW", s.kfd_ioctl_runtime_enable_args, 13),
    Ioctl("DBG_TRAP", 0x26, "RW", s.kfd_ioctl_dbg_trap_args, 13),
    Ioctl("CREATE_PROCESS", 0x27, "", None, 19),
    Ioctl("PROFILER", 0x28, "RW", s.kfd_ioctl_profiler_args, 23),
)
BY_NAME = {i.name: i for i in IOCTLS}
BY_NR = {i.nr: i for i in IOCTLS}

# AMDKFD_IOC_* module constants: the newest request number of every ioctl, as a plain int.
REQUESTS = {i.macro: i.request() for i in IOCTLS}


def ioctl_for_request(request):
    """The table entry a request number refers to. Like the kernel, only the nr is looked at."""
    return BY_NR.get(ioctl_opt.IOC_NR(request))


def sizeof(struct):
    return ctypes.sizeof(struct) if struct is not None else 0
