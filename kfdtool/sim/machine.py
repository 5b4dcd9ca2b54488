"""Simulated machines: a topology preset (real public sysfs captures, shipped as package data) and
a kernel profile (KFD ABI version and the sysfs conventions of the matching Linux release).

`materialize()` writes the machine's sysfs tree to a directory, so kfdtool's real readers run on it
unchanged (KFDTOOL_SYSFS_ROOT=<dir>).
"""
import io
import shutil
import zlib
from collections import namedtuple
from pathlib import Path

from ..sysfs import parse_properties
from . import ABIS

# named tuples, not dataclasses: this module is on the start-up path of every `--sim` command
Preset = namedtuple("Preset", "name capture description derived", defaults=[False])


PRESETS = {p.name: p for p in (
    Preset("mi308x", "k8sdp-mi308x-8x-cpx", "8x AMD Instinct MI308X, CPX mode: 32 GPU partition nodes (real capture)"),
    Preset("mi300x-cpx", "k8sdp-mi300x-8x-cpx", "8x AMD Instinct MI300X, CPX mode: 63 GPU partition nodes (real capture)"),
    Preset("mi210", "k8sdp-mi210-8x-xgmi", "8x AMD Instinct MI210 in two XGMI hives (real capture)"),
    Preset("vega10", "k8sdp-vega10-1gpu", "1x Vega10 (MI25-class), old kernel format (real capture)"),
    Preset("composite", "rocprofsdk-composite", "Radeon VII + Navi33 + Navi23 + MI300X + MI350X + RX 9070 XT "
                                                "(real per-node captures from several hosts)"),
    Preset("mi300x", "rocprofsdk-composite", "8x AMD Instinct MI300X, SPX mode: the real MI300X node of the "
                                            "composite capture replicated 8 times in one XGMI hive (derived)",
           derived=True),
)}


class KernelProfile(namedtuple("KernelProfile", "abi_minor release publishes_cwsr_sizes pasid_is_zero has_diq "
                                                "smi_process_events smi_all_process_bit_checked")):
    """What a simulated kernel looks like from user space, per KFD ABI version:
    publishes_cwsr_sizes: node_show prints cwsr_size / ctl_stack_size (kfd_topology.c; upstream
        "drm/amdkfd: Export the cwsr_size and ctl_stack_size to userspace", in stable 6.12.y);
    pasid_is_zero: proc/<pid>/pasid prints 0 (7.2);
    has_diq: sysfs queue type numbering keeps DIQ = 3 (6.12 and older);
    smi_process_events: PROCESS_START / PROCESS_END exist;
    smi_all_process_bit_checked: 6.12 needs ALL_PROCESS in the mask to see other pids."""
    __slots__ = ()

    @property
    def abi(self):
        # imported here: the ioctl tables are ~15 ms that read-only `--sim` commands never need
        from ..ioctls.history import KfdAbi
        return KfdAbi(self.abi_minor)


PROFILES = {
    "1.11": KernelProfile(11, "6.1.0-kfdtool-sim", False, False, True, False, True),
    "1.17": KernelProfile(17, "6.12.117-kfdtool-sim", True, False, True, False, True),
    "1.23": KernelProfile(23, "7.2.13-kfdtool-sim", True, True, False, True, False),
}

assert tuple(PROFILES) == ABIS

CWSR_KEYS = {"cwsr_size", "ctl_stack_size"}       # per-node CWSR sizes, printed by newer kernels only

DEFAULT_PARAMETERS = {          # amdgpu module parameters (kfd-abi.md §6.1) at their defaults
    "sched_policy": 0, "hws_max_conc_proc": -1, "cwsr_enable": 1, "max_num_of_queues_per_device": 4096,
    "send_sigterm": 0, "halt_if_hws_hang": 0, "hws_gws_support": "N", "queue_preemption_timeout_ms": 9000,
    "debug_evictions": "N", "no_queue_eviction_on_vm_fault": 0, "noretry": -1,
}


