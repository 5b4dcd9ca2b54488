"""The CWSR (compute wave save/restore) sizes the kernel computes for a GPU node.

The kernel computes them once per node when the node joins the topology
(kfd_topology.c: kfd_topology_add_device calls kfd_queue.c: kfd_queue_ctx_save_restore_size),
prints cwsr_size and ctl_stack_size in nodes/N/properties (kfd_topology.c: node_show, 6.12 and
later) and checks every compute CREATE_QUEUE against them (kfd_queue.c: kfd_queue_acquire_buffers).

This is the simulator's own reading of that kernel function, kept independent of kfdtool's
formula (kfdtool/cwsr/sizing.py): the simulator stands for the kernel, so a test that the two
agree checks kfdtool against the kernel instead of against itself. It reads the node properties
the kernel publishes, which are the kernel's node_props as node_show prints them: all as kept,
except array_count, which node_show prints multiplied by the node's XCC count while node_props
(and so kfd_queue_ctx_save_restore_size) keeps it per XCC. Sizes assume 4 KiB pages (x86-64).
"""
from collections import namedtuple

PAGE_SIZE = 4096
HEADER_BYTES = 40                  # SIZEOF_HSA_USER_CONTEXT_SAVE_AREA_HEADER
DEBUGGER_BYTES_PER_WAVE = 32
DEBUGGER_BYTES_ALIGN = 64
GFX10_CTL_STACK_LIMIT = 0x7000     # a hardware limit on every gfx10.x part

NodeCwsr = namedtuple("NodeCwsr", "ctl_stack_size cwsr_size debug_memory_size wg_data_size eop_buffer_size num_xcc")
NodeCwsr.__doc__ = """One node's sizes as the kernel keeps them in node_props (all per XCC), plus
wg_data_size (the per-XCC workgroup context the save area holds) and num_xcc."""


def _round_up(value, to):
    return -(-value // to) * to


def _waves(gfxv, cu_num, array_count, arrays_per_engine):
    """kfd_queue.c: get_num_waves: the wave slots whose control-stack entries must fit, from
    the per-XCC CU count and the per-XCC shader array count. Zero (the kernel WARNs) for a gfx
    version newer than it knows (above 120501)."""
    if gfxv < 100100:
        return min(cu_num * 40, array_count // arrays_per_engine * 512)
    if gfxv < 120500:
        return cu_num * 32
    if gfxv <= 120501:
        return cu_num * 64
    return 0


def _context_bytes_per_cu(gfxv, lds_size_in_kb):
    """WG_CONTEXT_DATA_SIZE_PER_CU: VGPRs + SGPRs + LDS + hardware registers of one CU."""
    if gfxv in (90402, 90010, 90008, 90500, 120500, 120501):
        vgprs = 0x80000
    elif gfxv in (110000, 110001, 110501, 120000, 120001):
        vgprs = 0x60000
    else:
        vgprs = 0x40000
    gfx1250 = gfxv in (120500, 120501)
    sgprs = 0x8000 if gfx1250 else 0x4000
    lds = lds_size_in_kb << 10 if gfxv in (90500, 120500, 120501) else 0x10000
    hwregs = 0x8000 if gfx1250 else 0x1000
    return vgprs + sgprs + lds + hwregs


def node_cwsr(props):
    """kfd_queue_ctx_save_restore_size for a node's properties dict, or None where the kernel
    computes nothing: a CPU node, a GPU older than gfx8.0.1 (Carrizo), or properties that lack
    what the computation reads (the simulator then offers no CWSR on that node)."""
    gfxv = props.get("gfx_target_version") or 0
    simd_per_cu = props.get("simd_per_cu") or 0
    arrays_per_engine = props.get("simd_arrays_per_engine") or 0
    if gfxv < 80001 or not simd_per_cu or not arrays_per_engine:
        return None
    num_xcc = props.get("num_xcc") or 1          # NUM_XCC(xcc_mask): published as num_xcc
    cu_num = props.get("simd_count", 0) // simd_per_cu // num_xcc
    # node_show prints node_props.array_count * NUM_XCC (kfd_topology.c: node_show); undo it
    waves = _waves(gfxv, cu_num, props.get("array_count", 0) // num_xcc, arrays_per_engine)
    wg_data_size = _round_up(cu_num * _context_bytes_per_cu(gfxv, props.get("lds_size_in_kb", 0)), PAGE_SIZE)
    ctl_stack_size = _round_up(HEADER_BYTES + waves * (12 if gfxv >= 100100 else 8) + 8, PAGE_SIZE)
    if gfxv // 10000 == 10:
        ctl_stack_size = min(ctl_stack_size, GFX10_CTL_STACK_LIMIT)
    debug_memory_size = _round_up(waves * DEBUGGER_BYTES_PER_WAVE, DEBUGGER_BYTES_ALIGN)
    cwsr_size = _round_up(ctl_stack_size + wg_data_size, PAGE_SIZE)
    eop_buffer_size = 0x8000 if gfxv == 80002 else 4096      # Tonga's EOP buffer is larger
    return NodeCwsr(ctl_stack_size, cwsr_size, debug_memory_size, wg_data_size, eop_buffer_size, num_xcc)


def queue_save_area_bytes(sizes, ctx_save_restore_size):
    """The one GPU mapping CREATE_QUEUE demands at ctx_save_restore_address
    (kfd_queue_acquire_buffers: every XCC's save area plus its debugger area, page-aligned)."""
    return _round_up((ctx_save_restore_size + sizes.debug_memory_size) * sizes.num_xcc, PAGE_SIZE)
