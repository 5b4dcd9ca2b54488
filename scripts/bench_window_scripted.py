#!/usr/bin/env python3
"""The progressive window on a scripted GPU (no GPU, no timing noise): random phased clients, what it
keeps queued against its bound and how many sync points it places.

Each client launches commands `cpu_us` apart (5-60 us), `n` a call (20-200), and synchronizes after
every call, for 120 calls in phases of 5-40 calls; each phase's commands take 2-20, 20-80 or 80-400 us of
GPU time (+-50 % per command). An iteration is "over" when it keeps more queued after some launch than
the window's bound allows: 500 us, plus the half window launched before the next sync point, plus
three commands (a command cannot be split). The first two iterations of a phase are not counted: a
phase change may overshoot once, by design (window.py, MAX_COMMANDS_PER_SYNC).

    python scripts/bench_window_scripted.py [--clients 400] [--baseline CHECKOUT] [--out FILE]
"""
import argparse
import json
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from benchlib import provenance, write_results  # noqa: E402  (next to this script)

WINDOW_US = 500.0
KINDS = ("launch-bound", "balanced", "gpu-bound")


def phase_kind(gpu_us, cpu_us):
    """launch-bound: less GPU than CPU time a command; gpu-bound: at least twice as much."""
    return KINDS[0] if gpu_us < cpu_us else KINDS[1] if gpu_us < 2 * cpu_us else KINDS[2]


def client(seed):
    r = random.Random(seed)
    cpu_us, n = r.uniform(5, 60), r.randint(20, 200)
    phases = []
    while len(phases) < 120:
        gpu_us = r.choice([r.uniform(2, 20), r.uniform(20, 80), r.uniform(80, 400)])
        phases += [gpu_us] * r.randint(5, 40)
    return cpu_us, n, phases[:120]


def run_client(window_module, seed):
    cpu_us, n, phases = client(seed)
    clock, gpu_free_at = [0.0], [0.0]
    window_module.time = SimpleNamespace(monotonic=lambda: clock[0])
    w = window_module.ProgressiveWindow(WINDOW_US)
    jitter = random.Random(seed + 1_000_003)          # not the stream that chose the client
    over = counted = in_phase = 0
    by_kind = {kind: [0, 0] for kind in KINDS}        # sync points, iterations

    def done(at):
        return clock[0] >= at

    def wait(at):
        clock[0] = max(clock[0], at)
    # the gate's and the XQueue's launch loop (a tree before it had the same loop in the gate)
    launches = window_module.WindowedLaunches(w, lambda: gpu_free_at[0], done, wait)
    for i, gpu_us in enumerate(phases):
        in_phase = in_phase + 1 if i and phases[i - 1] == gpu_us else 0
        most, syncs_before = 0.0, launches.sync_points
        for _ in range(n):
            clock[0] += cpu_us * 1e-6
            gpu_free_at[0] = max(gpu_free_at[0], clock[0]) + gpu_us * jitter.uniform(0.5, 1.5) * 1e-6
            most = max(most, (gpu_free_at[0] - clock[0]) * 1e6)
            launches.launched()
        clock[0] = max(clock[0], gpu_free_at[0])          # the client's own synchronize
        kind = by_kind[phase_kind(gpu_us, cpu_us)]
        kind[0] += launches.sync_points - syncs_before
        kind[1] += 1
        if in_phase >= 2:
            counted += 1
            over += most > 1.5 * WINDOW_US + 3 * gpu_us
    return {"seed": seed, "sync_points_per_iteration": launches.sync_points / len(phases), "over": over, "counted": counted,
            "by_kind": by_kind}


def measure(checkout, clients):
    """Runs in a child with `checkout` first on the path, so a baseline's window is measured as it was."""
    code = (f"import json, pathlib, sys; sys.path[:0] = [{str(checkout)!r}, {str(REPO / 'scripts')!r}]\n"
            "import bench_window_scripted as b\nfrom xsched_lv3 import window\n"
            f"if pathlib.Path(window.__file__).resolve().parents[1] != pathlib.Path({str(checkout)!r}).resolve():\n"
            "    sys.exit(f'{window.__file__} is not the window of the checkout asked for')\n"
            "if not hasattr(window, 'WindowedLaunches'):\n"
            "    sys.exit('that tree predates window.WindowedLaunches (the launch loop this benchmark drives)')\n"
            f"print(json.dumps([b.run_client(window, s) for s in range({clients})]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"bench_window_scripted: {out.stderr.strip().splitlines()[-1]}")
    return json.loads(out.stdout)


def summary(rows):
    def per_iteration(kind):
        iterations = sum(r["by_kind"][kind][1] for r in rows)
        return sum(r["by_kind"][kind][0] for r in rows) / max(1, iterations)
    return {"clients": len(rows),
            "sync_points_per_iteration_mean": sum(r["sync_points_per_iteration"] for r in rows) / len(rows),
            "iterations_over": sum(r["over"] for r in rows),
            "iterations_counted": sum(r["counted"] for r in rows),
            "clients_with_any_over": sum(1 for r in rows if r["over"]),
            "sync_points_per_iteration_by_phase": {kind: per_iteration(kind) for kind in KINDS}}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--clients", type=int, default=400)
    p.add_argument("--baseline", metavar="CHECKOUT",
                   help="also measure another tree's window (a git archive of it)")
    p.add_argument("--out", help="results file (JSON)")
    args = p.parse_args()
    if args.clients < 1:
        p.error("--clients must be at least 1")
    doc = {"benchmark": "progressive window on a scripted GPU: random phased clients", **provenance(),
           "window_us": WINDOW_US, "variants": {}}
    trees = [("this tree", REPO)] + ([("baseline", Path(args.baseline).resolve())] if args.baseline else [])
    for name, tree in trees:
        s = summary(measure(tree, args.clients))
        doc["variants"][name] = {"checkout": str(tree), **s}
        by_phase = ", ".join(f"{k} {v:.2f}" for k, v in s["sync_points_per_iteration_by_phase"].items())
        print(f"{name}: {s['iterations_over']} of {s['iterations_counted']} iterations over the bound, "
              f"{s['clients_with_any_over']} of {s['clients']} clients with any; "
              f"{s['sync_points_per_iteration_mean']:.1f} sync points an iteration ({by_phase})", flush=True)
    if args.out:
        write_results(args.out, doc)


if __name__ == "__main__":
    main()
