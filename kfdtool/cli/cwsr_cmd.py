"""kfdtool cwsr: can queues on this machine be preempted with their waves saved, and at what cost."""
import argparse
import sys

from ..cwsr.params import PARAMETERS, SCHED_POLICIES, read_parameters
from ..cwsr.sizing import cwsr_sizes
from ..processes import scan_processes
from ..topology import read_topology
from .argtypes import positive_int
from .render import console, group_identical, human_bytes, print_json, table
from .commands import help_for

HELP = help_for("cwsr")
EXAMPLES = """examples:
  kfdtool cwsr                          # parameters, per-GPU sizes, per-process save areas
  kfdtool cwsr --json
  kfdtool cwsr --probe --pid 1234         # could kfdtool preempt pid 1234's queues?
  kfdtool --sim mi300x cwsr
"""


def add_parser(sub):
    p = sub.add_parser("cwsr", aliases=["info"], help=HELP, description=HELP, epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true")
    p.add_argument("--probe", action="store_true", help="which preemption mechanisms would work, and why not")
    p.add_argument("--pid", type=positive_int, help="with --probe: for this target process")
    p.set_defaults(run=run)
    return p


def collect(ctx):
    params = read_parameters(ctx.sysfs)
    topo = read_topology(ctx.sysfs)
    gpus = []
    by_gpu = {}
    for node in topo.for_each_gpu():
        sizes = None if node.hidden else cwsr_sizes(node.props)
        by_gpu[node.gpu_id] = sizes
        gpus.append({"gpu_id": node.gpu_id, "node": node.index, "gfx_name": node.gfx_name, "num_xcc": node.num_xcc,
                     "ctl_stack_size": sizes.ctl_stack_size if sizes else None,
                     "cwsr_size": sizes.cwsr_size if sizes else None,
                     "debug_memory_size": sizes.debug_memory_size if sizes else None,
                     "queue_save_area_bytes": sizes.queue_mapping_bytes if sizes else None,
                     "source": sizes.source if sizes else None})
    processes = []
    scan = scan_processes(ctx.sysfs, with_identity=False, kernel_release=ctx.kernel_release)
    for proc in scan.processes:
        compute = [q for q in proc.queues if q.type_name == "compute"]
        total = sum((by_gpu.get(q.gpu_id).queue_mapping_bytes if by_gpu.get(q.gpu_id) else 0) for q in compute)
        processes.append({"pid": proc.pid, "compute_queues": len(compute), "save_area_bytes": total})
    enabled = params.get("cwsr_enable")
    return {"schema": "kfdtool.cwsr/1", "parameters": params,
            "cwsr_enabled": None if enabled is None else bool(enabled),
            "scheduler": SCHED_POLICIES.get(params.get("sched_policy")), "gpus": gpus, "processes": processes}


def run_probe(args, ctx):
    from ..cwsr.probe import probe
    ctx.require_running_sim()               # a stopped simulator's facts would read as "available"
    if args.pid is not None:
        ctx.require_kfd_process(args.pid, "is not a KFD process: no queues to preempt")
    report = probe(ctx, args.pid)
    # for a target: exit 1 when nothing could preempt it (scripts ask `cwsr --probe --pid P && ...`)
    status = 1 if args.pid is not None and not any(m["available"] for m in report["mechanisms"]) else 0
    if status:
        print(f"kfdtool: no mechanism can preempt pid {args.pid}'s queues here", file=sys.stderr)
    if args.json:
        print_json(report)
        return status
    out = console()
    out.print(table("preemption mechanisms" + (f" for pid {args.pid}" if args.pid else ""),
                    ["MECHANISM", "USABLE", "~WHY", "~NOTES"],
                    [(m["mechanism"], "yes" if m["available"] else "no", m["why"], "; ".join(m["notes"]))
                     for m in report["mechanisms"]]))
    out.print(table("per GPU", [">GPU_ID", "TARGET", "SCHEDULER", "GRACE PERIOD", "CWSR", ">MAX SAVE/QUEUE"],
                    group_identical([(g["gpu_id"], g["gfx_name"], g["scheduler"],
                                      "honoured" if g["grace_period_honoured"] else "ignored",
                                      "on" if g["cwsr"] else "off", human_bytes(g["max_save_bytes_per_queue"]))
                                     for g in report["gpus"]])))
    for note in report["notes"]:
        out.print(f"note: {note}")
    return status


def run(args, ctx):
    if args.probe:
        return run_probe(args, ctx)
    if args.pid is not None:
        raise ValueError("--pid needs --probe")
    info = collect(ctx)
    if args.json:
        print_json(info)
        return 0
    out = console()
    params = info["parameters"]
    out.print(table("amdgpu parameters", ["PARAMETER", ">VALUE", "~MEANING"],
                    [(k, "(not loaded)" if v is None else v, PARAMETERS[k]) for k, v in params.items()]))
    rows = group_identical([(g["gpu_id"], g["gfx_name"], g["num_xcc"], g["ctl_stack_size"], g["cwsr_size"],
                             human_bytes(g["queue_save_area_bytes"]), g["source"]) for g in info["gpus"]])
    out.print(table("CWSR save area per GPU (sizes per XCC; the per-queue area covers every XCC)",
                    [">GPU_ID", "TARGET", ">XCC", ">CTL_STACK", ">CWSR_SIZE", ">PER QUEUE", "SOURCE"], rows))
    if info["processes"]:
        out.print(table("CWSR save-area memory per process", [">PID", ">COMPUTE QUEUES", ">SAVE AREAS"],
                        [(p["pid"], p["compute_queues"], human_bytes(p["save_area_bytes"]))
                         for p in info["processes"]]))
    if info["cwsr_enabled"] is False:
        out.print("[yellow]cwsr_enable=0: preemption drains waves instead of saving them[/]")
    return 0
