"""kfdtool topology: the GPUs and CPUs as KFD sees them."""
import sys

from ..topology import read_topology
from .render import console, human_bytes, print_json, table
from .commands import help_for

HELP = help_for("topology")
EXAMPLES = """examples:
  kfdtool topology                      # table of nodes
  kfdtool --sim mi308x topology         # the simulated 8x MI308X (CPX) host
  kfdtool topology --json | jq '.nodes[] | select(.kind=="gpu") | .gfx_name'
  KFDTOOL_SYSFS_ROOT=/path/to/capture kfdtool topology
"""


def add_parser(sub):
    p = sub.add_parser("topology", help=HELP, description=HELP, epilog=EXAMPLES, formatter_class=_raw())
    p.add_argument("--json", action="store_true", help="machine-readable output (schema kfdtool.topology/1)")
    p.set_defaults(run=run)


def _raw():
    import argparse
    return argparse.RawDescriptionHelpFormatter


def run(args, ctx):
    topo = read_topology(ctx.sysfs)
    warnings = topo.problems + [f"node {n.index}: {p}" for n in topo.nodes for p in n.problems]
    for problem in warnings:               # on stderr: --json stays parseable, a person still sees them
        print(f"warning: {problem}", file=sys.stderr)
    if args.json:
        print_json(topo.to_dict())
        return 0
    rows = []
    for n in topo.nodes:
        if n.hidden:
            rows.append((n.index, "gpu?", None, "hidden (no permission)", None, None, None, None, None, None, None))
            continue
        mem = sum(b.props.get("size_in_bytes", 0) for b in n.mem_banks) or None
        links = ", ".join(f"{sum(1 for ln in n.io_links if ln.type_name == t)}x{t}"
                          for t in sorted({ln.type_name for ln in n.io_links}))
        if n.is_gpu:
            rows.append((n.index, "gpu", n.gpu_id, n.gfx_name or "?", n.cu_count, n.num_xcc, n.bdf,
                         n.partition_mode, f"{n.hive_id:x}" if n.hive_id else None, human_bytes(mem), links))
        else:
            rows.append((n.index, "cpu", None, f"{n.props.get('cpu_cores_count', 0)} cores", None, None, None,
                         None, None, human_bytes(mem), links))
    gpus = list(topo.for_each_gpu())
    oem = " / ".join(v for v in topo.oem.values() if v)
    title = (f"KFD topology: {len(gpus)} GPU nodes, {len(topo.nodes) - len(gpus)} CPU nodes"
             f" (generation {topo.generation_id}{', platform ' + oem if oem else ''})")
    out = console()
    out.print(table(title, [">NODE", "KIND", ">GPU_ID", "TARGET", ">CUS", "->XCC", "PCI", "-PART", "-HIVE",
                            ">MEMORY", "-IO LINKS"], rows))
    return 0
