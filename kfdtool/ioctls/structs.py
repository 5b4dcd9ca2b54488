"""ctypes layouts of every argument struct in the KFD uapi header (``linux/kfd_ioctl.h``).

Class and field names are the kernel's own.  Layouts are the newest ABI (1.23); layouts that
changed over time live in :mod:`kfdtool.ioctls.history`.  Proven against gcc-compiled
``/usr/include/linux/kfd_ioctl.h`` and tinygrad's generated module in ``tests/test_abi_*.py``.
"""
import ctypes

u32, u64, i32 = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int32


class KfdStruct(ctypes.Structure):
    """Base: natural (x86-64 gcc) alignment, readable repr, dict export."""

    def to_dict(self):
        out = {}
        for name, ctype, *_ in self._fields_:
            value = getattr(self, name)
            if isinstance(value, ctypes.Structure) and hasattr(value, "to_dict"):
                value = value.to_dict()
            elif isinstance(value, ctypes.Array):
                value = [v.to_dict() if hasattr(v, "to_dict") else v for v in value]
            out[name] = value
        return out

    def __repr__(self):
        fields = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items())
        return f"{type(self).__name__}({fields})"


class KfdUnion(ctypes.Union):
    pass


# --- queues -------------------------------------------------------------------------------------


class kfd_ioctl_get_version_args(KfdStruct):
    _fields_ = [("major_version", u32), ("minor_version", u32)]


class kfd_ioctl_create_queue_args(KfdStruct):
    _fields_ = [
        ("ring_base_address", u64), ("write_pointer_address", u64), ("read_pointer_address", u64),
        ("doorbell_offset", u64), ("ring_size", u32), ("gpu_id", u32), ("queue_type", u32),
        ("queue_percentage", u32), ("queue_priority", u32), ("queue_id", u32),
        ("eop_buffer_address", u64), ("eop_buffer_size", u64), ("ctx_save_restore_address", u64),
        ("ctx_save_restore_size", u32), ("ctl_stack_size", u32),
        ("sdma_engine_id", u32),          # 1.17+
        ("metadata_ring_size", u32)]      # 1.22+ (a pad before)


class kfd_ioctl_destroy_queue_args(KfdStruct):
    _fields_ = [("queue_id", u32), ("pad", u32)]


class kfd_ioctl_update_queue_args(KfdStruct):
    _fields_ = [
        ("ring_base_address", u64), ("queue_id", u32), ("ring_size", u32),
        ("queue_percentage", u32), ("queue_priority", u32)]


class kfd_ioctl_set_cu_mask_args(KfdStruct):
    _fields_ = [("queue_id", u32), ("num_cu_mask", u32), ("cu_mask_ptr", u64)]


class kfd_ioctl_get_queue_wave_state_args(KfdStruct):
    _fields_ = [
        ("ctl_stack_address", u64), ("ctl_stack_used_size", u32), ("save_area_used_size", u32),
        ("queue_id", u32), ("pad", u32)]


class kfd_ioctl_get_available_memory_args(KfdStruct):
    _fields_ = [("available", u64), ("gpu_id", u32), ("pad", u32)]


class kfd_dbg_device_info_entry(KfdStruct):
    _fields_ = [
        ("exception_status", u64), ("lds_base", u64), ("lds_limit", u64), ("scratch_base", u64),
        ("scratch_limit", u64), ("gpuvm_base", u64), ("gpuvm_limit", u64), ("gpu_id", u32),
        ("location_id", u32), ("vendor_id", u32), ("device_id", u32), ("revision_id", u32),
        ("subsystem_vendor_id", u32), ("subsystem_device_id", u32), ("fw_version", u32),
        ("gfx_target_version", u32), ("simd_count", u32), ("max_waves_per_simd", u32),
        ("array_count", u32), ("simd_arrays_per_engine", u32), ("num_xcc", u32), ("capability", u32),
        ("debug_prop", u32), ("capability2", u32), ("pad", u32)]


class kfd_ioctl_set_memory_policy_args(KfdStruct):
    _fields_ = [
        ("alternate_aperture_base", u64), ("alternate_aperture_size", u64), ("gpu_id", u32),
        ("default_policy", u32), ("alternate_policy", u32), ("misc_process_flag", u32)]


class kfd_ioctl_get_clock_counters_args(KfdStruct):
    _fields_ = [
        ("gpu_clock_counter", u64), ("cpu_clock_counter", u64), ("system_clock_counter", u64),
        ("system_clock_freq", u64), ("gpu_id", u32), ("pad", u32)]


class kfd_process_device_apertures(KfdStruct):
    _fields_ = [
        ("lds_base", u64), ("lds_limit", u64), ("scratch_base", u64), ("scratch_limit", u64),
        ("gpuvm_base", u64), ("gpuvm_limit", u64), ("gpu_id", u32), ("pad", u32)]


