"""Layout proof (b): every struct tinygrad 0.14.0 generated from its KFD 1.17 header
(tinygrad/runtime/autogen/kfd.py) has the same size and field offsets as ours at ABI 1.17."""
import ctypes

from tinygrad.runtime.autogen import kfd as tinygrad_kfd   # a hard test dependency, never skipped

import kfdtool.ioctls as k

ABI = k.KfdAbi(17)
# Structs tinygrad took from ROCm's out-of-tree (DKMS) header, which upstream never had or laid
# out differently (kfd-abi.md §1.3): excluded by name, and the test checks each still differs.
DKMS_ONLY = {"kfd_ioctl_profiler_args", "kfd_ioctl_spm_args", "kfd_ioctl_ipc_export_handle_args",
             "kfd_ioctl_ipc_import_handle_args", "kfd_ioctl_cross_memory_copy_deprecated_args",
             "kfd_ioctl_dbg_trap_args_deprecated", "kfd_pc_sample_info", "kfd_ioctl_pc_sample_args",
             "kfd_ioctl_pmc_settings"}


def _tinygrad_structs():
    for attr in dir(tinygrad_kfd):
        if attr.startswith("struct_kfd"):
            yield attr.removeprefix("struct_"), getattr(tinygrad_kfd, attr)


def test_tinygrad_is_the_1_17_header():
    assert tinygrad_kfd.KFD_IOCTL_MINOR_VERSION == 17


def test_shared_structs_match_tinygrad():
    compared = 0
    for name, theirs in _tinygrad_structs():
        if name in DKMS_ONLY or name.endswith("_wave_state") and name not in k.ALL_STRUCTS:
            continue
        assert name in k.ALL_STRUCTS, f"tinygrad has {name}, kfdtool.ioctls does not"
        ours = ABI.layout(name)
        assert ctypes.sizeof(ours) == ctypes.sizeof(theirs), name
        for fname, *_ in theirs._fields_:
            if fname.startswith("_"):
                continue
            renamed = {old: new for (s, new), (old, since) in k.FIELD_RENAMES.items()
                       if s == name and ABI.minor < since}
            ours_field = getattr(ours, renamed.get(fname, fname), None)
            assert ours_field is not None, f"{name}.{fname} missing"
            assert ours_field.offset == getattr(theirs, fname).offset, f"{name}.{fname}"
        compared += 1
    assert compared >= 60


def test_dkms_only_exclusions_are_real():
    theirs = dict(_tinygrad_structs())
    for name in DKMS_ONLY & set(theirs):
        if name in k.ALL_STRUCTS:   # same name, different (upstream) layout
            assert ctypes.sizeof(k.ALL_STRUCTS[name]) != ctypes.sizeof(theirs[name]) or \
                [f[0] for f in k.ALL_STRUCTS[name]._fields_] != [f[0] for f in theirs[name]._fields_]
