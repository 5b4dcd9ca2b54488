"""kfdtool's CWSR formula (cwsr/sizing.py) against the kernel's (kfd_queue.c:
kfd_queue_ctx_save_restore_size and get_num_waves) where the two once disagreed, on synthetic
node properties that make the difference show: every expected number is worked out by hand in the
comments, and the simulator's independent reading of the kernel (sim/cwsr.py) must agree."""
import pytest

from kfdtool.cwsr.sizing import formula
from kfdtool.sim.cwsr import node_cwsr, queue_save_area_bytes


def sizes(props):
    """Both implementations' (ctl_stack_size, cwsr_size, debug_memory_size, wg_data_size)."""
    ours, kernels = formula(props), node_cwsr(props)
    return ((ours.ctl_stack_size, ours.cwsr_size, ours.debug_memory_size, ours.wg_data_size),
            (kernels.ctl_stack_size, kernels.cwsr_size, kernels.debug_memory_size, kernels.wg_data_size))


# gfx942 with 2 XCCs of 40 CUs and one shader array each. node_show prints array_count times the
# XCC count (kfd_topology.c: node_show), so the node publishes 2 while get_num_waves sees 1.
TWO_XCC_ONE_ARRAY = {"gfx_target_version": 90402, "num_xcc": 2, "simd_per_cu": 4, "simd_count": 4 * 40 * 2,
                     "array_count": 2, "simd_arrays_per_engine": 1, "lds_size_in_kb": 64}


def test_the_wave_limit_uses_the_per_xcc_array_count():
    """get_num_waves: min(40 waves x 40 CUs = 1600, 1 array x 512 = 512) = 512 waves, not the 1024
    that the published (whole-node) array_count would allow.
    ctl_stack_size = ALIGN(40 + 512 * 8 + 8, 4096) = 8192 (1024 waves would give 12288)
    wg_data_size = 40 CUs x (0x80000 + 0x4000 + 0x10000 + 0x1000 = 610304) = 24412160
    cwsr_size = 8192 + 24412160 = 24420352; debug_memory_size = 512 x 32 = 16384."""
    ours, kernels = sizes(TWO_XCC_ONE_ARRAY)
    assert ours == kernels == (8192, 24420352, 16384, 24412160)


def test_the_save_area_mapping_of_a_two_xcc_node():
    """kfd_queue_acquire_buffers: ALIGN((cwsr_size + debug_memory_size) x 2 XCCs, 4096)
    = (24420352 + 16384) x 2 = 48873472 bytes at ctx_save_restore_address."""
    ours, kernels = formula(TWO_XCC_ONE_ARRAY), node_cwsr(TWO_XCC_ONE_ARRAY)
    assert ours.queue_mapping_bytes == queue_save_area_bytes(kernels, kernels.cwsr_size) == 48873472


# 32 CUs (2 SIMDs each), one XCC, 320 KiB of LDS: the gfx12.5 values.
GFX12_NODE = {"num_xcc": 1, "simd_per_cu": 2, "simd_count": 64, "array_count": 8, "simd_arrays_per_engine": 2,
              "lds_size_in_kb": 320}


def test_gfx1251_still_has_64_waves_per_cu():
    """get_num_waves, the last version it knows (120501): 32 CUs x 64 = 2048 waves.
    ctl_stack_size = ALIGN(40 + 2048 x 12 + 8 = 24624, 4096) = 28672
    per CU 0x80000 VGPR + 0x8000 SGPR + 320 KiB LDS + 0x8000 HWREG = 917504; x 32 = 29360128
    cwsr_size = 28672 + 29360128 = 29388800; debug_memory_size = 2048 x 32 = 65536."""
    ours, kernels = sizes({**GFX12_NODE, "gfx_target_version": 120501})
    assert ours == kernels == (28672, 29388800, 65536, 29360128)


@pytest.mark.parametrize("gfxv", [120502, 120600, 130000])
def test_a_gfx_version_newer_than_the_kernel_knows_gets_no_waves(gfxv):
    """get_num_waves returns 0 (and WARNs) above 120501: the control stack is the header alone,
    ALIGN(40 + 0 + 8, 4096) = 4096, and the debugger area is 0 bytes (64 waves per CU would have
    given 28672 and 65536). Default per-CU context 0x40000 + 0x4000 + 0x10000 + 0x1000 = 348160,
    x 32 CUs = 11141120; cwsr_size = 4096 + 11141120 = 11145216."""
    ours, kernels = sizes({**GFX12_NODE, "gfx_target_version": gfxv})
    assert ours == kernels == (4096, 11145216, 0, 11141120)
