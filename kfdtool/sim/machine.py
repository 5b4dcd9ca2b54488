"""Simulated machines: a topology preset (real public sysfs captures, shipped as package data) and
a kernel profile (KFD ABI version and the sysfs conventions of the matching Linux release).

`materialize()` writes the machine's sysfs tree to a directory, so kfdtool's real readers run on it
unchanged (KFDTOOL_SYSFS_ROOT=<dir>).
"""
import functools
import hashlib
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


def extract_capture(capture, dest):
    """Unpack a shipped capture (the byte-for-byte copy of ../shared/fixtures/kfd-topology/<capture>)."""
    return extract_archive(_capture_archive(capture), dest, f"capture {capture}")


class ArchiveError(ValueError):
    """A shipped archive holds something other than plain files and directories inside it."""


def extract_archive(archive, dest, what="archive"):
    """Unpack a gzip'd tar archive of plain files and directories under `dest`, with the result of
    tarfile's extractall(filter="data"): files rw-r--r-- (rwxr-xr-x where the owner may execute),
    directories by the umask, and anything else (links, devices, absolute names, "..", extended
    headers) refused before a file is written. Several times faster than tarfile on the large
    captures (8268 members for the MI300X one), which is most of a first `kfdtool sim start`:
    tarfile spends ~35 us parsing each header and the data filter resolves every member's real
    path. Here every file is created relative to its directory's descriptor, and each directory is
    opened with O_NOFOLLOW, so a link already under `dest` is never followed out of it."""
    files_in = {(): []}               # directory (its names under dest) -> [(name, bytes, mode)]
    for name, kind, mode, data in _tar_members(archive, what):
        parts = tuple(part for part in name.split("/") if part not in ("", "."))
        if name.startswith("/") or ".." in parts or kind not in (b"0", b"\0", b"5") or (kind != b"5" and not parts):
            raise ArchiveError(f"{what}: refusing member {name!r} (only plain files and directories inside it)")
        directory = parts if kind == b"5" else parts[:-1]
        for depth in range(len(directory) + 1):
            files_in.setdefault(directory[:depth], [])
        if kind != b"5":
            mode = (mode & 0o755 if mode & 0o100 else mode & 0o644) | 0o600     # tarfile's data filter
            files_in[directory].append((parts[-1], data, mode))
    Path(dest).mkdir(parents=True, exist_ok=True)
    directories = sorted(files_in)                      # parents before children, depth first
    dest_fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY)
    try:
        # the top two levels here, then each subtree below them (a node) by one of the threads
        _create_tree(dest_fd, [d for d in directories if len(d) < 2], files_in)
        subtrees = {}
        for directory in directories:
            if len(directory) >= 2:
                subtrees.setdefault(directory[:2], []).append(directory)
        subtrees = list(subtrees.values())
        shares = [[d for subtree in subtrees[k::CREATE_THREADS] for d in subtree] for k in range(CREATE_THREADS)]
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(CREATE_THREADS) as pool:
            list(pool.map(lambda share: _create_tree(dest_fd, share, files_in), shares))
    finally:
        os.close(dest_fd)
    return Path(dest)


# Two threads, each creating whole subtrees (nodes): file creation is system-call time, which can
# use the second CPU. On this sandbox with other test suites running, mi300x-cpx's capture took a
# median 2.7 s with 2 or 4 threads and 3.3 s with 1 (0.2-0.3 s on a quiet host, either way); a
# thread per file cost more in queueing than it saved.
CREATE_THREADS = 2


def _create_tree(root_fd, directories, files_in):
    """Create `directories` (each one's parent earlier in the list or there already) and their
    files under root_fd. Each directory is opened with O_NOFOLLOW and files are created relative
    to it, so a link already there is never followed out of the tree."""
    open_dirs = [((), root_fd)]                          # the path down to the current directory
    try:
        for directory in directories:
            while directory[:len(open_dirs[-1][0])] != open_dirs[-1][0]:
                os.close(open_dirs.pop()[1])
            while len(open_dirs[-1][0]) < len(directory):
                path, parent = directory[:len(open_dirs[-1][0]) + 1], open_dirs[-1][1]
                if path == directory:
                    try:
                        os.mkdir(path[-1], dir_fd=parent)
                    except FileExistsError:
                        pass                            # a link in its place: refused by O_NOFOLLOW
                open_dirs.append((path, os.open(path[-1], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
                                                dir_fd=parent)))
            for name, data, mode in files_in[directory]:
                _write_file(name, data, mode, open_dirs[-1][1])
    finally:
        for _, fd in open_dirs[1:]:
            os.close(fd)


