#!/usr/bin/env python3
"""What the progressive window alone costs a batch job on a real GPU, per window size: the job
(scripts/workloads/batch.py) under `xsched-lv3 run` next to a registered service that sends no
requests (`serve.py --rate 0.01`, priority 10), so the job is guarded and windowed but never held,
and shares the GPU with nobody. Against the job alone, interleaved, in the same run. A diagnostic
(short runs): it separates the window's cost from holds and from the GPU contention of a co-run.

    python scripts/probes/window_cost.py --lp gpt2:16 resnet50:64 --windows default 1000 250 --reps 2
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_two_models import PY, WORK  # noqa: E402  (the workloads the pair benchmark runs)
from benchlib import provenance, run_together, write_results, xsched_run  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lp", nargs="+", default=["gpt2:16"], help="batch jobs, MODEL:BATCH (default gpt2:16)")
    p.add_argument("--windows", nargs="+", default=["default"],
                   help="window sizes in µs to pass to the job's `run`, or 'default' (no --window-us)")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--out")
    args = p.parse_args()
    doc = {**provenance(), "probe": "window cost with an idle service", "seconds": args.seconds, "rows": []}
    for lp in args.lp:
        model, batch = lp.split(":")
        job = [PY, str(WORK / "batch.py"), "--model", model, "--batch", batch, "--seconds", str(args.seconds)]
        idle = [PY, str(WORK / "serve.py"), "--model", "resnet18", "--batch", "1", "--rate", "0.01",
                "--seconds", str(args.seconds), "--warmup-s", "0"]
        variants = {"alone": [job]}
        for w in args.windows:
            window_us = None if w == "default" else float(w)
            variants[f"window-{w}"] = [xsched_run(idle, priority=10), xsched_run(job, window_us=window_us)]
        for rep in range(args.reps):
            for name, cmds in variants.items():
                outs = run_together(cmds, args.seconds + 180)
                lp_out = outs[-1]
                gate = lp_out.get("gate") or {}
                row = {"lp": lp, "variant": name, "rep": rep, "lp_iters_per_s": lp_out["lp_iters_per_s"],
                       **{k: gate.get(k) for k in ("guarded", "held_s", "sync_points", "blocked_syncs",
                                                   "window_cmd_us")}}
                doc["rows"].append(row)
                print(json.dumps(row), flush=True)
    summary = {}
    for lp in args.lp:
        alone = statistics.median(r["lp_iters_per_s"] for r in doc["rows"] if r["lp"] == lp and r["variant"] == "alone")
        for name in sorted({r["variant"] for r in doc["rows"] if r["lp"] == lp} - {"alone"}):
            vs = [r["lp_iters_per_s"] / alone for r in doc["rows"] if r["lp"] == lp and r["variant"] == name]
            summary[f"{lp} {name}"] = {"vs_alone_median": round(statistics.median(vs), 3),
                                       "range": [round(min(vs), 3), round(max(vs), 3)]}
    doc["summary"] = summary
    print(json.dumps(summary, indent=1))
    if args.out:
        write_results(args.out, doc)


if __name__ == "__main__":
    main()
