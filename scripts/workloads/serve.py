#!/usr/bin/env python3
"""A latency-critical inference service, as an ordinary PyTorch program (no scheduler imports):
requests arrive open-loop at --rate per second; a request's latency runs from its scheduled
arrival to its result being on the CPU side (synchronize). Prints one JSON line of latencies.

    python serve.py --model resnet18 --batch 4 --rate 20 --seconds 26
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]
from benchlib import open_loop  # noqa: E402  (the benchmarks' one arrival loop)
from models import MODELS, build, wait_for_start  # noqa: E402


def serve(model, x, rate, seconds, warmup_s, start_at):
    """Open-loop arrivals from start_at; latencies of the requests after warmup_s."""
    import torch

    def request():
        model(x)
        torch.cuda.current_stream().synchronize()
    with torch.no_grad():
        return open_loop(rate, seconds, request, warmup_s, t0=start_at)


def warm(model, x, iterations=20):
    import torch
    with torch.no_grad():
        for _ in range(iterations):
            model(x)
    torch.cuda.synchronize()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=MODELS, default="resnet18")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--rate", type=float, default=20.0)
    p.add_argument("--seconds", type=float, default=26.0)
    p.add_argument("--warmup-s", type=float, default=1.0)
    args = p.parse_args()
    model, x = build(args.model, args.batch)
    warm(model, x)
    start_at = wait_for_start()
    lat = serve(model, x, args.rate, args.seconds, args.warmup_s, start_at)
    print(json.dumps({"hp_latencies_s": lat}), flush=True)


if __name__ == "__main__":
    main()
