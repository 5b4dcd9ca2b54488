#!/usr/bin/env python3
"""Coverage of the inline gate: GPU operations a low-priority job launches while it should be held.

A batch job (inference, or with --train training steps: forward, backward, SGD) runs in one thread
bound with `xt.client(priority=0)`; a high-priority client on the
same board becomes active at random moments (for --active-ms each time) and idle again. Every ATen
operation the job dispatches on the GPU is seen by a TorchDispatchMode on the job's thread (autograd
carries it to its own thread for backward); one dispatched while the high-priority client is marked active is a leak. What remains after the gate
is the race between a check and the next one: the operations a module launches after the last
check it passed, before the high-priority client became active.

    python scripts/measure_leaks.py --model vit_b_16 --batch 32 --seconds 20
    python scripts/measure_leaks.py --model resnet50 --batch 32 --train
"""
import argparse
import collections
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts"), str(REPO / "scripts" / "workloads")]
from benchlib import git_revision_of, provenance  # noqa: E402
from batch import make_step  # noqa: E402
from models import MODELS, build  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=MODELS, default="vit_b_16")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--active-ms", type=float, default=3.0)
    p.add_argument("--train", action="store_true", help="training steps instead of inference")
    p.add_argument("--scheduler", metavar="CHECKOUT", help="measure this tree's xsched_lv3 (default: this one's)")
    p.add_argument("--out")
    args = p.parse_args()
    os.environ["XSCHED_LV3_BOARD"] = str(Path(tempfile.mkdtemp()) / "board")
    scheduler_revision = None
    if args.scheduler:
        checkout = Path(args.scheduler).resolve()
        if not (checkout / "xsched_lv3" / "__init__.py").is_file():
            p.error(f"--scheduler {args.scheduler}: no xsched_lv3 package there")
        sys.path.insert(0, str(checkout))
        scheduler_revision = git_revision_of(checkout)
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    import xsched_lv3.pytorch as xt
    from xsched_lv3.board import Board

    model, x = build(args.model, args.batch)
    board = Board()
    counts = collections.Counter()
    leaked_ops = collections.Counter()
    per_activation = collections.Counter()
    state = {"activation": 0}
    hp_slot = board.allocate(os.getpid(), 10, 0, xt.TorchRecorder().device_key())

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args_=(), kwargs=None):
            active = board.read_slot(hp_slot)[2]
            counts["ops"] += 1
            if active:
                counts["leaks"] += 1
                leaked_ops[str(func.overloadpacket)] += 1
                per_activation[state["activation"]] += 1
            return func(*args_, **(kwargs or {}))

    stop = threading.Event()

    def job():
        step = make_step(model, x, args.train, warm=0)     # warmed below, as a client
        with xt.client(priority=0) as gate, Count():
            while not stop.is_set():
                step()
                counts["iterations"] += 1
            counts["held"] = gate.waits

    t = threading.Thread(target=job)
    t.start()
    time.sleep(2.0)                                   # warm
    counts.clear()
    rng = random.Random(1)
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        time.sleep(rng.uniform(0.002, 0.02))
        state["activation"] += 1
        board.set_active(hp_slot, True)
        time.sleep(args.active_ms / 1e3)
        board.set_active(hp_slot, False)
    stop.set()
    t.join()
    board.release(hp_slot)
    doc = {"benchmark": "gate coverage (leaks)", **provenance(), "torch": torch.__version__, "model": args.model,
           "batch": args.batch, "train": args.train,
           "scheduler": str(Path(xt.__file__).resolve().parents[1]),
           "scheduler_revision": scheduler_revision or ("this checkout" if not args.scheduler else None), "seconds": args.seconds, "activations": state["activation"],
           "ops": counts["ops"], "iterations": counts["iterations"],
           "ops_per_iteration": counts["ops"] / max(1, counts["iterations"]),
           "leaks": counts["leaks"], "activations_with_leaks": len(per_activation),
           "max_leaks_per_activation": max(per_activation.values(), default=0),
           "leaked_ops": dict(leaked_ops.most_common(15))}
    print(json.dumps(doc, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
