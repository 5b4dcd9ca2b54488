"""kfdtool sim: start, inspect and stop simulated machines, and put simulated GPU work on them."""
import argparse
import os
import signal
import subprocess
import sys

from ..errors import SimulatorError
from .argtypes import non_negative_int, positive_int, process_count
from ..sim import ABIS
from .render import console, table
from .commands import help_for

HELP = help_for("sim")
EXAMPLES = """examples:
  kfdtool sim list                                  # machines you can simulate
  kfdtool sim start mi308x                          # start the simulated 8x MI308X (ABI 1.23)
  kfdtool sim start mi300x --abi 1.17               # an MI300X host as Linux 6.12 shows it
  kfdtool sim workload mi308x --procs 3 --queues 4  # three fake GPU processes with 4 queues each
  kfdtool --sim mi308x queues                       # look at them with the real readers
  kfdtool sim stop mi308x
"""


def add_parser(sub):
    p = sub.add_parser("sim", help=HELP, description=HELP, epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s = p.add_subparsers(dest="sim_command", metavar="COMMAND", required=True)
    s.add_parser("list", help="list simulated machines").set_defaults(run=run_list)
    start = s.add_parser("start", help="start a simulated machine",
                         description="Start a simulated machine in the background: its sysfs tree and a simulated "
                                     "/dev/kfd server. It runs until `kfdtool sim stop MACHINE`.")
    start.add_argument("machine", help="a name from `kfdtool sim list`")
    start.add_argument("--abi", default="1.23", choices=ABIS, help="KFD ABI version (default 1.23)")
    start.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                       help="amdgpu module parameter, e.g. sched_policy=2")
    start.set_defaults(run=run_start)
    stop = s.add_parser("stop", help="stop a simulated machine (its GPU processes exit)",
                        description="Stop a simulated machine; its simulated GPU processes exit with it.")
    stop.add_argument("machine", help="a name from `kfdtool sim list`")
    stop.set_defaults(run=run_stop)
    status = s.add_parser("status", help="is it running, with how many processes and queues",
                          description="Whether a simulated machine runs, with how many processes and queues.")
    status.add_argument("machine", help="a name from `kfdtool sim list`")
    status.set_defaults(run=run_status)
    work = s.add_parser("workload", help="start simulated GPU processes with queues",
                        description="Start simulated GPU processes on a running simulated machine, each with its "
                                    "queues, and return: they run in the background until `kfdtool sim stop "
                                    "MACHINE`. List them with `kfdtool --sim MACHINE queues`.")
    work.add_argument("machine", help="a simulated machine started with `kfdtool sim start`")
    work.add_argument("--procs", type=process_count, default=3, help="processes to start (default 3)")
    work.add_argument("--queues", type=non_negative_int, default=2, help="compute queues per GPU per process")
    work.add_argument("--gpus", type=positive_int, default=1, help="GPUs per process")
    work.add_argument("--sdma", type=non_negative_int, default=0, help="SDMA queues per GPU per process")
    work.add_argument("--waves", type=positive_int, default=512, help="resident waves per compute queue")
    work.add_argument("--role", action="append", help="process names to cycle through")
    work.set_defaults(run=run_workload)


def run_list(args, ctx):
    from ..sim.machine import PRESETS
    console().print(table("simulated machines", ["NAME", "DESCRIPTION"],
                          [(p.name, p.description) for p in PRESETS.values()]))
    return 0


def _params(items):
    from ..sim.machine import parse_setting
    return dict(parse_setting(item) for item in items)


def run_start(args, ctx):
    from ..sim import runner
    sim = runner.start(args.machine, args.abi, _params(args.param))
    print(f"simulated {args.machine} running (KFD ABI {args.abi}); sysfs root {sim.sysfs_root}")
    return 0


def run_stop(args, ctx):
    from ..sim import runner
    print(f"stopped {args.machine}" if runner.stop(args.machine) else f"{args.machine} was not running")
    return 0


def run_status(args, ctx):
    from ..sim import runner
    sim = runner.machine(args.machine)
    if not sim.is_running():
        print(f"{args.machine}: not running")
        return 1
    with sim.control() as ctl:
        st = ctl("status")
    print(f"{args.machine}: running, KFD ABI {st['abi']} ({st['release']}), {len(st['gpus'])} GPUs, "
          f"{len(st['processes'])} processes, {st['queues']} queues; sysfs root {st['sysfs_root']}")
    return 0


DEFAULT_ROLES = ["llm-serve", "resnet50-train", "batch-infer", "embed-svc"]


def spawn_workload(machine, role, gpus=1, first_gpu=0, queues=2, sdma=0, waves=512, priority=7, extra=()):
    """Start one simulated GPU process; returns its pid once its queues exist."""
    cmd = [sys.executable, "-m", "kfdtool.sim.workload", "--sim", machine, "--role", role, "--gpus", str(gpus),
           "--first-gpu", str(first_gpu), "--queues", str(queues), "--sdma", str(sdma), "--waves", str(waves),
           "--priority", str(priority), *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            start_new_session=True, text=True)
    try:
        line = proc.stdout.readline()
        if not line.startswith("ready"):
            err = proc.stderr.read().strip().splitlines()
            raise SimulatorError(f"workload {role} failed to start: {err[-1] if err else 'no output'}")
    except BaseException:                  # Ctrl-C while it starts: it does not stay behind
        proc.kill()
        proc.wait()
        raise
    return proc.pid


def run_workload(args, ctx):
    from ..sim import runner
    sim = runner.machine(args.machine)
    if not sim.is_running():
        raise SimulatorError(f"simulated {args.machine} is not running; start it with `kfdtool sim start {args.machine}`")
    roles = args.role or DEFAULT_ROLES
    pids = []
    try:
        for i in range(args.procs):
            pids.append(spawn_workload(args.machine, roles[i % len(roles)], args.gpus, i * args.gpus, args.queues,
                                       args.sdma, args.waves))
    except BaseException:                  # all or none: an interrupted or failed start leaves nothing running
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        raise
    print(f"started {len(pids)} simulated GPU processes: {' '.join(map(str, pids))}")
    return 0
