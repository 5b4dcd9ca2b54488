"""Layout proof (c) for ABI 1.23, newer than any header on this machine: sizes and request numbers
that ../shared/reference/kfd-abi.md §1.3 compiled from Linux 7.2.13's kfd_ioctl.h with gcc."""
import ctypes

import kfdtool.ioctls as k

L72_TABLE = """
01 GET_VERSION 8 0x80084b01
02 CREATE_QUEUE 96 0xc0604b02
03 DESTROY_QUEUE 8 0xc0084b03
04 SET_MEMORY_POLICY 32 0x40204b04
05 GET_CLOCK_COUNTERS 40 0xc0284b05
06 GET_PROCESS_APERTURES 400 0x81904b06
07 UPDATE_QUEUE 24 0x40184b07
08 CREATE_EVENT 32 0xc0204b08
09 DESTROY_EVENT 8 0x40084b09
0a SET_EVENT 8 0x40084b0a
0b RESET_EVENT 8 0x40084b0b
0c WAIT_EVENTS 24 0xc0184b0c
0d DBG_REGISTER_DEPRECATED 8 0x40084b0d
0e DBG_UNREGISTER_DEPRECATED 8 0x40084b0e
0f DBG_ADDRESS_WATCH_DEPRECATED 16 0x40104b0f
10 DBG_WAVE_CONTROL_DEPRECATED 16 0x40104b10
11 SET_SCRATCH_BACKING_VA 16 0xc0104b11
12 GET_TILE_CONFIG 40 0xc0284b12
13 SET_TRAP_HANDLER 24 0x40184b13
14 GET_PROCESS_APERTURES_NEW 16 0xc0104b14
15 ACQUIRE_VM 8 0x40084b15
16 ALLOC_MEMORY_OF_GPU 40 0xc0284b16
17 FREE_MEMORY_OF_GPU 8 0x40084b17
18 MAP_MEMORY_TO_GPU 24 0xc0184b18
19 UNMAP_MEMORY_FROM_GPU 24 0xc0184b19
1a SET_CU_MASK 16 0x40104b1a
1b GET_QUEUE_WAVE_STATE 24 0xc0184b1b
1c GET_DMABUF_INFO 32 0xc0204b1c
1d IMPORT_DMABUF 24 0xc0184b1d
1e ALLOC_QUEUE_GWS 16 0xc0104b1e
1f SMI_EVENTS 8 0xc0084b1f
20 SVM 24 0xc0184b20
21 SET_XNACK_MODE 4 0xc0044b21
22 CRIU_OP 56 0xc0384b22
23 AVAILABLE_MEMORY 16 0xc0104b23
24 EXPORT_DMABUF 16 0xc0104b24
25 RUNTIME_ENABLE 16 0xc0104b25
26 DBG_TRAP 32 0xc0204b26
27 CREATE_PROCESS 0 0x00004b27
28 PROFILER 16 0xc0104b28
"""
# Sizes §1.4-§1.5 gives for the structs that are not ioctl arguments.
L72_SIZES = {"kfd_queue_snapshot_entry": 64, "kfd_context_save_area_header": 40,
             "kfd_dbg_device_info_entry": 128, "kfd_runtime_info": 16, "kfd_criu_device_bucket": 16,
             "kfd_criu_bo_bucket": 48, **{cls.__name__: size for cls, size in (
                 (k.kfd_ioctl_dbg_trap_enable_args, 24), (k.kfd_ioctl_dbg_trap_suspend_queues_args, 24),
                 (k.kfd_ioctl_dbg_trap_resume_queues_args, 16), (k.kfd_ioctl_dbg_trap_queue_snapshot_args, 24),
                 (k.kfd_ioctl_dbg_trap_device_snapshot_args, 24),
                 (k.kfd_ioctl_dbg_trap_query_exception_info_args, 24))}}


def test_every_1_23_ioctl_matches_the_l72_table():
    rows = [line.split() for line in L72_TABLE.strip().splitlines()]
    assert [int(nr, 16) for nr, *_ in rows] == [i.nr for i in k.IOCTLS]
    for nr, name, size, request in rows:
        entry = k.BY_NAME[name]
        assert entry.nr == int(nr, 16)
        assert (ctypes.sizeof(entry.struct) if entry.struct else 0) == int(size), name
        assert getattr(k, f"AMDKFD_IOC_{name}") == int(request, 16), name


def test_non_argument_struct_sizes():
    for name, size in L72_SIZES.items():
        assert ctypes.sizeof(k.ALL_STRUCTS[name]) == size, name


def test_version_gates():
    assert k.KfdAbi(11).command_end == 0x24
    assert k.KfdAbi(13).supports("DBG_TRAP") and not k.KfdAbi(12).supports("DBG_TRAP")
    assert k.KfdAbi(16).request("CREATE_QUEUE") == 0xC0584B02      # 88-byte layout
    assert k.KfdAbi(17).request("CREATE_QUEUE") == 0xC0604B02
    assert k.KfdAbi(17).struct_size("kfd_dbg_device_info_entry") == 120
    assert k.KfdAbi(23).struct_size("kfd_dbg_device_info_entry") == 128
    assert str(k.KfdAbi.parse("1.17")) == "1.17"


def test_dbg_trap_union_offsets():
    args = k.kfd_ioctl_dbg_trap_args
    assert args.pid.offset == 0 and args.op.offset == 4
    for member in k.DBG_TRAP_UNION_MEMBERS:
        assert getattr(args, member).offset == 8, member
    assert k.KFD_EC_MASK(k.EC_QUEUE_NEW) == 1 << 30
