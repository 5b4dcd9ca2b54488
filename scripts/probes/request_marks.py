#!/usr/bin/env python3
"""What a service's request start and end cost it on a real GPU: the top client with a lower one
registered (so it marks itself active and idle per request, and its watcher waits for each request's
work), requests of a real model at a fixed rate, each timed in parts: begin_request, the forward
pass's launches, end_request, the wait for the result. Interleaved with the same requests without
any gate (`none`). P50 / P90 in µs. A diagnostic.

    python scripts/probes/request_marks.py --model resnet18 --batch 4 --rounds 4
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "scripts"), str(REPO / "scripts" / "workloads")]
from benchlib import percentile, provenance, write_results  # noqa: E402
from models import MODELS, build  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=MODELS, default="resnet18")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--requests", type=int, default=150, help="per segment")
    p.add_argument("--gap-ms", type=float, default=46.0, help="idle time before each request")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--out")
    args = p.parse_args()
    import torch
    import os
    import tempfile
    os.environ["XSCHED_LV3_BOARD"] = str(Path(tempfile.mkdtemp()) / "board")
    import xsched_lv3.pytorch as xt
    from xsched_lv3.gate import Gate
    model, x = build(args.model, args.batch)
    stream = torch.cuda.current_stream()
    parts = {c: {k: [] for k in ("begin", "launch", "end", "wait")} for c in ("none", "tracking")}
    with torch.no_grad():
        for _ in range(20):
            model(x)
        stream.synchronize()
        for r in range(args.rounds):
            for config in (("none", "tracking") if r % 2 == 0 else ("tracking", "none")):
                service = below = None
                if config == "tracking":
                    service, below = Gate(xt.TorchRecorder(), 10), Gate(xt.TorchRecorder(), 0)
                    service.begin_request()          # finds the GPU in use: tracking from here on
                    service.end_request()
                    stream.synchronize()
                    time.sleep(0.05)
                out = parts[config]
                for _ in range(args.requests):
                    time.sleep(args.gap_ms / 1e3)
                    t0 = time.perf_counter()
                    if service:
                        service.begin_request()
                    t1 = time.perf_counter()
                    model(x)
                    t2 = time.perf_counter()
                    if service:
                        service.end_request()
                    t3 = time.perf_counter()
                    stream.synchronize()
                    t4 = time.perf_counter()
                    for k, a, b in (("begin", t0, t1), ("launch", t1, t2), ("end", t2, t3), ("wait", t3, t4)):
                        out[k].append((b - a) * 1e6)
                if service:
                    assert service.tracking, "the service did not track its requests"
                    service.close()
                    below.close()
    summary = {c: {k: [round(percentile(sorted(v), q), 1) for q in (0.5, 0.9)] for k, v in d.items()}
               for c, d in parts.items()}
    for c, d in summary.items():
        print(c, json.dumps(d))
    if args.out:
        write_results(args.out, {"probe": "a service's request start and end on a real GPU", **provenance(),
                                 "model": args.model, "batch": args.batch, "gap_ms": args.gap_ms,
                                 "requests_per_segment": args.requests, "rounds": args.rounds,
                                 "us_p50_p90": summary, "medians": {c: {k: statistics.median(v) for k, v in d.items()}
                                                                    for c, d in parts.items()}})


if __name__ == "__main__":
    main()
