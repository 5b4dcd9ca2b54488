#!/usr/bin/env python3
"""Where the progressive window costs a GPU-bound batch job: one process, one model, guarded by an
idle higher-priority client (as scripts/bench_gate_overhead.py), at several window sizes and with
the window off, in alternating segments. Per configuration: iterations/s, and from a torch profile of
a few iterations, how much of each iteration the GPU sat idle between kernels, and how the window's
waits went (per iteration: waits, waits with only the newest segment in flight, the estimate in
flight when a wait returned). A diagnostic.

    python scripts/probes/window_gaps.py --model resnet50 --batch 64 --windows 0 500 1000 2000
"""
import argparse
import json
from collections import Counter
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "scripts"), str(REPO / "scripts" / "workloads")]
from benchlib import provenance, write_results  # noqa: E402
from batch import make_step  # noqa: E402
from models import MODELS, build  # noqa: E402


def gpu_idle_fraction(torch, step, iters=6):
    """Idle share of the GPU between an iteration's first kernel and its last, from a profile."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
    kernels = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                     if e.device_type.name == "CUDA")
    if not kernels:
        return None, None
    gaps, busy_end = [], kernels[0][1]
    for start, end in kernels[1:]:
        if start > busy_end:
            gaps.append(start - busy_end)
        busy_end = max(busy_end, end)
    span = kernels[-1][1] - kernels[0][0]
    # the gaps between iterations (a synchronize, the next launch) are the same in every config:
    # leave out the `iters - 1` largest
    inner = sorted(gaps)[: max(0, len(gaps) - (iters - 1))]
    return sum(inner) / span, sum(1 for g in inner if g > 20) / iters


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=MODELS, default="resnet50")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--windows", type=float, nargs="+", default=[0, 500, 1000, 2000])
    p.add_argument("--segment-s", type=float, default=1.5)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--out")
    args = p.parse_args()
    os.environ["XSCHED_LV3_BOARD"] = str(Path(tempfile.mkdtemp()) / "board")
    import torch
    import xsched_lv3.pytorch as xt
    import xsched_lv3.window as window_module
    from xsched_lv3.gate import Gate

    counts = Counter()
    real_sync_point = window_module.ProgressiveWindow.sync_point

    def counted_sync_point(self, handle, n, is_done, wait, est_us=None, changed=None):
        def counted_wait(h):
            counts["waits"] += 1
            counts["waits_newest"] += len(self.pending) == 1
            wait(h)
        waited = real_sync_point(self, handle, n, is_done, counted_wait, est_us, changed)
        if waited:
            counts["left_us"] += self.in_flight_us
            counts["left_pending"] += len(self.pending)
        return waited
    window_module.ProgressiveWindow.sync_point = counted_sync_point

    model, x = build(args.model, args.batch)
    step = make_step(model, x)
    xt.install()

    def segment(window_us, profile=False):
        counts.clear()
        hp = Gate(xt.TorchRecorder(), priority=10)
        gate = Gate(xt.TorchRecorder(), priority=0, window_us=window_us)
        xt._process_gate = gate
        try:
            if profile:
                return gpu_idle_fraction(torch, step)
            n, t0 = 0, time.monotonic()
            while time.monotonic() - t0 < args.segment_s:
                step()
                n += 1
            w = gate.window
            return {"rate": n / (time.monotonic() - t0), "syncs": gate.sync_points / n,
                    "waits": counts["waits"] / n, "waits_newest": counts["waits_newest"] / n,
                    "left_us": counts["left_us"] / max(1, counts["waits"]),
                    "left_pending": counts["left_pending"] / max(1, counts["waits"]),
                    "cmd_us": w.cmd_us if w is not None and w.calibrated else None}
        finally:
            xt._process_gate = None
            gate.close()
            hp.close()

    rows = {w: [] for w in args.windows}
    for r in range(args.rounds):
        for w in random.Random(r).sample(args.windows, len(args.windows)):
            rows[w].append(segment(w))
    doc = {**provenance(), "probe": "window gaps", "model": args.model, "batch": args.batch, "configs": {}}
    base = statistics.median(x["rate"] for x in rows[args.windows[0]])
    for w in args.windows:
        idle, gaps = segment(w, profile=True)
        med = {k: statistics.median(x[k] for x in rows[w] if x[k] is not None) if any(x[k] is not None for x in rows[w])
               else None for k in rows[w][0]}
        med.update(vs_first=med["rate"] / base, gpu_idle=idle, gaps_over_20us_per_iter=gaps)
        doc["configs"][str(w)] = med
        print(f"{args.model} b{args.batch} window {w:6.0f}: " + json.dumps({k: round(v, 3) if isinstance(v, float) else v
                                                                          for k, v in med.items()}), flush=True)
    if args.out:
        write_results(args.out, doc)


if __name__ == "__main__":
    main()