NUM_OF_SUPPORTED_GPUS = 7


class kfd_ioctl_get_process_apertures_args(KfdStruct):
    _fields_ = [
        ("process_apertures", kfd_process_device_apertures * NUM_OF_SUPPORTED_GPUS),
        ("num_of_nodes", u32), ("pad", u32)]


class kfd_ioctl_get_process_apertures_new_args(KfdStruct):
    _fields_ = [("kfd_process_device_apertures_ptr", u64), ("num_of_nodes", u32), ("pad", u32)]


# --- deprecated debugger (0x0D-0x10): kept for ABI completeness ------------------------------
class kfd_ioctl_dbg_register_args(KfdStruct):
    _fields_ = [("gpu_id", u32), ("pad", u32)]


class kfd_ioctl_dbg_unregister_args(KfdStruct):
    _fields_ = [("gpu_id", u32), ("pad", u32)]


class kfd_ioctl_dbg_address_watch_args(KfdStruct):
    _fields_ = [("content_ptr", u64), ("gpu_id", u32), ("buf_size_in_bytes", u32)]


class kfd_ioctl_dbg_wave_control_args(KfdStruct):
    _fields_ = [("content_ptr", u64), ("gpu_id", u32), ("buf_size_in_bytes", u32)]


# --- events -------------------------------------------------------------------------------------
class kfd_ioctl_create_event_args(KfdStruct):
    _fields_ = [
        ("event_page_offset", u64), ("event_trigger_data", u32), ("event_type", u32),
        ("auto_reset", u32), ("node_id", u32), ("event_id", u32), ("event_slot_index", u32)]


class kfd_ioctl_destroy_event_args(KfdStruct):
    _fields_ = [("event_id", u32), ("pad", u32)]


class kfd_ioctl_set_event_args(KfdStruct):
    _fields_ = [("event_id", u32), ("pad", u32)]


class kfd_ioctl_reset_event_args(KfdStruct):
    _fields_ = [("event_id", u32), ("pad", u32)]


class kfd_memory_exception_failure(KfdStruct):
    _fields_ = [("NotPresent", u32), ("ReadOnly", u32), ("NoExecute", u32), ("imprecise", u32)]


class kfd_hsa_memory_exception_data(KfdStruct):
    _fields_ = [
        ("failure", kfd_memory_exception_failure), ("va", u64), ("gpu_id", u32), ("ErrorType", u32)]


class kfd_hsa_hw_exception_data(KfdStruct):
    _fields_ = [("reset_type", u32), ("reset_cause", u32), ("memory_lost", u32), ("gpu_id", u32)]


class kfd_hsa_signal_event_data(KfdStruct):
    _fields_ = [("last_event_age", u64)]


class _kfd_event_data_union(KfdUnion):
    _fields_ = [
        ("memory_exception_data", kfd_hsa_memory_exception_data),
        ("hw_exception_data", kfd_hsa_hw_exception_data),
        ("signal_event_data", kfd_hsa_signal_event_data)]


class kfd_event_data(KfdStruct):
    _anonymous_ = ("_u",)
    _fields_ = [
        ("_u", _kfd_event_data_union), ("kfd_event_data_ext", u64), ("event_id", u32), ("pad", u32)]


class kfd_ioctl_wait_events_args(KfdStruct):
    _fields_ = [
        ("events_ptr", u64), ("num_events", u32), ("wait_for_all", u32), ("timeout", u32), ("wait_result", u32)]


class kfd_ioctl_set_scratch_backing_va_args(KfdStruct):
    _fields_ = [("va_addr", u64), ("gpu_id", u32), ("pad", u32)]


class kfd_ioctl_get_tile_config_args(KfdStruct):
    _fields_ = [
        ("tile_config_ptr", u64), ("macro_tile_config_ptr", u64), ("num_tile_configs", u32),
        ("num_macro_tile_configs", u32), ("gpu_id", u32), ("gb_addr_config", u32),
        ("num_banks", u32), ("num_ranks", u32)]


class kfd_ioctl_set_trap_handler_args(KfdStruct):
    _fields_ = [("tba_addr", u64), ("tma_addr", u64), ("gpu_id", u32), ("pad", u32)]


class kfd_ioctl_acquire_vm_args(KfdStruct):
    _fields_ = [("drm_fd", u32), ("gpu_id", u32)]


# --- memory -------------------------------------------------------------------------------------
class kfd_ioctl_alloc_memory_of_gpu_args(KfdStruct):
    _fields_ = [
        ("va_addr", u64), ("size", u64), ("handle", u64), ("mmap_offset", u64), ("gpu_id", u32), ("flags", u32)]


class kfd_ioctl_free_memory_of_gpu_args(KfdStruct):
    _fields_ = [("handle", u64)]


