#!/usr/bin/env python3
"""A batch inference job, as an ordinary PyTorch program (no scheduler imports): forward passes
back to back, each result synchronized (as a job that consumes its outputs does). Prints one JSON
line with its throughput over the measured interval.

    python batch.py --model resnet50 --batch 16 --seconds 26
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]
from benchlib import iterations_per_second  # noqa: E402  (the benchmarks' one closed loop)
from models import MODELS, build, wait_for_start  # noqa: E402


def run_batches(model, x, seconds, warmup_s, start_at):
    """Iterations per second between start_at + warmup_s and start_at + seconds."""
    import torch
    stream = torch.cuda.current_stream()

    def step():
        model(x)
        stream.synchronize()
    with torch.no_grad():
        return iterations_per_second(step, start_at, seconds, warmup_s)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=MODELS, default="resnet50")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seconds", type=float, default=26.0)
    p.add_argument("--warmup-s", type=float, default=1.0)
    args = p.parse_args()
    model, x = build(args.model, args.batch)
    from serve import warm
    warm(model, x, 10)
    start_at = wait_for_start()
    print(json.dumps({"lp_iters_per_s": run_batches(model, x, args.seconds, args.warmup_s, start_at)}), flush=True)


if __name__ == "__main__":
    main()
