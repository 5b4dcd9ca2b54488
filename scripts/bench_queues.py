#!/usr/bin/env python3
"""Benchmark `kfdtool queues --json` on a simulated 8-GPU host (8x MI300X SPX) with N KFD
processes x 8 queues: wall time and peak RSS of the whole command, as a user runs it, at
N = 100 / 1,000 / 4,000. Target: <= 0.3 s at 1,000 x 8.

Layout "per-gpu": each process has its 8 queues on one GPU (processes round-robin over the GPUs,
the usual one-process-per-GPU ML layout). Layout "wide" (at 1,000 only): every process has one
queue on each of the 8 GPUs, the worst case (8x the per-GPU stats files).
The simulated processes are real OS processes (`sleep`) adopted by the simulator, so the /proc
reads (name, user, cmdline, NSpid) do real work. The simulated sysfs tree lives in /dev/shm where
there is one: real sysfs is in memory, and a disk-backed tree would also measure the page cache.
A breakdown is measured in-process: start-up (interpreter and the imports `queues --json` needs),
the scan as the command runs it (forked workers) and on one CPU, and the JSON output; and the floor
the host's syscalls set: scripts/scan_floor.c, the same reads in C on one CPU (needs gcc).
Results go to results/bench_queues.{json,png}.

    python scripts/bench_queues.py [--sizes 100 1000 4000] [--repeat 9] [--baseline OLD_CHECKOUT]
"""
import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from benchlib import memory_scratch, provenance  # noqa: E402  (next to this script)
GPUS = 8
QUEUES_PER_PROC = 8
STARTUP_IMPORTS = "import kfdtool.cli, kfdtool.cli.queues_cmd, kfdtool.sim.runner, json"