class kfd_ioctl_map_memory_to_gpu_args(KfdStruct):
    _fields_ = [
        ("handle", u64), ("device_ids_array_ptr", u64), ("n_devices", u32), ("n_success", u32)]


class kfd_ioctl_unmap_memory_from_gpu_args(KfdStruct):
    _fields_ = [
        ("handle", u64), ("device_ids_array_ptr", u64), ("n_devices", u32), ("n_success", u32)]


class kfd_ioctl_alloc_queue_gws_args(KfdStruct):
    _fields_ = [("queue_id", u32), ("num_gws", u32), ("first_gws", u32), ("pad", u32)]


class kfd_ioctl_get_dmabuf_info_args(KfdStruct):
    _fields_ = [
        ("size", u64), ("metadata_ptr", u64), ("metadata_size", u32), ("gpu_id", u32),
        ("flags", u32), ("dmabuf_fd", u32)]


class kfd_ioctl_import_dmabuf_args(KfdStruct):
    _fields_ = [("va_addr", u64), ("handle", u64), ("gpu_id", u32), ("dmabuf_fd", u32)]


class kfd_ioctl_export_dmabuf_args(KfdStruct):
    _fields_ = [("handle", u64), ("flags", u32), ("dmabuf_fd", u32)]


class kfd_ioctl_smi_events_args(KfdStruct):
    _fields_ = [("gpuid", u32), ("anon_fd", u32)]


# --- CRIU ---------------------------------------------------------------------------------------
class kfd_ioctl_criu_args(KfdStruct):
    _fields_ = [
        ("devices", u64), ("bos", u64), ("priv_data", u64), ("priv_data_size", u64),
        ("num_devices", u32), ("num_bos", u32), ("num_objects", u32), ("pid", u32), ("op", u32)]


class kfd_criu_device_bucket(KfdStruct):
    _fields_ = [("user_gpu_id", u32), ("actual_gpu_id", u32), ("drm_fd", u32), ("pad", u32)]


class kfd_criu_bo_bucket(KfdStruct):
    _fields_ = [
        ("addr", u64), ("size", u64), ("offset", u64), ("restored_offset", u64), ("gpu_id", u32),
        ("alloc_flags", u32), ("dmabuf_fd", u32), ("pad", u32)]


# --- SVM ----------------------------------------------------------------------------------------
class kfd_ioctl_svm_attribute(KfdStruct):
    _fields_ = [("type", u32), ("value", u32)]


class kfd_ioctl_svm_args(KfdStruct):
    _fields_ = [
        ("start_addr", u64), ("size", u64), ("op", u32), ("nattr", u32),
        ("attrs", kfd_ioctl_svm_attribute * 0)]      # flexible array member


class kfd_ioctl_set_xnack_mode_args(KfdStruct):
    _fields_ = [("xnack_enabled", i32)]


# --- debugger API (1.13+) -------------------------------------------------------------------------
class kfd_runtime_info(KfdStruct):
    _fields_ = [("r_debug", u64), ("runtime_state", u32), ("ttmp_setup", u32)]


class kfd_ioctl_runtime_enable_args(KfdStruct):
    _fields_ = [("r_debug", u64), ("mode_mask", u32), ("capabilities_mask", u32)]


class kfd_queue_snapshot_entry(KfdStruct):
    _fields_ = [
        ("exception_status", u64), ("ring_base_address", u64), ("write_pointer_address", u64),
        ("read_pointer_address", u64), ("ctx_save_restore_address", u64), ("queue_id", u32),
        ("gpu_id", u32), ("ring_size", u32), ("queue_type", u32),
        ("ctx_save_restore_area_size", u32), ("reserved", u32)]


class kfd_context_save_area_header_wave_state(KfdStruct):
    _fields_ = [
        ("control_stack_offset", u32), ("control_stack_size", u32),
        ("wave_state_offset", u32), ("wave_state_size", u32)]


class kfd_context_save_area_header(KfdStruct):
    _fields_ = [
        ("wave_state", kfd_context_save_area_header_wave_state),
        ("debug_offset", u32), ("debug_size", u32), ("err_payload_addr", u64),
        ("err_event_id", u32), ("reserved1", u32)]


class kfd_ioctl_dbg_trap_enable_args(KfdStruct):
    _fields_ = [
        ("exception_mask", u64), ("rinfo_ptr", u64), ("rinfo_size", u32), ("dbg_fd", u32)]


class kfd_ioctl_dbg_trap_send_runtime_event_args(KfdStruct):
    _fields_ = [("exception_mask", u64), ("gpu_id", u32), ("queue_id", u32)]


class kfd_ioctl_dbg_trap_set_exceptions_enabled_args(KfdStruct):
    _fields_ = [("exception_mask", u64)]


class kfd_ioctl_dbg_trap_set_wave_launch_override_args(KfdStruct):
    _fields_ = [
        ("override_mode", u32), ("enable_mask", u32), ("support_request_mask", u32), ("pad", u32)]


