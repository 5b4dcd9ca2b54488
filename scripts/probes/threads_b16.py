#!/usr/bin/env python3
"""A diagnostic probe (12 s runs, ~220 HP requests: no P99 claims): where a launch-bound LP (ResNet-50
b16) loses throughput as a thread next to a ResNet-18 b4 service thread (pair_threads.py) under
`xt.client`. Variants interleaved, twice; then py-spy (when installed) samples one native and one
scheduled run per thread, written as collapsed stacks to --profile-dir."""
import argparse
import shutil
import subprocess
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_two_models as b  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--seconds", default="12")
p.add_argument("--profile-dir")
p.add_argument("--reps", type=int, default=2)
p.add_argument("--variants", nargs="+", help="the named variants only (default: all)")
p.add_argument("--spy", nargs="*", default=["native", "xsched"], help="variants to sample with py-spy")
args = p.parse_args()
PY = sys.executable
base = [PY, str(b.WORK / "pair_threads.py"), "--hp", "resnet18:4", "--lp", "resnet50:16", "--seconds", args.seconds]
variants = [
    ("native", []), ("xsched", ["--scheduled"]),
    ("xsched-switch5ms", ["--scheduled", "--switch-interval-ms", "5"]),
    ("native-switch0.5ms", ["--switch-interval-ms", "0.5"]),
    ("lp-only-native", ["--no-hp"]), ("lp-only-xsched", ["--no-hp", "--scheduled"]),
    ("xsched-strict", ["--scheduled", "--latency-slack", "0"]),
    # the service thread launches nothing: each request only holds the batch thread for 3 ms
    ("hold3ms-only", ["--scheduled", "--latency-slack", "0", "--hp-hold-ms", "3"]),
]


def show(name, r):
    r = b.summarize(r)
    g = r.get("lp_gate", {})
    h = r.get("hp_gate", {})
    print(f"{name:20s} lp {r.get('lp_iters_per_s', 0):6.1f} it/s  hp p50 {r.get('hp_p50_ms', 0):5.2f} "
          f"p99 {r.get('hp_p99_ms', 0):5.2f} ms  lp held {g.get('held_s', 0):.2f}s waits {g.get('waits')} "
          f"syncs {g.get('sync_points')} blocked {g.get('blocked_syncs')}  hp active {h.get('active_s', 0):.2f}s "
          f"exposed {h.get('exposed_requests')}", flush=True)


chosen = [(n, e) for n, e in variants if not args.variants or n in args.variants]
for rep in range(args.reps):
    for name, extra in chosen:
        show(name, b.run_together([base + extra], 200)[0])

spy = shutil.which("py-spy")
spies = []
try:
    for name, extra in [(n, e) for n, e in variants if n in args.spy and args.profile_dir and spy]:
        def record(pids, name=name):
            # all samples (idle included) and those holding the GIL, at once. What is in the first and not
            # the second ran without the GIL: inside an op (they release it) or waiting to take it back
            for mode, flags in (("wall", ["--idle"]), ("gil", ["--gil"])):
                spies.append(subprocess.Popen(
                    [spy, "record", "--pid", str(pids[0]), "--threads", *flags, "--format", "raw", "--rate", "250",
                     "--duration", str(int(float(args.seconds)) + 2), "--nonblocking",     # it stops when the run ends
                     "-o", str(Path(args.profile_dir, f"pyspy_{name}_{mode}.txt"))],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        show(name + "+py-spy", b.run_together([base + extra], 200, when_ready=record)[0])
    for spied in spies:
        spied.wait(timeout=60)
finally:
    for spied in spies:
        if spied.poll() is None:
            spied.kill()
