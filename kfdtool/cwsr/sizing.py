"""CWSR (compute wave save/restore) area sizes: the kernel's formula
(``kfd_queue_ctx_save_restore_size``, Linux 7.2 kfd_queue.c:409-530, kfd-abi.md §5.1).

New kernels publish ``cwsr_size`` and ``ctl_stack_size`` per node; `cwsr_sizes()` prefers those
and falls back to the formula, which tests prove equal on every capture that publishes them.
"""
from dataclasses import dataclass

PAGE_SIZE = 4096


def _align(x, a):
    return (x + a - 1) // a * a


@dataclass(frozen=True)
class CwsrSizes:
    ctl_stack_size: int        # per XCC; CREATE_QUEUE demands exactly this
    cwsr_size: int             # per XCC; CREATE_QUEUE demands ctx_save_restore_size >= this
    debug_memory_size: int     # per XCC
    wg_data_size: int          # per XCC: the wave/workgroup state that CWSR saves at most
    num_xcc: int
    source: str                # "sysfs" or "formula"

    @property
    def queue_mapping_bytes(self):
        """The GPU VA mapping CREATE_QUEUE requires at ctx_save_restore_address, per queue."""
        return _align((self.cwsr_size + self.debug_memory_size) * self.num_xcc, PAGE_SIZE)

    @property
    def max_save_bytes(self):
        """Upper bound of wave state one queue can save (every XCC's workgroup data area)."""
        return self.wg_data_size * self.num_xcc


def _count(props, key, default=0):
    value = props.get(key, default)
    return value if isinstance(value, int) and value >= 0 else None


def formula(props):
    """CwsrSizes from a node's properties dict, or None where the kernel has no CWSR (< gfx8.0.1)
    or the properties are unusable (missing, negative or non-numeric counts)."""
    values = [_count(props, k, d) for k, d in (("gfx_target_version", 0), ("num_xcc", 1), ("simd_per_cu", 0),
                                                ("simd_count", 0), ("array_count", 0),
                                                ("simd_arrays_per_engine", 1), ("lds_size_in_kb", 64))]
    if None in values:
        return None
    gfxv, num_xcc, simd_per_cu, simd_count, array_count, arrays_per_engine, lds_kb = values
    if gfxv < 80001 or not simd_per_cu:
        return None
    num_xcc, arrays_per_engine = num_xcc or 1, arrays_per_engine or 1
    cu_num = simd_count // simd_per_cu // num_xcc
    # The kernel keeps array_count per XCC and node_show prints it times num_xcc
    # (kfd_topology.c: node_show), so the published value is divided back.
    array_count //= num_xcc
    # kfd_queue.c: get_num_waves, the newest kernels (7.2; it came with GFX 12.5 support, before
    # which every version from 100100 up got cu_num * 32): 0 waves, with a WARN, for a version
    # above 120501. Its control stack then holds the header alone and its debugger area is empty.
    if gfxv < 100100:
        wave_num = min(cu_num * 40, array_count // arrays_per_engine * 512)
    elif gfxv < 120500:
        wave_num = cu_num * 32
    elif gfxv <= 120501:
        wave_num = cu_num * 64
    else:
        wave_num = 0
    if gfxv in (90402, 90010, 90008, 90500, 120500, 120501):
        vgpr = 0x80000
    elif gfxv in (110000, 110001, 110501, 120000, 120001):
        vgpr = 0x60000
    else:
        vgpr = 0x40000
    big = gfxv in (120500, 120501)
    sgpr = 0x8000 if big else 0x4000
    lds = (lds_kb << 10) if gfxv in (90500, 120500, 120501) else 0x10000
    hwreg = 0x8000 if big else 0x1000
    wg_data_size = _align(cu_num * (vgpr + sgpr + lds + hwreg), PAGE_SIZE)
    ctl_stack = _align(40 + wave_num * (12 if gfxv >= 100100 else 8) + 8, PAGE_SIZE)
    if 100100 <= gfxv < 110000:
        ctl_stack = min(ctl_stack, 0x7000)
    debug = _align(wave_num * 32, 64)
    cwsr = _align(ctl_stack + wg_data_size, PAGE_SIZE)
    return CwsrSizes(ctl_stack, cwsr, debug, wg_data_size, num_xcc, "formula")


def cwsr_sizes(props):
    """Published sysfs values where present, else the formula."""
    computed = formula(props)
    if computed is None:
        return None
    if (_count(props, "cwsr_size", None) or 0) > (_count(props, "ctl_stack_size", None) or 0) > 0:
        return CwsrSizes(props["ctl_stack_size"], props["cwsr_size"], computed.debug_memory_size,
                         props["cwsr_size"] - props["ctl_stack_size"], computed.num_xcc, "sysfs")
    return computed