def _write_file(name, data, mode, dir_fd):
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
    try:
        written = 0
        while written < len(data):
            written += os.write(fd, data[written:])
        os.fchmod(fd, mode)                             # the mode whatever the umask, as tarfile
    finally:
        os.close(fd)


EMPTY_BLOCK = bytes(512)


def _tar_members(archive, what):
    """(name, type flag, mode, data) of each member of a gzip'd tar archive with ustar or GNU
    headers (what GNU tar writes for names under 100 characters). Other headers (pax, GNU long
    names) come out as members of their own type, which the caller refuses. Header checksums are
    not checked: gzip's CRC already covers every byte."""
    import gzip
    try:
        raw = gzip.decompress(archive)
    except (OSError, EOFError, zlib.error) as e:
        raise ArchiveError(f"{what}: not a readable gzip file ({e})") from None
    offset = 0
    while offset + 512 <= len(raw):
        header = raw[offset:offset + 512]
        if header == EMPTY_BLOCK:                        # end of archive
            return
        try:
            if header[257:263] not in (b"ustar\0", b"ustar "):
                raise ValueError("not a ustar or GNU header")
            name = header[:100].split(b"\0", 1)[0].decode()
            if header[257:263] == b"ustar\0" and header[345] != 0:        # POSIX ustar: name prefix
                name = header[345:500].split(b"\0", 1)[0].decode() + "/" + name
            mode, size = (int(header[a:b].strip(b"\0 ") or b"0", 8) for a, b in ((100, 108), (124, 136)))
        except ValueError as e:         # UnicodeDecodeError, a base-256 number, a damaged header
            raise ArchiveError(f"{what}: unreadable tar header at byte {offset} ({e})") from None
        start, offset = offset + 512, offset + 512 + (size + 511) // 512 * 512
        if start + size > len(raw):
            raise ArchiveError(f"{what}: member {name!r} runs past the end of the archive")
        yield name, header[156:157], mode, raw[start:start + size]
    raise ArchiveError(f"{what}: no end-of-archive marker")


TREE_STAMP = ".kfdtool-tree.json"      # in the sysfs root: what its topology was built from


def materialize(preset_name, sysfs_root, profile, parameters=None):
    """Write the machine's /sys subset under `sysfs_root`, as after a fresh boot: no KFD processes,
    the module parameters given. The topology (thousands of files) is kept from the last call when
    it was built for the same preset and kernel profile from the same capture and tree-building
    code, and nobody has changed it since; otherwise it is rebuilt. Returns the topology directory."""
    preset = find_preset(preset_name)
    root = Path(sysfs_root)
    kfd = root / "class" / "kfd" / "kfd"
    topo = kfd / "topology"
    stamp = root / TREE_STAMP
    built_from = {"preset": preset.name, "profile": list(profile), "source": tree_source_digest(preset.capture)}
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


# The package modules whose code decides a tree's bytes: this module and what it imports from
# kfdtool, directly or through them (tests/test_sim_start.py checks the list against the imports).
# A change anywhere else in kfdtool keeps the trees already built.
TREE_CODE = ("sim/__init__.py", "sim/machine.py", "sim/nodes.py", "ioctls/__init__.py",
             "ioctls/history.py", "ioctls/structs.py", "ioctls/requests.py", "ioctls/constants.py")


@functools.lru_cache(maxsize=None)
def tree_source_digest(capture):
    """Digest of what a tree built from `capture` is made of: the shipped archive and TREE_CODE."""
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256(_capture_archive(capture))
    for name in TREE_CODE:
        digest.update(name.encode() + b"\0" + (package / name).read_bytes())
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
