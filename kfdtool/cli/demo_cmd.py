"""kfdtool demo: the whole tool on a simulated host, from nothing, in a few seconds."""
import argparse
import os
import signal

from ..sysfs import SysfsRoot
from .argtypes import non_empty
from . import cwsr_cmd, preempt_cmd, queues_cmd, topology_cmd
from .context import Context
from .render import console
from .sim_cmd import spawn_workload
from .commands import help_for

HELP = help_for("demo")
WORKLOADS = (   # role, GPUs, compute queues per GPU, SDMA queues per GPU, waves, priority
    ("llm-serve", 2, 2, 0, 160, 11),
    ("resnet50-train", 1, 4, 1, 120, 7),
    ("batch-infer", 1, 3, 0, 200, 0),
)


def add_parser(sub):
    p = sub.add_parser("demo", help=HELP, description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  kfdtool demo\n  kfdtool demo --machine mi300x --keep\n")
    p.add_argument("--machine", type=non_empty, help="simulated machine (default mi308x; `kfdtool --sim NAME demo` names it too)")
    p.add_argument("--keep", action="store_true", help="leave the simulator and its processes running")
    p.set_defaults(run=run)


def run(args, ctx):
    from ..sim import runner
    from ..topology import read_topology
    sim_name = getattr(args, "sim", None)
    if args.machine and sim_name and args.machine != sim_name:
        raise ValueError(f"--sim {sim_name} and --machine {args.machine} name different machines; give one")
    if getattr(args, "sysfs_root", None):
        raise ValueError("demo runs on a simulated machine: --sysfs-root does not apply (use --machine NAME)")
    args.machine = args.machine or sim_name or "mi308x"
    out = console()
    was_running = runner.machine(args.machine).is_running()
    sim = runner.start(args.machine)
    pids = []
    try:
        out.rule(f"[bold]simulated {args.machine}[/] (KFD ABI {sim.info.get('abi')}, {sim.kernel_release})")
        available = sum(1 for _ in read_topology(sim.sysfs_root).for_each_gpu())
        first = 0
        for role, gpus, queues, sdma, waves, prio in WORKLOADS:   # a machine of fewer GPUs: they share
            gpus = min(gpus, available)
            pids.append(spawn_workload(args.machine, role, gpus, first % available, queues, sdma, waves, prio))
            first += gpus
        sim_ctx = Context(SysfsRoot(sim.sysfs_root), sim, sim.kernel_release)
        out.print(f"$ kfdtool --sim {args.machine} topology")
        topology_cmd.run(argparse.Namespace(json=False), sim_ctx)
        out.print(f"\n$ kfdtool --sim {args.machine} queues")
        queues_cmd.run(argparse.Namespace(pid=None, name=None, json=False, csv=False, interval=None, count=None),
                       sim_ctx)
        out.print(f"\n$ kfdtool --sim {args.machine} cwsr")
        cwsr_cmd.run(argparse.Namespace(json=False, probe=False, pid=None), sim_ctx)
        batch = pids[-1]
        out.print(f"\n$ kfdtool --sim {args.machine} preempt --pid {batch} --for 300ms --grace 100"
                  f"     # suspend the batch job's queues (CWSR), then resume")
        preempt_cmd.run_preempt(argparse.Namespace(pid=batch, queue=None, gpu=None, grace=100, duration=0.3,
                                                   mechanism="debug-trap", json=False), sim_ctx)
    finally:
        if not args.keep:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            if not was_running:
                runner.stop(args.machine)
    if args.keep:
        out.print(f"\nleft running: try `kfdtool --sim {args.machine} queues`; stop with "
                  f"`kfdtool sim stop {args.machine}`")
    return 0
