"""KFD topology (``/sys/class/kfd/kfd/topology``) as libhsakmt sees it, tolerant of real captures.

    >>> topo = read_topology()               # or read_topology("/path/to/capture/root")
    >>> for gpu in topo.for_each_gpu(): print(gpu.gpu_id, gpu.gfx_name, gpu.cu_count, gpu.bdf)
"""
import os
from dataclasses import dataclass, field

from .errors import SysfsError
from .sysfs import SysfsRoot, malformed_property_lines, numbered_dirs, parse_properties, read_int, read_text

GENERATION_RETRIES = 5
IOLINK_TYPES = {1: "HYPERTRANSPORT", 2: "PCIE", 3: "AMBA", 4: "MIPI", 5: "QPI_1_1", 8: "QPI",
                9: "PCIE3", 10: "INFINIBAND", 11: "XGMI", 12: "XGOP", 13: "GZ", 14: "ETHERNET_RDMA",
                15: "ETHERNET_FABRIC", 16: "AMBA_FABRIC", 17: "NUMA", 18: "QPI_1_1_FABRIC"}


@dataclass
class Link:
    kind: str                      # "io_links" or "p2p_links"
    index: int
    props: dict

    @property
    def type_name(self):
        return IOLINK_TYPES.get(self.props.get("type"), str(self.props.get("type")))

    @property
    def node_from(self):
        return self.props.get("node_from")

    @property
    def node_to(self):
        return self.props.get("node_to")


@dataclass
class Cache:
    index: int
    props: dict
    sibling_map: list

    @property
    def level(self):
        return self.props.get("level")


@dataclass
class MemBank:
    index: int
    props: dict
    used_memory: int | None = None


@dataclass
class Node:
    index: int
    props: dict = field(default_factory=dict)
    gpu_id: int | None = None
    name: str | None = None
    mem_banks: list = field(default_factory=list)
    caches: list = field(default_factory=list)
    io_links: list = field(default_factory=list)
    p2p_links: list = field(default_factory=list)
    hidden: bool = False                   # EPERM on read: the device cgroup hides this node
    problems: list = field(default_factory=list)
    partition_index: int = 0               # filled in by Topology: rank among nodes of one device
    partitions: int = 1

    def _p(self, key, default=0):
        value = self.props.get(key, default)
        return value if isinstance(value, int) else default

    @property
    def is_gpu(self):
        return self._p("simd_count") > 0 or bool(self.gpu_id) or self.hidden

    @property
    def gfx_target_version(self):
        return self._p("gfx_target_version") or None

    @property
    def gfx_name(self):
        return gfx_name(self.gfx_target_version)

    @property
    def num_xcc(self):
        return self._p("num_xcc", 1) or 1

    @property
    def cu_count(self):
        simd_per_cu = self._p("simd_per_cu")
        return self._p("simd_count") // simd_per_cu if simd_per_cu else 0

    @property
    def cu_per_xcc(self):
        return self.cu_count // self.num_xcc

    @property
    def location_id(self):
        return self._p("location_id")

    @property
    def bdf(self):
        """PCI address from location_id ((bus << 8) | devfn) and domain."""
        if not self.location_id:
            return None
        loc = self.location_id
        return f"{self._p('domain'):04x}:{(loc >> 8) & 0xFF:02x}:{(loc >> 3) & 0x1F:02x}.{loc & 7:x}"

    @property
    def device_key(self):
        """Identifies the physical device: partitions share model, domain, bus and device number."""
        if not self.location_id:
            return ("node", self.index)
        return (self._p("device_id"), self._p("domain"), self.location_id >> 3)

    @property
    def hive_id(self):
        return self._p("hive_id") or None

    @property
    def partition_mode(self):
        """A hint from the topology alone: SPX for an unpartitioned GPU, CPX for one XCC per node."""
        if not self.is_gpu or self.hidden:
            return None
        if self.partitions == 1:
            return "SPX"
        if self.num_xcc == 1:
            return "CPX"
        return {2: "DPX", 3: "TPX", 4: "QPX"}.get(self.partitions, f"{self.partitions}-way")

    def to_dict(self):
        return {
            "node": self.index, "gpu_id": self.gpu_id, "name": self.name, "hidden": self.hidden,
            "kind": "gpu" if self.is_gpu else "cpu", "gfx_target_version": self.gfx_target_version,
            "gfx_name": self.gfx_name, "cu_count": self.cu_count, "num_xcc": self.num_xcc,
            "simd_count": self._p("simd_count"), "cpu_cores_count": self._p("cpu_cores_count"),
            "device_id": self._p("device_id") or None, "pci_bdf": self.bdf, "hive_id": self.hive_id,
            "partition_mode": self.partition_mode, "partition_index": self.partition_index,
            "partitions": self.partitions, "drm_render_minor": self.props.get("drm_render_minor"),
            "properties": dict(self.props),
            "mem_banks": [{"index": b.index, **b.props, "used_memory": b.used_memory} for b in self.mem_banks],
            "caches": len(self.caches),
            "io_links": [{"index": ln.index, "type_name": ln.type_name, **ln.props} for ln in self.io_links],
            "p2p_links": [{"index": ln.index, "type_name": ln.type_name, **ln.props} for ln in self.p2p_links],
            "problems": list(self.problems),
        }


