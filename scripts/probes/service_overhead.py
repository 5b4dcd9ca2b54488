#!/usr/bin/env python3
"""What the scheduler costs a launch-bound service's own requests: one process, one model, requests
one at a time with an idle gap after each (so each is a busy period of its own, as at 20 a second),
in alternating segments of these configurations:

  none        nn.Module.__call__ as torch ships it (the service alone, not under `xsched-lv3 run`)
  alone       under the scheduler with nobody else on the board (`xsched-lv3 run`, nothing below it)
  tracking    the top client with a lower one registered: it marks itself active per request and
              watches its work complete (what a service next to a batch job pays)

Per configuration: the request's launch span (the call until the model returns: the CPU's part)
and its latency (until its result is on the CPU), medians over the rounds of per-segment medians
and P90s. --profile CONFIG adds a cProfile of one segment. A diagnostic.

    python scripts/probes/service_overhead.py --model encoder --batch 1 --rounds 7 --profile tracking
"""
import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "scripts"), str(REPO / "scripts" / "workloads")]
from benchlib import add_profile, percentile, provenance, write_results  # noqa: E402
from models import MODELS, build  # noqa: E402

CONFIGS = ("none", "alone", "tracking")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=MODELS, default="encoder")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--requests", type=int, default=100, help="per segment")
    p.add_argument("--gap-ms", type=float, default=10.0, help="idle time after each request")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--profile", choices=CONFIGS)
    p.add_argument("--out")
    args = p.parse_args()
    os.environ["XSCHED_LV3_BOARD"] = str(Path(tempfile.mkdtemp()) / "board")     # a board of its own
    import torch
    import xsched_lv3.pytorch as xt
    from xsched_lv3.gate import Gate
    shipped = torch.nn.Module.__call__
    model, x = build(args.model, args.batch)
    stream = torch.cuda.current_stream()
    with torch.no_grad():
        for _ in range(20):
            model(x)
    torch.cuda.synchronize()
    xt.install()
    wrapped = torch.nn.Module.__call__

    def segment(config):
        torch.nn.Module.__call__ = shipped if config == "none" else wrapped
        service = Gate(xt.TorchRecorder(), priority=10) if config != "none" else None
        below = Gate(xt.TorchRecorder(), priority=0) if config == "tracking" else None
        xt._process_gate = service
        launch, latency = [], []
        try:
            with torch.no_grad():
                for _ in range(args.requests):
                    t0 = time.perf_counter()
                    model(x)
                    t1 = time.perf_counter()
                    stream.synchronize()
                    t2 = time.perf_counter()
                    launch.append(t1 - t0)
                    latency.append(t2 - t0)
                    time.sleep(args.gap_ms / 1e3)
        finally:
            xt._process_gate = None
            for g in (below, service):
                if g is not None:
                    g.close()
        if config == "tracking" and not service.tracking:
            raise SystemExit("service_overhead: the service did not track (no lower client seen)")
        return launch, latency

    rows = {c: {"launch_p50": [], "launch_p90": [], "latency_p50": [], "latency_p90": []} for c in CONFIGS}
    for r in range(args.rounds):
        for config in random.Random(r).sample(CONFIGS, len(CONFIGS)):
            launch, latency = segment(config)
            for name, values in (("launch", launch), ("latency", latency)):
                rows[config][f"{name}_p50"].append(statistics.median(values) * 1e3)
                rows[config][f"{name}_p90"].append(percentile(sorted(values), 0.9) * 1e3)
    doc = {"probe": "service overhead, one process, alternating segments", **provenance(),
           "torch": torch.__version__, "model": args.model, "batch": args.batch, "requests": args.requests,
           "gap_ms": args.gap_ms, "rounds": args.rounds, "configs": {}}
    for config in CONFIGS:
        med = {k: round(statistics.median(v), 4) for k, v in rows[config].items()}
        doc["configs"][config] = {**med, "per_round": rows[config]}
        print(f"{args.model} b{args.batch} {config:9s} " + "  ".join(f"{k} {v:.3f} ms" for k, v in med.items()),
              flush=True)
    if args.profile:
        add_profile(doc, args.profile, lambda: segment(args.profile), 25)
    if args.out:
        write_results(args.out, doc)


if __name__ == "__main__":
    main()
