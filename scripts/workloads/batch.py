#!/usr/bin/env python3
"""A batch job, as an ordinary PyTorch program (no scheduler imports): inference (forward passes)
or, with --train, training steps (forward, backward, an SGD step), back to back, each synchronized
(as a job that consumes its outputs does). Prints one JSON line with its throughput over the
measured interval.

    python batch.py --model resnet50 --batch 16 --seconds 26
    python batch.py --model resnet50 --batch 32 --train
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]
from benchlib import gc_pauses_if_asked, iterations_per_second  # noqa: E402  (the benchmarks' one closed loop)
from models import MODELS, build, wait_for_start  # noqa: E402


def make_step(model, x, train=False, warm=10):
    """One iteration, ended by a synchronize: a forward pass without autograd, or a training step
    whose loss is a plain function of the output (of its first tensor where it returns several). Runs `warm` of
    them first, untimed (kernel selection, the allocator's pools)."""
    import torch
    stream = torch.cuda.current_stream()
    if not train:
        def step():
            with torch.no_grad():
                model(x)
            stream.synchronize()
    else:
        model.train()
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)

        def step():
            optimizer.zero_grad(set_to_none=True)
            out = model(x)
            if not isinstance(out, torch.Tensor):
                out = out[0]                 # a tuple, or a Hugging Face ModelOutput: its logits
            out.float().square().mean().backward()
            optimizer.step()
            stream.synchronize()
    for _ in range(warm):
        step()
    return step


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=MODELS, default="resnet50")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seconds", type=float, default=26.0)
    p.add_argument("--warmup-s", type=float, default=1.0)
    p.add_argument("--train", action="store_true", help="training steps instead of inference")
    args = p.parse_args()
    gc_pauses = gc_pauses_if_asked()          # from before the build, as pair_threads.py records
    model, x = build(args.model, args.batch)
    step = make_step(model, x, args.train)
    start_at = wait_for_start()
    out = {"lp_iters_per_s": iterations_per_second(step, start_at, args.seconds, args.warmup_s)}
    if gc_pauses:
        out["lp_gc_pauses"] = gc_pauses.since(start_at)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
