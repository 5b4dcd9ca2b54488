"""Simulated machines: a topology preset (real public sysfs captures, shipped as package data) and
a kernel profile (KFD ABI version and the sysfs conventions of the matching Linux release).

`materialize()` writes the machine's sysfs tree to a directory, so kfdtool's real readers run on it
unchanged (KFDTOOL_SYSFS_ROOT=<dir>).
"""
import functools
import hashlib
import io
import json
import os
import shutil
import zlib
from collections import namedtuple
from pathlib import Path

from . import ABIS
from .nodes import parse_properties

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


def _capture_archive(capture):
    from importlib import resources       # here, not at the top: only writing a tree needs it
    return resources.files(__package__).joinpath("presets").joinpath(f"{capture}.tar.gz").read_bytes()


CREATE_THREADS = 8       # file creation is mostly waiting on the filesystem; threads overlap the waits


def extract_capture(capture, dest):
    """Unpack a shipped capture (the byte-for-byte copy of ../shared/fixtures/kfd-topology/<capture>).
    Same result as tarfile's extractall(filter="data") (files rw-r--r--, directories by the umask,
    nothing but plain files and directories, nothing outside `dest`), several times faster: the
    filter resolves every member's real path, and creating thousands of files one after another
    waits on the disk for each (0.3-1 ms on a virtual machine's disk)."""
    import tarfile
    from concurrent.futures import ThreadPoolExecutor
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    dirs, files = set(), []
    with tarfile.open(fileobj=io.BytesIO(_capture_archive(capture))) as tar:
        for member in tar:
            parts = Path(member.name).parts
            if member.name.startswith("/") or ".." in parts or not (member.isdir() or member.isreg()):
                raise tarfile.FilterError(f"capture {capture}: refusing member {member.name!r}")
            dirs.update(parts[:i] for i in range(1, len(parts) + (0 if member.isreg() else 1)))
            if member.isreg():
                mode = (member.mode & 0o755 if member.mode & 0o100 else member.mode & 0o644) | 0o600
                files.append((dest.joinpath(*parts), tar.extractfile(member).read(), mode))
    with ThreadPoolExecutor(CREATE_THREADS) as pool:
        for depth in sorted({len(d) for d in dirs}):          # parents before children
            list(pool.map(lambda d: dest.joinpath(*d).mkdir(exist_ok=True), [d for d in dirs if len(d) == depth]))
        list(pool.map(_write_file, files))
    return dest


def _write_file(item):
    path, data, mode = item
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, data)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


TREE_STAMP = ".kfdtool-tree.json"      # in the sysfs root: what its topology was built from


def materialize(preset_name, sysfs_root, profile, parameters=None):
    """Write the machine's /sys subset under `sysfs_root`, as after a fresh boot: no KFD processes,
    the module parameters given. The topology (thousands of files) is kept from the last call when
    it was built for the same preset, kernel profile and kfdtool code and nobody has changed it
    since; otherwise it is rebuilt. Returns the topology directory."""
    preset = find_preset(preset_name)
    root = Path(sysfs_root)
    kfd = root / "class" / "kfd" / "kfd"
    topo = kfd / "topology"
    stamp = root / TREE_STAMP
    built_from = {"preset": preset.name, "profile": list(profile), "code": code_version()}
    if _stamp(stamp) != {"built_from": built_from, "fingerprint": _fingerprint(topo)}:
        stamp.unlink(missing_ok=True)
        _build_topology(preset, topo, profile)
        stamp.write_text(json.dumps({"built_from": built_from, "fingerprint": _fingerprint(topo)}))
    proc = kfd / "proc"
    shutil.rmtree(proc, ignore_errors=True)           # a fresh boot: no KFD processes yet
    proc.mkdir()
    write_parameters(root, parameters)
    return topo


def _build_topology(preset, topo, profile):
    """Build beside `topo` and swap it in, so a reader never sees a half-written tree."""
    building = topo.with_name(f".topology-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    if preset.derived:
        _build_mi300x_spx(building)
    else:
        extract_capture(preset.capture, building)
    _complete_capture(building, profile)
    old = topo.with_name(f".topology-old-{os.getpid()}")
    if topo.exists():
        topo.rename(old)
    building.rename(topo)
    shutil.rmtree(old, ignore_errors=True)


@functools.lru_cache(maxsize=None)
def code_version():
    """Digest of the code and captures a tree is built from (the whole package: cheap, and no
    list of modules to keep up to date)."""
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted([*package.rglob("*.py"), *(package / "sim" / "presets").iterdir()]):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _fingerprint(topo):
    """Digest of every entry's name, type, size, mtime and inode under `topo` (None if absent):
    any edit, addition or removal since the stamp was written changes it."""
    digest = hashlib.sha256()
    pending = [str(topo)]
    try:
        while pending:
            with os.scandir(pending.pop()) as entries:
                for entry in sorted(entries, key=lambda e: e.name):
                    st = entry.stat(follow_symlinks=False)
                    digest.update(f"{entry.path}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\n"
                                  .encode())
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
    except OSError:
        return None
    return digest.hexdigest()


def _stamp(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


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
