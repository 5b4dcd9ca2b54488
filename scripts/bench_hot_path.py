#!/usr/bin/env python3
"""CPU cost of xsched_lv3's nn.Module.__call__ wrapper per module call, without a GPU: the fake torch
of the tests (tests/fake_torch.py) with modules that launch nothing, so only the wrapper's own work
is timed. Configurations alternate, several rounds; medians in ns per module call.

    python scripts/bench_hot_path.py [--rounds 5]
  none      nn.Module.__call__ unwrapped          free      a client with nobody above it
  wrapper   wrapped, no client bound               guarded   a higher-priority client registered, idle
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--forwards", type=int, default=300)
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


if __name__ == "__main__":
    main()