def find_preset(name):
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown simulated machine {name!r}; choose one of: {', '.join(sorted(PRESETS))}") from None


def find_profile(abi):
    try:
        return PROFILES[str(abi)]
    except KeyError:
        raise KeyError(f"unsupported simulated KFD ABI {abi}; choose one of: {', '.join(PROFILES)}") from None


def extract_capture(capture, dest):
    """Unpack a shipped capture (the byte-for-byte copy of ../shared/fixtures/kfd-topology/<capture>)."""
    import tarfile                         # here, not at the top: only writing a tree needs them
    from importlib import resources
    data = resources.files(__package__).joinpath("presets").joinpath(f"{capture}.tar.gz").read_bytes()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")
    return Path(dest)


def materialize(preset_name, sysfs_root, profile, parameters=None):
    """Write the machine's /sys subset under `sysfs_root`. Returns the topology directory."""
    preset = find_preset(preset_name)
    root = Path(sysfs_root)
    topo = root / "class" / "kfd" / "kfd" / "topology"
    if topo.exists():
        shutil.rmtree(topo)
    topo.mkdir(parents=True)
    proc = root / "class" / "kfd" / "kfd" / "proc"
    shutil.rmtree(proc, ignore_errors=True)           # a fresh boot: no KFD processes yet
    proc.mkdir()
    if preset.derived:
        _build_mi300x_spx(topo)
    else:
        extract_capture(preset.capture, topo)
    _complete_capture(topo, profile)
    write_parameters(root, parameters)
    return topo


def write_parameters(sysfs_root, parameters=None):
    """/sys/module/amdgpu/parameters: the defaults, overridden by `parameters`."""
    params = Path(sysfs_root) / "module" / "amdgpu" / "parameters"
    params.mkdir(parents=True, exist_ok=True)
    for key, value in {**DEFAULT_PARAMETERS, **(parameters or {})}.items():
        (params / key).write_text(f"{value}\n")


# Captures from kernels that did not publish gfx_target_version: the value every simulated kernel
# (6.1 and later) prints, from the GC IP version the driver assigns to the PCI device
# (kfd_device.c: kgd2kfd_probe; Vega10, device 0x6860, is GC 9.0.1 -> 90000, gfx900)
GFX_TARGET_VERSION_BY_DEVICE_ID = {0x6860: 90000}


def _complete_capture(topo, profile):
    """Fill what partial captures lack so the simulated KFD can serve them: gpu_id (the kernel
    derives a unique non-zero 16-bit id; we hash the PCI location), generation_id and
    system_properties.

    CWSR sizes are never added: a capture's cwsr_size / ctl_stack_size are what a real kernel
    published, and a node without them stays without them (kfdtool then says its sizes come from
    its formula). The simulated kernel computes its own (sim/cwsr.py) for CREATE_QUEUE. A profile
    whose kernel predates the keys drops them, as that kernel's node_show would not print them."""
    if not (topo / "generation_id").exists():
        (topo / "generation_id").write_text("1\n")
    if not (topo / "system_properties").exists():
        (topo / "system_properties").write_text("platform_oem 0\nplatform_id 0\nplatform_rev 0\n")
    for template in topo.glob("nodes/*/properties.template"):
        text = template.read_text().replace("{drm_render_minor}", str(128 + int(template.parent.name)))
        (template.parent / "properties").write_text(text + "\n")
        template.unlink()
    used = set()
    for node in sorted(topo.glob("nodes/*"), key=lambda p: int(p.name)):
        props_path = node / "properties"
        props = parse_properties(props_path.read_text())
        is_gpu = props.get("simd_count", 0) > 0
        if is_gpu and "gfx_target_version" not in props and props.get("device_id") in GFX_TARGET_VERSION_BY_DEVICE_ID:
            props["gfx_target_version"] = GFX_TARGET_VERSION_BY_DEVICE_ID[props["device_id"]]
            lines = props_path.read_text().splitlines(keepends=True)
            at = next((i for i, ln in enumerate(lines) if ln.startswith("vendor_id")), len(lines))
            props_path.write_text("".join(lines[:at]) + f"gfx_target_version {props['gfx_target_version']}\n"
                                  + "".join(lines[at:]))
        if not (node / "gpu_id").exists():
            gpu_id = 0
            if is_gpu:
                key = f"{props.get('domain', 0)}:{props.get('location_id', 0)}:{node.name}".encode()
                gpu_id = zlib.crc32(key) & 0xFFFF or 1
                while gpu_id in used:
                    gpu_id = (gpu_id + 1) & 0xFFFF or 1
            (node / "gpu_id").write_text(f"{gpu_id}\n")
        used.add(int((node / "gpu_id").read_text()))
        if not (node / "name").exists():
            (node / "name").write_text("ip discovery\n" if props.get("gfx_target_version", 0) >= 90400 else "\n")
        if not profile.publishes_cwsr_sizes and CWSR_KEYS & props.keys():
            lines = props_path.read_text().splitlines(keepends=True)
            props_path.write_text("".join(ln for ln in lines if ln.split(" ", 1)[0] not in CWSR_KEYS))


