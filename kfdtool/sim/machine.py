"""Simulated machines: a topology preset (real public sysfs captures, shipped as package data) and
a kernel profile (KFD ABI version and the sysfs conventions of the matching Linux release).

`materialize()` writes the machine's sysfs tree to a directory, so kfdtool's real readers run on it
unchanged (KFDTOOL_SYSFS_ROOT=<dir>).
"""
import errno
import functools
import hashlib
import json
import os
import shutil
import stat
import string
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
                                                "smi_process_events smi_all_process_bit_checked "
                                                "debugger_keeps_the_role queue_size_page_aligned")):
    """What a simulated kernel looks like from user space, per KFD ABI version:
    publishes_cwsr_sizes: node_show prints cwsr_size / ctl_stack_size (kfd_topology.c; upstream
        "drm/amdkfd: Export the cwsr_size and ctl_stack_size to userspace", in stable 6.12.y);
    pasid_is_zero: proc/<pid>/pasid prints 0 (7.2);
    has_diq: sysfs queue type numbering keeps DIQ = 3 (6.12 and older);
    smi_process_events: PROCESS_START / PROCESS_END exist;
    smi_all_process_bit_checked: 6.12 needs ALL_PROCESS in the mask to see other pids;
    debugger_keeps_the_role: kfd_ioctl_set_debug_trap lets the process that did ENABLE make every
        op on its target without being the target's ptrace parent any more (7.2). Before, every op
        but DISABLE needed the caller to be the target itself or its ptrace parent at the time of
        the call ("PID %i is not PTRACED and cannot be debugged", -EPERM). The newer rule came with
        upstream 99b2fe4f19e3 ("drm/amdkfd: Fix missing authorization check in
        KFD_IOC_DBG_TRAP_DISABLE"), backported to 6.6.151, 6.12.103 and 6.18.45: the 1.17 profile keeps
        the older one of 6.12 before 6.12.103, although its other checks were read from 6.12.117,
        so that the kernels still shipping it stay simulated (kfdtool's windows for them are tested
        on it);
    queue_size_page_aligned: kfd_queue.c: kfd_queue_acquire_buffers looks the ring up at
        PAGE_ALIGN(queue_size + metadata_queue_size) (7.2; "drm/amdkfd: Align expected_queue_size
        to PAGE_SIZE"); 6.12 passes queue_size as given, so a ring under a page has only its start
        checked (6.1 looks no buffer up)."""
    __slots__ = ()

    @property
    def abi(self):
        # imported here: the ioctl tables are ~15 ms that read-only `--sim` commands never need
        from ..ioctls.history import KfdAbi
        return KfdAbi(self.abi_minor)


PROFILES = {
    "1.11": KernelProfile(11, "6.1.0-kfdtool-sim", False, False, True, False, True, False, False),
    "1.17": KernelProfile(17, "6.12.117-kfdtool-sim", True, False, True, False, True, False, False),
    "1.23": KernelProfile(23, "7.2.13-kfdtool-sim", True, True, False, True, False, True, True),
}

assert tuple(PROFILES) == ABIS

CWSR_KEYS = {"cwsr_size", "ctl_stack_size"}       # per-node CWSR sizes, printed by newer kernels only

DEFAULT_PARAMETERS = {          # amdgpu module parameters (kfd-abi.md §6.1) at their defaults
    "sched_policy": 0, "hws_max_conc_proc": -1, "cwsr_enable": 1, "max_num_of_queues_per_device": 4096,
    "send_sigterm": 0, "halt_if_hws_hang": 0, "hws_gws_support": "N", "queue_preemption_timeout_ms": 9000,
    "debug_evictions": "N", "no_queue_eviction_on_vm_fault": 0, "noretry": -1,
}


# kfd_module.c: kfd_init refuses to load KFD (no /dev/kfd at all) with these outside their range
# (KFD_MAX_NUM_OF_PROCESSES x KFD_MAX_NUM_OF_QUEUES_PER_PROCESS, kfd_priv.h: 512 x 1024; spelled out
# here: a module of the built tree imports nothing from outside the simulator, see TREE_CODE)
KFD_MAX_NUM_OF_QUEUES_PER_DEVICE = 512 * 1024
PARAMETER_RANGES = {"sched_policy": (0, 2),     # KFD_SCHED_POLICY_HWS .. KFD_SCHED_POLICY_NO_HWS
                    "max_num_of_queues_per_device": (1, KFD_MAX_NUM_OF_QUEUES_PER_DEVICE)}
INT_MIN, INT_MAX = -2 ** 31, 2 ** 31 - 1        # module_param(..., int): kstrtoint, else -ERANGE


