#!/usr/bin/env python3
"""A diagnostic probe (10 s runs, ~180 HP requests: no P99 claims): where a launch-bound LP (ResNet-50
b16) loses throughput under `xsched-lv3 run`. Output copied into results/diagnostics/corun_probe_b16.txt."""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_two_models as b
PY = sys.executable
S = "10"
lp = [PY, str(b.WORK / "batch.py"), "--model", "resnet50", "--batch", "16", "--seconds", S]
hp = [PY, str(b.WORK / "serve.py"), "--model", "resnet18", "--batch", "4", "--seconds", S]
hp_idle = [PY, str(b.WORK / "serve.py"), "--model", "resnet18", "--batch", "4", "--seconds", S, "--rate", "0.01", "--warmup-s", "0"]
X = b.xsched_run
runs = [("lp-alone", [lp]), ("native", [hp, lp]), ("xsched", [X(hp, priority=10), X(lp)]),
        ("xsched-nowin", [X(hp, priority=10), X(lp, window_us=0)]),
        ("same-prio", [X(hp), X(lp)]), ("idle-hp", [X(hp_idle, priority=10), X(lp)]),
        ("lp-alone", [lp]), ("xsched", [X(hp, priority=10), X(lp)]), ("idle-hp", [X(hp_idle, priority=10), X(lp)])]
for name, cmds in runs:
    r = b.summarize(b.merged(b.run_together(cmds, 200)))
    g = r.get("lp_gate", {})
    print(name, round(r.get("lp_iters_per_s", 0), 1), round(r.get("hp_p99_ms", 0), 2), {k: (round(v, 3) if isinstance(v, float) else v) for k, v in g.items() if k in ("guarded", "waits", "held_s", "sync_points", "blocked_syncs")}, flush=True)