def _build_mi300x_spx(topo):
    """8 copies of the composite capture's real MI300X (SPX) node behind its real CPU node."""
    src = Path(topo.parent / ".composite")
    extract_capture("rocprofsdk-composite", src)
    try:
        cpu = src / "nodes" / "0"
        gpu_text = (src / "nodes" / "4" / "properties").read_text()
        xgmi_link = parse_properties((src / "nodes" / "4" / "io_links" / "1" / "properties").read_text())
        nodes = topo / "nodes"
        shutil.copytree(cpu, nodes / "0")
        for link in (nodes / "0" / "io_links").glob("*"):
            shutil.rmtree(link)
        buses = (0x05, 0x26, 0x46, 0x65, 0x85, 0xA5, 0xC5, 0xE5)     # typical 8-OAM MI300X platform
        cpu_links = []
        for i, bus in enumerate(buses, start=1):
            node = nodes / str(i)
            (node / "mem_banks").mkdir(parents=True)
            shutil.copytree(src / "nodes" / "4" / "mem_banks" / "0", node / "mem_banks" / "0")
            text = _set_props(gpu_text, location_id=bus << 8, drm_render_minor=127 + i,
                              unique_id=0x4DA1_0000_0000_0000 + i, io_links_count=8, p2p_links_count=0)
            (node / "properties").write_text(text)
            links = [dict(xgmi_link, type=2, weight=20, min_bandwidth=312, max_bandwidth=64000,
                          recommended_sdma_engine_id_mask=0, node_from=i, node_to=0)]
            links += [dict(xgmi_link, node_from=i, node_to=j) for j in range(1, 9) if j != i]
            for k, link in enumerate(links):
                (node / "io_links" / str(k)).mkdir(parents=True)
                (node / "io_links" / str(k) / "properties").write_text(_props_text(link))
            cpu_links.append(dict(links[0], node_from=0, node_to=i))
        for k, link in enumerate(cpu_links):
            (nodes / "0" / "io_links" / str(k)).mkdir(parents=True)
            (nodes / "0" / "io_links" / str(k) / "properties").write_text(_props_text(link))
        cpu_text = _set_props((nodes / "0" / "properties").read_text(), io_links_count=len(cpu_links),
                              p2p_links_count=0)
        (nodes / "0" / "properties").write_text(cpu_text)
    finally:
        shutil.rmtree(src, ignore_errors=True)


def _props_text(props):
    return "".join(f"{k} {v}\n" for k, v in props.items())


def _set_props(text, **values):
    out = []
    for line in text.splitlines():
        key = line.split(" ", 1)[0]
        out.append(f"{key} {values[key]}" if key in values else line)
    return "\n".join(out) + "\n"