def parse_setting(text):
    """`NAME=VALUE` (what `kfdtool sim start --param` and the server's `--param` take) as
    parse_parameter reads it."""
    name, sep, value = text.partition("=")
    if not sep:
        raise ValueError(f"--param wants NAME=VALUE, got {text!r}")
    return parse_parameter(name, value)


def parse_parameter(name, value):
    """An amdgpu module parameter as the kernel takes it at load: (name, value), or ValueError with
    the reason. An int is read by kstrtoint(s, 0) and a bool by kstrtobool (lib/kstrtox.c, through
    param_set_int / param_set_bool), so the same texts are accepted; a bool reads back as Y or N."""
    if name not in DEFAULT_PARAMETERS:
        raise ValueError(f"unknown amdgpu parameter {name!r}; choose one of: {', '.join(DEFAULT_PARAMETERS)}")
    text = str(value)
    if isinstance(DEFAULT_PARAMETERS[name], str):                      # a bool parameter
        truth = _kstrtobool(text)
        if truth is None:
            raise ValueError(f"{name} wants a boolean (y/n, 1/0, on/off, true/false), got {text!r}")
        return name, "Y" if truth else "N"
    number = None if isinstance(value, bool) else _kstrtoint(text)
    if number is None:
        raise ValueError(f"{name} wants an integer (decimal, 0x hex or 0 octal), got {text!r}")
    low, high = PARAMETER_RANGES.get(name, (INT_MIN, INT_MAX))
    if not low <= number <= high:
        raise ValueError(f"{name} must be in {low}..{high} (the kernel would not load KFD), got {number}"
                         if name in PARAMETER_RANGES else f"{name} must fit an int, got {number}")
    return name, number


def _kstrtoint(text):
    """kstrtoint(s, 0): an optional sign, then 0x/0X hex, a leading 0 octal, or decimal digits, and
    at most one newline after them; nothing else (no spaces). None if refused; range not checked."""
    body = text.removesuffix("\n")
    sign = -1 if body[:1] == "-" else 1
    if body[:1] in ("+", "-"):
        body = body[1:]
    if body[:2] in ("0x", "0X"):
        digits, allowed, base = body[2:], string.hexdigits, 16
    elif body[:1] == "0" and len(body) > 1:
        digits, allowed, base = body[1:], string.octdigits, 8
    else:
        digits, allowed, base = body, string.digits, 10
    if not digits or any(ch not in allowed for ch in digits):
        return None
    return sign * int(digits, base)


def _kstrtobool(text):
    """kstrtobool: the first character decides (e/y/t/1 true, d/n/f/0 false), and for o/O the
    second (n on, f off); None if refused."""
    if text[:1] in ("o", "O"):
        return _KSTRTOBOOL_AFTER_O.get(text[1:2])
    return _KSTRTOBOOL_FIRST.get(text[:1])


_KSTRTOBOOL_FIRST = {**dict.fromkeys("eEyYtT1", True), **dict.fromkeys("dDnNfF0", False)}
_KSTRTOBOOL_AFTER_O = {"n": True, "N": True, "f": False, "F": False}


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


class ArchiveError(ValueError):
    """A shipped archive that is not a tar of plain files and directories inside it."""


def extract_capture(capture, dest):
    """Unpack a shipped capture (the byte-for-byte copy of ../shared/fixtures/kfd-topology/<capture>)."""
    return extract_archive(_capture_archive(capture), dest, f"capture {capture}")


def extract_archive(archive, dest, what="archive"):
    """Unpack a gzip'd tar of plain files and directories under `dest`, with the result of tarfile's
    extractall(filter="data"): files rw-r--r-- (rwxr-xr-x where the owner may execute), directories
    by the umask; every member is checked before anything is written. This is most of a first
    `kfdtool sim start` (8267 members for mi300x-cpx), so it avoids tarfile (~30 us a header) and
    threads (on 2 CPUs they cost more in switching than they overlap): one pass, each entry created
    relative to `dest`'s descriptor."""
    members = list(_tar_members(archive, what))
    Path(dest).mkdir(parents=True, exist_ok=True)
    dest_fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY)
    made = {""}                                     # directories known to exist, relative to dest
    try:
        for rel, data, mode in members:
            parent = rel.rpartition("/")[0]
            if parent not in made:                  # a member whose directory the archive does not list
                _make_dirs(parent, dest_fd, made, what)
            if data is None:
                _make_dirs(rel, dest_fd, made, what)
                continue
            fd = os.open(rel, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dest_fd)
            try:
                os.write(fd, data)
                os.fchmod(fd, mode)                 # the mode whatever the umask, as tarfile
            finally:
                os.close(fd)
    finally:
        os.close(dest_fd)
    return Path(dest)