class kfd_ioctl_dbg_trap_set_wave_launch_mode_args(KfdStruct):
    _fields_ = [("launch_mode", u32), ("pad", u32)]


class kfd_ioctl_dbg_trap_suspend_queues_args(KfdStruct):
    _fields_ = [
        ("exception_mask", u64), ("queue_array_ptr", u64), ("num_queues", u32), ("grace_period", u32)]


class kfd_ioctl_dbg_trap_resume_queues_args(KfdStruct):
    _fields_ = [("queue_array_ptr", u64), ("num_queues", u32), ("pad", u32)]


class kfd_ioctl_dbg_trap_set_node_address_watch_args(KfdStruct):
    _fields_ = [("address", u64), ("mode", u32), ("mask", u32), ("gpu_id", u32), ("id", u32)]


class kfd_ioctl_dbg_trap_clear_node_address_watch_args(KfdStruct):
    _fields_ = [("gpu_id", u32), ("id", u32)]


class kfd_ioctl_dbg_trap_set_flags_args(KfdStruct):
    _fields_ = [("flags", u32), ("pad", u32)]


class kfd_ioctl_dbg_trap_query_debug_event_args(KfdStruct):
    _fields_ = [("exception_mask", u64), ("gpu_id", u32), ("queue_id", u32)]


class kfd_ioctl_dbg_trap_query_exception_info_args(KfdStruct):
    _fields_ = [
        ("info_ptr", u64), ("info_size", u32), ("source_id", u32), ("exception_code", u32), ("clear_exception", u32)]


class kfd_ioctl_dbg_trap_queue_snapshot_args(KfdStruct):
    _fields_ = [
        ("exception_mask", u64), ("snapshot_buf_ptr", u64), ("num_queues", u32), ("entry_size", u32)]


class kfd_ioctl_dbg_trap_device_snapshot_args(KfdStruct):
    _fields_ = [
        ("exception_mask", u64), ("snapshot_buf_ptr", u64), ("num_devices", u32), ("entry_size", u32)]


DBG_TRAP_UNION_MEMBERS = {  # union member name -> struct, in header order
    "enable": kfd_ioctl_dbg_trap_enable_args,
    "send_runtime_event": kfd_ioctl_dbg_trap_send_runtime_event_args,
    "set_exceptions_enabled": kfd_ioctl_dbg_trap_set_exceptions_enabled_args,
    "launch_override": kfd_ioctl_dbg_trap_set_wave_launch_override_args,
    "launch_mode": kfd_ioctl_dbg_trap_set_wave_launch_mode_args,
    "suspend_queues": kfd_ioctl_dbg_trap_suspend_queues_args,
    "resume_queues": kfd_ioctl_dbg_trap_resume_queues_args,
    "set_node_address_watch": kfd_ioctl_dbg_trap_set_node_address_watch_args,
    "clear_node_address_watch": kfd_ioctl_dbg_trap_clear_node_address_watch_args,
    "set_flags": kfd_ioctl_dbg_trap_set_flags_args,
    "query_debug_event": kfd_ioctl_dbg_trap_query_debug_event_args,
    "query_exception_info": kfd_ioctl_dbg_trap_query_exception_info_args,
    "queue_snapshot": kfd_ioctl_dbg_trap_queue_snapshot_args,
    "device_snapshot": kfd_ioctl_dbg_trap_device_snapshot_args,
}


class _kfd_ioctl_dbg_trap_union(KfdUnion):
    _fields_ = list(DBG_TRAP_UNION_MEMBERS.items())


class kfd_ioctl_dbg_trap_args(KfdStruct):
    _anonymous_ = ("_u",)
    _fields_ = [("pid", u32), ("op", u32), ("_u", _kfd_ioctl_dbg_trap_union)]


# --- profiler (1.23) ------------------------------------------------------------------------------
class kfd_ioctl_pmc_settings(KfdStruct):
    _fields_ = [("gpu_id", u32), ("lock", u32), ("perfcount_enable", u32)]


class kfd_ioctl_ptl_control(KfdStruct):
    _fields_ = [("gpu_id", u32), ("enable", u32)]


class _kfd_ioctl_profiler_union(KfdUnion):
    _fields_ = [
        ("pmc", kfd_ioctl_pmc_settings), ("ptl", kfd_ioctl_ptl_control), ("version", u32)]


class kfd_ioctl_profiler_args(KfdStruct):
    _anonymous_ = ("_u",)
    _fields_ = [("op", u32), ("_u", _kfd_ioctl_profiler_union)]


ALL_STRUCTS = {name: cls for name, cls in globals().items()
               if isinstance(cls, type) and issubclass(cls, KfdStruct) and cls is not KfdStruct
               and not name.startswith("_")}
