#!/usr/bin/env python3
"""Where a scheduled batch job's time goes: one process, one model, the gate's configurations in
alternating segments (so host drift hits them alike), each segment's iterations/s.

  none            nn.Module.__call__ as torch ships it
  wrapper         xsched_lv3's wrapper installed, no gate bound (the bare pass-through)
  free            bound to a gate with nobody above it (what `xsched-lv3 run` gives a job alone)
  guarded         a higher-priority client is registered but idle: checks on every module call,
                  progressive window (default size)
  guarded-nowin   the same with the window off (the checks alone)
  guarded-nobwd   guarded, the backward hooks doing nothing (with --train: what gating backward costs)
  guarded-nohooks guarded-nowin with no backward hook registered at all
  guarded-everyleaf, guarded-everyleaf-nowin
                  guarded, guarded-nowin with a backward hook at every leaf (MAX_LEAVES_PER_HOOK = 1,
                  as before 2026-11-27), not only at weighted ones
  guarded-fresh   guarded, a new event per sync point (no reuse)                  (only with --configs)
  guarded-max32   guarded, sync points up to 32 leaves apart while the GPU keeps up (only with --configs)
--event-costs first prints the CPU time of each event operation a sync point makes (GPU kept busy).

    python scripts/bench_gate_overhead.py --model resnet50 --batch 16 [--rounds 5] [--profile guarded]
    python scripts/bench_gate_overhead.py --model resnet50 --batch 32 --train --configs none free guarded guarded-nobwd
    python scripts/bench_gate_overhead.py --rounds 9 --event-costs \
        --configs none free guarded-nowin guarded guarded-fresh guarded-max32
"""
import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts"), str(REPO / "scripts" / "workloads")]
from benchlib import add_profile, provenance, write_results  # noqa: E402
from batch import make_step  # noqa: E402
from models import MODELS, build  # noqa: E402

CONFIGS = ("none", "wrapper", "free", "guarded", "guarded-nowin")
MORE_CONFIGS = ("guarded-fresh", "guarded-max32", "guarded-nobwd", "guarded-nohooks", "guarded-everyleaf",
                "guarded-everyleaf-nowin")


def event_costs(torch, n=20000):
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
    event = torch.cuda.Event()
    timed("record() of one event", lambda: event.record())
    timed("query() pending", lambda: event.query())
    timed("current_stream()", lambda: torch.cuda.current_stream())
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=MODELS, default="resnet50")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--segment-s", type=float, default=2.0)
    p.add_argument("--train", action="store_true", help="training steps (forward, backward, SGD) instead of inference")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--configs", nargs="+", choices=CONFIGS + MORE_CONFIGS, default=list(CONFIGS))
    p.add_argument("--event-costs", action="store_true", help="first time each event operation of a sync point")
    p.add_argument("--profile", choices=CONFIGS + MORE_CONFIGS,
                   help="also print a cProfile of one segment in this configuration")
    p.add_argument("--out")
    args = p.parse_args()
    os.environ["XSCHED_LV3_BOARD"] = str(Path(tempfile.mkdtemp()) / "board")     # a board of its own
    import torch
    import xsched_lv3.pytorch as xt
    import xsched_lv3.window as window_module
    from xsched_lv3.gate import Gate
    costs = event_costs(torch) if args.event_costs else None
    for name, us in (costs or {}).items():
        print(f"{name:24s} {us:7.2f} us", flush=True)

    class FreshRecorder(xt.TorchRecorder):
        def record(self):
            event = torch.cuda.Event()
            event.record()
            return event

        def done(self, event):
            return event.query()
    default_max = window_module.MAX_COMMANDS_PER_SYNC
    shipped = torch.nn.Module.__call__
    model, x = build(args.model, args.batch)
    step = make_step(model, x, args.train)
    xt.install()
    wrapped = torch.nn.Module.__call__
    hook_backward = xt._hook_backward

    default_leaves_per_hook = xt.MAX_LEAVES_PER_HOOK

    def no_hook(gate, module, out):
        return None

    def segment(config):
        torch.nn.Module.__call__ = shipped if config == "none" else wrapped
        hp = Gate(xt.TorchRecorder(), priority=10) if config.startswith("guarded") else None
        window_module.MAX_COMMANDS_PER_SYNC = 32 if config == "guarded-max32" else default_max
        gate = None
        if config not in ("none", "wrapper"):
            recorder = FreshRecorder() if config == "guarded-fresh" else xt.TorchRecorder()
            gate = Gate(recorder, priority=0,
                        window_us=0 if config.endswith(("-nowin", "-nohooks")) else xt.DEFAULT_WINDOW_US)
            if config == "guarded-nobwd":
                gate.before_backward = lambda commands, grad: None     # still registered, does nothing
        xt.MAX_LEAVES_PER_HOOK = 1 if config.startswith("guarded-everyleaf") else default_leaves_per_hook
        xt._process_gate = gate
        xt._hook_backward = no_hook if config == "guarded-nohooks" else hook_backward
        n, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < args.segment_s:
            step()
            n += 1
        xt._hook_backward = hook_backward
        rate = n / (time.monotonic() - t0)
        blocked, syncs = (gate.blocked_syncs, gate.sync_points / n) if gate else (0, 0.0)
        xt._process_gate = None
        for g in (gate, hp):
            if g:
                g.close()
        return rate, blocked, syncs

    configs = list(dict.fromkeys(["none"] + args.configs))      # "none" is the reference
    rates = {c: [] for c in configs}
    blocked = {c: 0 for c in configs}
    syncs = {c: [] for c in configs}
    for round_ in range(args.rounds):
        for config in random.Random(round_).sample(configs, len(configs)):   # no config always first
            rate, b, per_iter = segment(config)
            rates[config].append(rate)
            blocked[config] += b
            syncs[config].append(per_iter)
    base = statistics.median(rates["none"])
    doc = {"benchmark": "gate overhead, one process, alternating segments", **provenance(),
           "torch": torch.__version__, "model": args.model, "batch": args.batch, "train": args.train,
           "segment_s": args.segment_s,
           "rounds": args.rounds, "configs": {}}
    if costs:
        doc["event_costs_us"] = costs
    for config in configs:
        med = statistics.median(rates[config])
        doc["configs"][config] = {"iters_per_s": rates[config], "median": med, "vs_none": med / base,
                                  "blocked_window_waits": blocked[config],
                                  "sync_points_per_iter": statistics.median(syncs[config])}
        print(f"{args.model} b{args.batch} {config:14s} {med:8.1f} it/s  {med / base:6.3f} of none  "
              f"(range {min(rates[config]):.1f}-{max(rates[config]):.1f}, blocked waits {blocked[config]}, "
              f"sync points/iter {statistics.median(syncs[config]):.1f})", flush=True)
    if args.profile:
        add_profile(doc, args.profile, lambda: segment(args.profile), 14)
    if args.out:
        write_results(args.out, doc)


if __name__ == "__main__":
    main()