def _make_dirs(rel, dest_fd, made, what):
    """Create directory `rel` and its missing parents under dest; one already there must be a real
    directory (never a link that would lead out of dest)."""
    parts = rel.split("/")
    for depth in range(1, len(parts) + 1):
        path = "/".join(parts[:depth])
        if path in made:
            continue
        try:
            os.mkdir(path, dir_fd=dest_fd)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(path, dir_fd=dest_fd).st_mode):
                raise ArchiveError(f"{what}: {path!r} exists and is not a directory") from None
        made.add(path)


TAR_BLOCK = 512


def _tar_members(archive, what):
    """(path relative to the archive's root, bytes or None for a directory, file mode) of each
    member of a gzip'd POSIX or GNU tar. Anything but a plain file or a directory (links, devices,
    extended headers), an absolute name, ".." or a bad header checksum is an ArchiveError."""
    import gzip
    try:
        raw = gzip.decompress(archive)
    except (OSError, EOFError, zlib.error) as e:
        raise ArchiveError(f"{what}: not a gzip'd archive ({e})") from None
    pos = 0
    while pos + TAR_BLOCK <= len(raw):
        header = raw[pos:pos + TAR_BLOCK]
        if header == bytes(TAR_BLOCK):          # end of archive
            return
        if _octal(header[148:156], what) != sum(header[:148]) + 8 * ord(" ") + sum(header[156:]):
            raise ArchiveError(f"{what}: bad tar header checksum at byte {pos}")
        name = header[:100].split(b"\0", 1)[0]
        if header[257:263] == b"ustar\0":         # POSIX: a long name's leading part is in prefix
            prefix = header[345:500].split(b"\0", 1)[0]
            name = prefix + b"/" + name if prefix else name
        name = name.decode("utf-8", "replace")
        kind, size = header[156:157], _octal(header[124:136], what)
        parts = [part for part in name.split("/") if part not in ("", ".")]
        if name.startswith("/") or ".." in parts or kind not in (b"0", b"\0", b"5") or (kind != b"5" and not parts):
            raise ArchiveError(f"{what}: refusing member {name!r} (only plain files and directories inside it)")
        pos += TAR_BLOCK
        if kind == b"5":
            if parts:
                yield "/".join(parts), None, None
        else:
            if pos + size > len(raw):
                break
            mode = _octal(header[100:108], what)
            mode = (mode & 0o755 if mode & 0o100 else mode & 0o644) | 0o600     # tarfile's data filter
            yield "/".join(parts), raw[pos:pos + size], mode
        pos += -(-size // TAR_BLOCK) * TAR_BLOCK
    raise ArchiveError(f"{what}: truncated tar archive")


def _octal(field, what):
    try:
        return int(field.split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:
        raise ArchiveError(f"{what}: bad number {field!r} in a tar header") from None


TREE_STAMP = ".kfdtool-tree.json"      # in the sysfs root: what its topology was built from


def materialize(preset_name, sysfs_root, profile, parameters=None):
    """Write the machine's /sys subset under `sysfs_root`, as after a fresh boot: no KFD processes,
    the module parameters given. The topology (thousands of files) is kept from the last call when
    it was built for the same preset, kernel profile and kfdtool code and nobody has changed it
    since; otherwise it is rebuilt. Returns the topology directory.

    `sysfs_root` may be a link to the directory to write (on a memory filesystem, see runner.py:
    place_sysfs_tree); where that filesystem is full, the link goes and the tree is written at
    `sysfs_root` itself (what the link led to is left to its owner: runner.prune_linked_trees)."""
    try:
        return _materialize(preset_name, sysfs_root, profile, parameters)
    except OSError as e:
        root = Path(sysfs_root)
        if e.errno != errno.ENOSPC or not root.is_symlink():
            raise
        root.unlink()
        return _materialize(preset_name, sysfs_root, profile, parameters)


def _materialize(preset_name, sysfs_root, profile, parameters):
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


# The code a tree is built from: this module and the modules of this package it imports (a test
# checks the list against its imports). Editing anything else (the ioctl handlers, the CLI) keeps
# the trees already built.
TREE_CODE = ("__init__.py", "machine.py", "nodes.py")


@functools.lru_cache(maxsize=None)
def code_version():
    """Digest of the code and the shipped captures that trees are built from."""
    here = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in [*(here / name for name in TREE_CODE), *sorted((here / "presets").iterdir())]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
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