@dataclass
class Topology:
    generation_id: int | None
    system_properties: dict
    nodes: list
    problems: list = field(default_factory=list)

    def for_each_gpu(self):
        return (n for n in self.nodes if n.is_gpu)

    def for_each_cpu(self):
        return (n for n in self.nodes if not n.is_gpu)

    def find_gpu(self, gpu_id):
        return next((n for n in self.for_each_gpu() if n.gpu_id == gpu_id), None)

    @property
    def oem(self):
        return {k: decode_oem(self.system_properties.get(k)) for k in ("platform_oem", "platform_id")}

    def hives(self):
        hives = {}
        for gpu in self.for_each_gpu():
            if gpu.hive_id:
                hives.setdefault(gpu.hive_id, []).append(gpu.index)
        return hives

    def to_dict(self):
        """The ``kfdtool topology --json`` schema (version 1): see README."""
        return {
            "schema": "kfdtool.topology/1",
            "generation_id": self.generation_id,
            "system_properties": dict(self.system_properties),
            "platform": self.oem,
            "hives": {str(h): nodes for h, nodes in self.hives().items()},
            "nodes": [n.to_dict() for n in self.nodes],
            "problems": list(self.problems),
        }


def gfx_name(target_version):
    """90402 -> 'gfx942', 90010 -> 'gfx90a', 110002 -> 'gfx1102' (major*10000 + minor*100 + step)."""
    if not target_version:
        return None
    major, rest = divmod(int(target_version), 10000)
    minor, step = divmod(rest, 100)
    return f"gfx{major}{minor}{step:x}"


def decode_oem(value):
    """platform_oem/platform_id pack ASCII bytes little-endian (ACPI OEM ids)."""
    if not isinstance(value, int) or value <= 0:
        return None
    raw = value.to_bytes(8, "little").rstrip(b"\0")
    return raw.decode("ascii", "replace") if raw else None


def read_topology(root=None, retries=GENERATION_RETRIES):
    """Walk the topology; retry while generation_id changes during the walk (hotplug, partition
    switch). After `retries` attempts the last walk is returned with a problem noted."""
    sysfs = root if isinstance(root, SysfsRoot) else SysfsRoot(root)
    topo_dir = sysfs.topology
    if not topo_dir.is_dir():
        sysfs.require_kfd()
        raise SysfsError(f"{topo_dir} {_why_not_a_directory(topo_dir)}")
    for _ in range(max(1, retries)):
        before = read_int(topo_dir / "generation_id")
        topo = _walk(topo_dir)
        after = read_int(topo_dir / "generation_id")
        topo.generation_id = after
        if before == after:
            return topo
    topo.problems.append(f"generation_id kept changing over {retries} walks; the view may be inconsistent")
    return topo


def _walk(topo_dir):
    problems = []
    sysprops = _read_props(topo_dir / "system_properties", problems)
    nodes = [_read_node(topo_dir / "nodes" / str(i), i) for i in numbered_dirs(topo_dir / "nodes")]
    if (topo_dir / "nodes").exists() and not (topo_dir / "nodes").is_dir():
        problems.append(f"{topo_dir / 'nodes'} is not a directory")
    seen = {}
    for node in nodes:                     # gpu_ids name GPUs in every ioctl: two nodes cannot share one
        if node.gpu_id:
            if node.gpu_id in seen:
                node.problems.append(f"gpu_id {node.gpu_id} is also node {seen[node.gpu_id]}'s")
            seen.setdefault(node.gpu_id, node.index)
    if not nodes:
        problems.append(f"no nodes under {topo_dir}")
    _assign_partitions(nodes)
    return Topology(None, sysprops or {}, nodes, problems)


