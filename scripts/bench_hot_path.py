#!/usr/bin/env python3
"""CPU cost of xsched_lv3's nn.Module.__call__ wrapper per module call, without a GPU: the fake torch
of the tests (tests/fake_torch.py) with modules that launch nothing, so only the wrapper's own work
is timed. Configurations alternate, several rounds; medians in ns per module call.

    python scripts/bench_hot_path.py [--rounds 5]
  none      nn.Module.__call__ unwrapped          free      a client with nobody above it
  wrapper   wrapped, no client bound               guarded   a higher-priority client registered, idle

Then what a request's start and end cost a service (the top client, a lower one registered: it marks
itself active and idle on the board), in µs a request, back to back and after an idle gap (--gap-ms:
a service between requests, its caches and CPU gone cold). Both are on its critical path.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "scripts")]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--forwards", type=int, default=300)
    p.add_argument("--requests", type=int, default=300, help="per round, for a request's start and end")
    p.add_argument("--gap-ms", type=float, default=5.0)
    p.add_argument("--out", help="results file (JSON, with the run's provenance)")
    args = p.parse_args()
    os.environ["XSCHED_LV3_BOARD"] = str(Path(tempfile.mkdtemp()) / "board")
    import fake_torch
    gpu = fake_torch.FakeGPU()
    torch = sys.modules["torch"] = fake_torch.make(gpu)

    class Leaf(torch.nn.Module):
        def forward(self, x):
            return x
    model = torch.nn.Module(*[torch.nn.Module(Leaf(), Leaf(), Leaf()) for _ in range(40)])
    calls = 1 + 40 * 4
    import xsched_lv3.pytorch as xt
    from xsched_lv3.gate import Gate
    shipped = torch.nn.Module.__call__
    xt.install()
    wrapped = torch.nn.Module.__call__

    def timed(config):
        torch.nn.Module.__call__ = shipped if config == "none" else wrapped
        hp = Gate(xt.TorchRecorder(), 10) if config == "guarded" else None
        xt._process_gate = Gate(xt.TorchRecorder(), 0) if config in ("free", "guarded") else None
        t = time.perf_counter()
        for _ in range(args.forwards):
            model(None)
        ns = (time.perf_counter() - t) / args.forwards / calls * 1e9
        for g in (xt._process_gate, hp):
            if g:
                g.close()
        xt._process_gate = None
        return ns

    configs = ["none", "wrapper", "free", "guarded"]
    results = {c: [] for c in configs}
    for _ in range(args.rounds):
        for c in configs:
            results[c].append(timed(c))
    print(f"{os.cpu_count()} CPUs; ns per module call, median (min-max) of {args.rounds} rounds")
    for c in configs:
        v = results[c]
        print(f"  {c:8s} {statistics.median(v):7.0f} ({min(v):.0f}-{max(v):.0f})")

    def request_cost(gap_s):
        """Median µs of a request's begin and end for a service with a lower client registered."""
        service, below = Gate(xt.TorchRecorder(), 10), Gate(xt.TorchRecorder(), 0)
        costs = []
        for _ in range(args.requests):
            t = time.perf_counter()
            service.begin_request()
            service.end_request()
            costs.append(time.perf_counter() - t)
            deadline = time.monotonic() + 1
            while service.board.read_slot(service.slot)[2] and time.monotonic() < deadline:
                time.sleep(0.0002)                   # its watcher marks it idle: the next request is a new one
            time.sleep(gap_s)
        assert service.tracking
        for g in (service, below):
            g.close()
        return statistics.median(costs) * 1e6
    gaps = {"back to back": 0.0, f"after {args.gap_ms:g} ms idle": args.gap_ms / 1e3}
    per_gap = {name: [request_cost(gap) for _ in range(args.rounds)] for name, gap in gaps.items()}
    print(f"us per request start and end (a service above a registered client), median (min-max) of {args.rounds} rounds")
    for name, v in per_gap.items():
        print(f"  {name:18s} {statistics.median(v):7.1f} ({min(v):.1f}-{max(v):.1f})")
    if args.out:
        from benchlib import provenance, write_results
        write_results(args.out, {"benchmark": "hot path, fake torch", **provenance(), "rounds": args.rounds,
                                 "ns_per_module_call": results, "us_per_request_start_and_end": per_gap})


if __name__ == "__main__":
    main()
