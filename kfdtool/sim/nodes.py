"""The simulated kernel's GPU nodes, as kfd_topology.c keeps them (struct kfd_topology_device).

The kernel writes the topology tree (kfd_topology.c: node_show, mem_show); machine.py wrote the
simulated one. The simulated kernel learns its nodes by reading back what it published, with its
own reader: it must not share kfdtool's sysfs parser or topology reader, which are what tests
check against it."""
import os
from dataclasses import dataclass


def parse_properties(text):
    """A `properties` file as the kernel prints it (kfd_topology.c: sysfs_show_32bit_prop /
    sysfs_show_64bit_prop): one `name %u` / `name %llu` line per property -> {name: int}.
    Anything else (a capture's odd line) is skipped: the kernel reads no property it cannot print."""
    props = {}
    for line in text.splitlines():
        name, _, value = line.strip().partition(" ")
        try:
            props[name] = int(value)
        except ValueError:
            continue
    return props


@dataclass(frozen=True, eq=False)
class SimNode:
    """One GPU node: its properties as published, its gpu_id and its memory banks' properties."""
    index: int
    gpu_id: int
    props: dict
    mem_banks: tuple

    @property
    def gfx_target_version(self):
        return self.props.get("gfx_target_version", 0)

    @property
    def num_xcc(self):
        return self.props.get("num_xcc", 1) or 1

    @property
    def cu_count(self):
        simd_per_cu = self.props.get("simd_per_cu", 0)
        return self.props.get("simd_count", 0) // simd_per_cu if simd_per_cu else 0

    @property
    def cu_per_xcc(self):
        return self.cu_count // self.num_xcc


def _read(path):
    with open(path) as f:
        return f.read()


def _numbered(path):
    try:
        return sorted(int(name) for name in os.listdir(path) if name.isdigit())
    except FileNotFoundError:
        return []


def read_gpu_nodes(topology_dir):
    """The GPU nodes of the tree at `topology_dir`, in node order. A GPU node is one with a
    non-zero gpu_id: node_show prints 0 for CPU nodes (kfd_topology.c: node_show, "gpu_id")."""
    nodes = []
    for index in _numbered(os.path.join(topology_dir, "nodes")):
        node_dir = os.path.join(topology_dir, "nodes", str(index))
        gpu_id = int(_read(os.path.join(node_dir, "gpu_id")).strip() or 0)
        if not gpu_id:
            continue
        banks_dir = os.path.join(node_dir, "mem_banks")
        banks = tuple(parse_properties(_read(os.path.join(banks_dir, str(bank), "properties")))
                      for bank in _numbered(banks_dir))
        nodes.append(SimNode(index, gpu_id, parse_properties(_read(os.path.join(node_dir, "properties"))), banks))
    return nodes