def _why_not_a_directory(path):
    try:
        os.stat(path)
    except FileNotFoundError:
        return "is missing"
    except OSError as e:                   # ELOOP (a symbolic link loop), EACCES, ...
        return f"cannot be read: {e.strerror}"
    return "is not a directory"


def _read_props(path, problems):
    try:
        text = read_text(path)
    except PermissionError:
        problems.append(f"{path}: permission denied")
        return None
    except OSError as e:
        problems.append(f"{path}: {e.strerror}")
        return None
    except SysfsError as e:
        problems.append(str(e))
        return None
    return None if text is None else parse_properties(text)


def _read_node(path, index):
    node = Node(index)
    try:
        text = read_text(path / "properties")
    except PermissionError:
        node.hidden = True                 # device cgroup: the kernel returns EPERM on every file
        node.problems.append("hidden: permission denied (device cgroup)")
        return node
    except (OSError, SysfsError) as e:     # SysfsError: a symbolic link loop, a file too large to be one
        node.problems.append(f"properties unreadable: {getattr(e, 'strerror', None) or e}")
        text = None
    if text is None:
        node.problems.append("no properties file")
    else:
        node.props = parse_properties(text)
        # every node's properties carry both counts (0 on the other kind): without them, or with a
        # negative one, the file is corrupt and the node's kind rests on gpu_id alone
        bad = [k for k in ("simd_count", "cpu_cores_count")
               if not isinstance(node.props.get(k), int) or node.props[k] < 0]
        if bad:
            node.problems.append(f"properties corrupt or cut short: {', '.join(bad)} "
                                 f"{'missing or not a count' if len(bad) > 1 else 'is missing or not a count'}")
        junk = malformed_property_lines(text)
        if junk:
            node.problems.append(f"properties: {junk} line(s) are not `name number`")

    gpu_id_text = _optional(lambda: read_text(path / "gpu_id"), node, "gpu_id")
    node.gpu_id = None
    if gpu_id_text is not None:
        try:
            node.gpu_id = int(gpu_id_text.strip())
        except ValueError:
            node.problems.append(f"gpu_id: not a number ({gpu_id_text.strip()[:20]!r})")
        if node.gpu_id is not None and node.gpu_id < 0:
            node.problems.append(f"gpu_id: {node.gpu_id} is negative")
            node.gpu_id = None
    name = _optional(lambda: read_text(path / "name"), node, "name")
    node.name = name.strip() if name is not None else None
    for kind in ("io_links", "p2p_links"):
        for i in numbered_dirs(path / kind):
            props = _read_props(path / kind / str(i) / "properties", node.problems)
            if props is not None:
                getattr(node, kind).append(Link(kind, i, props))
    for i in numbered_dirs(path / "mem_banks"):
        props = _read_props(path / "mem_banks" / str(i) / "properties", node.problems)
        if props is not None:
            used = _optional(lambda: read_int(path / "mem_banks" / str(i) / "used_memory"), node, "used_memory")
            node.mem_banks.append(MemBank(i, props, used))
    for i in numbered_dirs(path / "caches"):
        props = _read_props(path / "caches" / str(i) / "properties", node.problems)
        if props is not None:
            sibling = props.pop("sibling_map", "")
            bits = [int(b) for b in str(sibling).split(",") if b.strip().isdigit()]
            node.caches.append(Cache(i, props, bits))
    return node


def _optional(read, node, what):
    try:
        return read()
    except PermissionError:
        node.problems.append(f"{what}: permission denied")
    except OSError as e:
        node.problems.append(f"{what}: {e.strerror}")
    except SysfsError as e:                # a symbolic link loop, a file too large to be an attribute
        node.problems.append(f"{what}: {e}")
    return None


def _assign_partitions(nodes):
    by_device = {}
    for node in nodes:
        if node.is_gpu and not node.hidden:
            by_device.setdefault(node.device_key, []).append(node)
    for members in by_device.values():
        for rank, node in enumerate(sorted(members, key=lambda n: n.location_id)):
            node.partition_index, node.partitions = rank, len(members)