def run_once(machine, tree=None):
    """One `kfdtool queues --json` (of the checkout `tree`, default this one): wall time, document."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))} \
        if tree else None
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "kfdtool", "--sim", machine, "queues", "--json"],
                          capture_output=True, env=env, cwd=tree or REPO)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"kfdtool failed: {proc.stderr.decode().strip()}")
    return wall, json.loads(proc.stdout)


def measure_rss(machine):
    """Peak RSS of one kfdtool run, read by /usr/bin/time-like wait4 on that child alone."""
    proc = subprocess.Popen([sys.executable, "-m", "kfdtool", "--sim", machine, "queues", "--json"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, _, usage = os.wait4(proc.pid, 0)
    return usage.ru_maxrss * 1024


def _wall(cmd):
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def _wait_for_processes(ctl, count, timeout=60):
    deadline = time.monotonic() + timeout
    while len(ctl("status")["processes"]) != count and time.monotonic() < deadline:
        time.sleep(0.05)


def _compare(machine, baseline, repeat):
    """The baseline checkout and this one, alternately (a shared VM's speed drifts minute to minute)."""
    walls = {"baseline": [], "this": []}
    for _ in range(repeat):
        base_wall, base_doc = run_once(machine, baseline)
        this_wall, this_doc = run_once(machine)
        if base_doc != this_doc:
            raise SystemExit("the baseline printed a different document")
        walls["baseline"].append(base_wall)
        walls["this"].append(this_wall)
    rev = None
    if (Path(baseline) / ".git").exists():              # a checkout or worktree of its own, not a copy
        rev = subprocess.run(["git", "-C", baseline, "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True).stdout.strip() or None
    result = {"baseline_rev": rev, "same_output": True,
              **{f"{k}_wall_s_median": statistics.median(v) for k, v in walls.items()}}
    print(f"      alternating with {baseline} ({result['baseline_rev']}): baseline "
          f"{result['baseline_wall_s_median']:.3f} s, this {result['this_wall_s_median']:.3f} s (same output)")
    return result


def _breakdown(sysfs_root):
    """In-process, best of 3: the scan as `kfdtool queues` runs it, the same on one CPU, and the
    JSON rendering of its result."""
    from kfdtool.parallel import split
    from kfdtool.processes import PROCESSES_PER_WORKER, scan_processes
    timings = {"scan": [], "scan_one_cpu": [], "json_output": []}
    for _ in range(3):
        for key, workers in (("scan", None), ("scan_one_cpu", 1)):
            start = time.perf_counter()
            scan = scan_processes(sysfs_root, workers=workers)
            timings[key].append(time.perf_counter() - start)
        start = time.perf_counter()
        json.dumps(scan.to_dict(), separators=(",", ":"))
        timings["json_output"].append(time.perf_counter() - start)
    workers = len(split(scan.processes, PROCESSES_PER_WORKER))
    return {key: min(values) for key, values in timings.items()}, workers


def build_scan_floor(directory):
    """scripts/scan_floor.c (the same reads in C, one CPU), if gcc is here; else None."""
    exe = Path(directory) / "scan_floor"
    try:
        subprocess.run(["gcc", "-O2", "-o", str(exe), str(REPO / "scripts" / "scan_floor.c")], check=True,
                       capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return exe


def measure_scan_floor(exe, sysfs_root):
    """Best of 3 runs of the C scan over the simulated proc/ tree, in seconds."""
    if exe is None:
        return None
    proc = Path(sysfs_root) / "class" / "kfd" / "kfd" / "proc"
    runs = [json.loads(subprocess.run([str(exe), str(proc)], check=True, capture_output=True, text=True).stdout)
            for _ in range(3)]
    return min(r["seconds"] for r in runs)


def measure_identity_cost(pids):
    """µs a process for name, user, cmdline and container pid: kfdtool's two /proc reads vs
    psutil.Process (which kfdtool used before; the reason it no longer does in the scan)."""
    import psutil
    from kfdtool.processes import KfdProcess, identify

    def with_psutil(pid):
        p = psutil.Process(pid)
        with p.oneshot():
            p.name(), p.cmdline(), p.username()          # psutil has no NSpid: this flatters it

    costs = {}
    for label, fn in (("kfdtool", lambda pid: identify(KfdProcess(pid))), ("psutil", with_psutil)):
        start = time.perf_counter()
        for pid in pids:
            fn(pid)
        costs[label] = (time.perf_counter() - start) / len(pids) * 1e6
    return costs


def measure_host_syscall_cost(directory=None):
    """µs per open+read+close of a small file (in `directory`) by a tight loop: the unit cost the
    scan is made of, measured next to each row because a shared VM's varies minute to minute."""
    with tempfile.NamedTemporaryFile("w", delete=False, dir=directory) as f:
        f.write("123\n")
    start = time.perf_counter()
    for _ in range(5000):
        fd = os.open(f.name, os.O_RDONLY)
        os.read(fd, 64)
        os.close(fd)
    os.unlink(f.name)
    return (time.perf_counter() - start) / 5000 * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 4000])
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--out", default=str(REPO / "results" / "bench_queues"))
    parser.add_argument("--baseline", metavar="CHECKOUT",
                        help="another kfdtool checkout (e.g. `git worktree add /tmp/old REV`): at 1,000 x 8, "
                             "its command and this one run alternately, and must print the same document")
    parser.add_argument("--replot", metavar="RESULT_JSON", help="only redraw the plot of an earlier result")
    args = parser.parse_args()
    if args.replot:
        result = json.loads(Path(args.replot).read_text())
        _plot(result["rows"], str(Path(args.replot).with_suffix(".png")), result["host"]["cores"])
        return
    created = None
    if "KFDTOOL_SIM_DIR" not in os.environ:
        created = os.environ["KFDTOOL_SIM_DIR"] = memory_scratch("kfdtool-bench-")
    sys.path.insert(0, str(REPO))
    from kfdtool.sim import runner

    floor_exe = build_scan_floor(os.environ["KFDTOOL_SIM_DIR"])
    machine = "mi300x"
    sim = runner.start(machine, realtime=False)
    ctl = sim.control()
    gpus = ctl("status")["gpus"]
    assert len(gpus) == GPUS
    sleepers = []
    rows = []
    try:
        startup = statistics.median(_wall([sys.executable, "-c", STARTUP_IMPORTS]) for _ in range(5))
        plan = [(n, "per-gpu") for n in sorted(args.sizes)]
        if 1000 in args.sizes:
            plan.insert(plan.index((1000, "per-gpu")) + 1, (1000, "wide"))
        for n, layout in plan:
            for p in sleepers:
                p.kill()
                p.wait()
            sleepers.clear()
            _wait_for_processes(ctl, 0)
            for i in range(n):
                p = subprocess.Popen(["sleep", "3600"])
                sleepers.append(p)
                if layout == "per-gpu":
                    g = gpus[i % GPUS]
                    ctl("adopt", pid=p.pid, queues=[{"gpu_id": g, "type": 2}] * QUEUES_PER_PROC, vram={str(g): 4 << 30})
                else:
                    ctl("adopt", pid=p.pid, queues=[{"gpu_id": g, "type": 2} for g in gpus],
                        vram={str(g): 4 << 30 for g in gpus})
            run_once(machine)                                   # warm the page cache
            read_us = measure_host_syscall_cost(os.environ["KFDTOOL_SIM_DIR"])
            walls = [run_once(machine)[0] for _ in range(args.repeat)]
            _, doc = run_once(machine)
            rss = max(measure_rss(machine) for _ in range(2))
            assert len(doc["processes"]) == n and all(len(p["queues"]) == QUEUES_PER_PROC for p in doc["processes"])
            breakdown, workers = _breakdown(sim.sysfs_root)
            breakdown["c_floor_one_cpu"] = measure_scan_floor(floor_exe, sim.sysfs_root)
            identity_us = measure_identity_cost([p.pid for p in sleepers])
            row = {"processes": n, "queues": n * QUEUES_PER_PROC, "layout": layout, "scan_workers": workers,
                   "host_small_file_read_us": read_us, "identity_us_per_process": identity_us,
                   "wall_s_median": statistics.median(walls), "wall_s_min": min(walls), "wall_s_max": max(walls),
                   "peak_rss_bytes": rss, "breakdown_s": {"interpreter_and_imports": startup, **breakdown}}
            if args.baseline and (n, layout) == (1000, "per-gpu"):
                row["baseline"] = _compare(machine, args.baseline, args.repeat)
            rows.append(row)
            print(f"{n:5d} processes x {QUEUES_PER_PROC} queues ({layout}): median {row['wall_s_median']:.3f} s "
                  f"(min {row['wall_s_min']:.3f}, max {row['wall_s_max']:.3f}), peak RSS {rss / 2**20:.1f} MiB; "
                  f"startup {startup:.3f} s, scan {breakdown['scan']:.3f} s ({workers} workers; "
                  f"{breakdown['scan_one_cpu']:.3f} s on one; the same reads in C on one: "
                  f"{breakdown['c_floor_one_cpu'] or float('nan'):.3f} s), JSON {breakdown['json_output']:.3f} s",
                  flush=True)
    finally:
        for p in sleepers:
            p.kill()
        for p in sleepers:
            p.wait()
        ctl.close()
        runner.stop(machine)
        if created:
            shutil.rmtree(created, ignore_errors=True)
    recorded = provenance()                # revision, dirty flag, card, CPU count: as every results file
    recorded["bench_command"] = recorded.pop("command")
    result = {"benchmark": "kfdtool queues --json", "machine": "simulated 8x MI300X (SPX)", **recorded,
              "command": f"{sys.executable} -m kfdtool --sim mi300x queues --json",
              "target": "<= 0.3 s wall at 1,000 processes x 8 queues",
              "host": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                       "python": platform.python_version(), "kernel": platform.release()},
              "repeat": args.repeat, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".json").write_text(json.dumps(result, indent=2) + "\n")
    _plot(rows, args.out + ".png", result["host"]["cores"])
    print(f"wrote {args.out}.json and .png")


def _plot(rows, path, cores):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    rows = [r for r in rows if r["layout"] == "per-gpu"]
    n = [r["processes"] for r in rows]
    fig, ax1 = plt.subplots(figsize=(6, 4))
    ax1.plot(n, [r["wall_s_median"] for r in rows], "o-", label="wall time (median)")
    ax1.plot(n, [r["breakdown_s"]["scan"] for r in rows], "x:", color="tab:blue", label="of which the scan")
    if all(r["breakdown_s"].get("c_floor_one_cpu") for r in rows):
        ax1.plot(n, [r["breakdown_s"]["c_floor_one_cpu"] for r in rows], "+-.", color="grey",
                 label="the same reads in C, one CPU")
    ax1.axhline(0.3, color="grey", ls="--", lw=1, label="target at 1,000 (0.3 s)")
    ax1.set_xlabel("KFD processes (x 8 queues)")
    ax1.set_ylabel("seconds")
    ax2 = ax1.twinx()
    ax2.plot(n, [r["peak_rss_bytes"] / 2**20 for r in rows], "s--", color="tab:orange", label="peak RSS")
    ax2.set_ylabel("MiB")
    ax1.legend(loc="upper left")
    ax2.legend(loc="lower right")
    ax1.set_title(f"kfdtool queues --json, simulated 8x MI300X, host with {cores} CPUs")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
