#!/usr/bin/env python3
"""Where a guarded batch job's time goes on a GPU: the CPU cost of the event operations a sync point
makes, then one launch-bound model in alternating segments under gate variants (a higher-priority
client registered and idle, so the job is guarded; medians of it/s over rounds).

    python scripts/probes/sync_cost.py [--model resnet50 --batch 16 --rounds 7]
  none / free / guarded-nowin / guarded      as in scripts/bench_gate_overhead.py (defaults)
  guarded-fresh                               a new event per sync point (no reuse)
  guarded-max32                               up to 32 leaves between sync points while the GPU keeps up
"""
import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "scripts"), str(REPO / "scripts" / "workloads")]
from benchlib import provenance  # noqa: E402
from models import MODELS, build  # noqa: E402

CONFIGS = ("none", "free", "guarded-nowin", "guarded", "guarded-fresh", "guarded-max32")


def op_costs(torch, n=20000):
    """µs of CPU per event operation, with the GPU busy (a sleep kernel far ahead of the CPU)."""
    out = {}

    def timed(name, fn):
        torch.cuda._sleep(int(2e9))               # keep the GPU busy: events stay pending
        t = time.perf_counter()
        for _ in range(n):
            fn()
        out[name] = (time.perf_counter() - t) / n * 1e6
        torch.cuda.synchronize()
    timed("Event()+record()", lambda: torch.cuda.Event().record())
    ev = torch.cuda.Event()
    timed("record() of one event", lambda: ev.record())
    timed("query() pending", lambda: ev.query())
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        ev.query()
    out["query() done"] = (time.perf_counter() - t) / n * 1e6
    timed("current_stream()", lambda: torch.cuda.current_stream())
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=MODELS, default="resnet50")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--segment-s", type=float, default=1.5)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--out")
    args = p.parse_args()
    os.environ["XSCHED_LV3_BOARD"] = str(Path(tempfile.mkdtemp()) / "board")
    import torch
    import xsched_lv3.pytorch as xt
    import xsched_lv3.window as window_module
    from xsched_lv3.gate import Gate
    costs = op_costs(torch)
    for k, v in costs.items():
        print(f"{k:24s} {v:7.2f} us", flush=True)

    class FreshRecorder(xt.TorchRecorder):
        def record(self):
            event = torch.cuda.Event()
            event.record()
            return event

        def done(self, event):
            return event.query()

    shipped = torch.nn.Module.__call__
    model, x = build(args.model, args.batch)
    with torch.no_grad():
        for _ in range(10):
            model(x)
    torch.cuda.synchronize()
    xt.install()
    wrapped = torch.nn.Module.__call__
    default_max = window_module.MAX_COMMANDS_PER_SYNC

    def segment(config):
        torch.nn.Module.__call__ = shipped if config == "none" else wrapped
        window_module.MAX_COMMANDS_PER_SYNC = 32 if config == "guarded-max32" else default_max
        hp = Gate(xt.TorchRecorder(), priority=10) if config.startswith("guarded") else None
        gate = None
        if config != "none":
            recorder = FreshRecorder() if config == "guarded-fresh" else xt.TorchRecorder()
            gate = Gate(recorder, priority=0, window_us=0 if config == "guarded-nowin" else xt.DEFAULT_WINDOW_US)
        xt._process_gate = gate
        n, t0 = 0, time.monotonic()
        with torch.no_grad():
            while time.monotonic() - t0 < args.segment_s:
                model(x)
                torch.cuda.current_stream().synchronize()
                n += 1
        rate = n / (time.monotonic() - t0)
        syncs = gate.sync_points / n if gate else 0
        xt._process_gate = None
        for g in (gate, hp):
            if g:
                g.close()
        return rate, syncs

    rates = {c: [] for c in CONFIGS}
    syncs = {c: [] for c in CONFIGS}
    for round_ in range(args.rounds):
        for config in random.Random(round_).sample(CONFIGS, len(CONFIGS)):
            rate, s = segment(config)
            rates[config].append(rate)
            syncs[config].append(s)
    base = statistics.median(rates["none"])
    doc = {"benchmark": "guarded batch job: sync point costs", **provenance(), "torch": torch.__version__,
           "model": args.model, "batch": args.batch, "op_costs_us": costs, "configs": {}}
    for c in CONFIGS:
        med = statistics.median(rates[c])
        doc["configs"][c] = {"iters_per_s": rates[c], "median": med, "vs_none": med / base,
                             "sync_points_per_iter": statistics.median(syncs[c])}
        print(f"{c:16s} {med:7.1f} it/s {med / base:6.3f} of none (range {min(rates[c]):.1f}-{max(rates[c]):.1f})"
              f" sync points/iter {statistics.median(syncs[c]):.1f}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
