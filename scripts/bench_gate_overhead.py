#!/usr/bin/env python3
"""Where a scheduled batch job's time goes: one process, one model, the gate's configurations in
alternating segments (so host drift hits them alike), each segment's iterations/s.

  none            nn.Module.__call__ as torch ships it
  wrapper         xsched_lv3's wrapper installed, no gate bound (the bare pass-through)
  free            bound to a gate with nobody above it (what `xsched-lv3 run` gives a job alone)
  guarded         a higher-priority client is registered but idle: checks on every module call,
                  progressive window (default size)
  guarded-nowin   the same with the window off (the checks alone)

    python scripts/bench_gate_overhead.py --model resnet50 --batch 16 [--rounds 5] [--profile guarded]
"""
import argparse
import cProfile
import io
import json
import os
import pstats
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts"), str(REPO / "scripts" / "workloads")]
from benchlib import provenance  # noqa: E402
from models import MODELS, build  # noqa: E402

CONFIGS = ("none", "wrapper", "free", "guarded", "guarded-nowin")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=MODELS, default="resnet50")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--segment-s", type=float, default=2.0)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--profile", choices=CONFIGS, help="also print a cProfile of one segment in this configuration")
    p.add_argument("--out")
    args = p.parse_args()
    os.environ["XSCHED_LV3_BOARD"] = str(Path(tempfile.mkdtemp()) / "board")     # a board of its own
    import torch
    import xsched_lv3.pytorch as xt
    from xsched_lv3.gate import Gate
    shipped = torch.nn.Module.__call__
    model, x = build(args.model, args.batch)
    with torch.no_grad():
        for _ in range(10):
            model(x)
    torch.cuda.synchronize()
    xt.install()
    wrapped = torch.nn.Module.__call__

    def segment(config):
        torch.nn.Module.__call__ = shipped if config == "none" else wrapped
        hp = Gate(xt.TorchRecorder(), priority=10) if config.startswith("guarded") else None
        gate = None
        if config not in ("none", "wrapper"):
            gate = Gate(xt.TorchRecorder(), priority=0, window_us=0 if config == "guarded-nowin" else
                        xt.DEFAULT_WINDOW_US)
        xt._process_gate = gate
        n, t0 = 0, time.monotonic()
        with torch.no_grad():
            while time.monotonic() - t0 < args.segment_s:
                model(x)
                torch.cuda.current_stream().synchronize()
                n += 1
        rate = n / (time.monotonic() - t0)
        blocked = gate.blocked_syncs if gate else 0
        xt._process_gate = None
        for g in (gate, hp):
            if g:
                g.close()
        return rate, blocked

    rates = {c: [] for c in CONFIGS}
    blocked = {c: 0 for c in CONFIGS}
    for round_ in range(args.rounds):
        for config in random.Random(round_).sample(CONFIGS, len(CONFIGS)):   # no config always first
            rate, b = segment(config)
            rates[config].append(rate)
            blocked[config] += b
    base = statistics.median(rates["none"])
    doc = {"benchmark": "gate overhead, one process, alternating segments", **provenance(),
           "torch": torch.__version__, "model": args.model, "batch": args.batch, "segment_s": args.segment_s,
           "rounds": args.rounds, "configs": {}}
    for config in CONFIGS:
        med = statistics.median(rates[config])
        doc["configs"][config] = {"iters_per_s": rates[config], "median": med, "vs_none": med / base,
                                  "blocked_window_waits": blocked[config]}
        print(f"{args.model} b{args.batch} {config:14s} {med:8.1f} it/s  {med / base:6.3f} of none  "
              f"(range {min(rates[config]):.1f}-{max(rates[config]):.1f}, blocked waits {blocked[config]})",
              flush=True)
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        segment(args.profile)
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(14)
        doc["profile"] = {"config": args.profile, "top_by_tottime": text.getvalue()}
        print(text.getvalue())
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
