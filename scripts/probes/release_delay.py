#!/usr/bin/env python3
"""How soon a service's lower clients are released once its request's GPU work is done, when the
service's own thread runs Python right after its result (a reply to serialise): the time from the
GPU's completion to the service's idle mark on the board. Fake torch (tests/fake_torch.py), no GPU,
by default: its events are polled, so only the CPU side is timed. With --cuda, a real GPU: a request
is one kernel (torch.cuda._sleep), and the delay runs from the service's result coming back (its
synchronize returning) to the mark. A diagnostic.

    python scripts/probes/release_delay.py --work-ms 20 --requests 40 --out FILE
    python scripts/probes/release_delay.py --cuda --strict --work-ms 20 --requests 200 --short-switch-ms 5 --out FILE
    python scripts/probes/release_delay.py --table FILES
"""
import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "scripts")]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work-ms", type=float, default=20.0, help="Python after each result, GIL held")
    p.add_argument("--kernel-ms", type=float, default=2.0)
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--cuda", action="store_true", help="a real GPU (torch with CUDA or ROCm) instead of fake torch")
    p.add_argument("--short-switch-ms", type=float,
                   help="the scheduler's short GIL switch interval (xsched_lv3.gil; 5 = the interpreter's "
                        "default, as before it existed)")
    p.add_argument("--strict", action="store_true",
                   help="the service at --latency-slack 0: every request holds the lower client (else a "
                        "request its protection exposes marks nothing, and is not counted)")
    p.add_argument("--out")
    p.add_argument("--table", nargs="+", metavar="RESULTS", help="print the docs' table of these results")
    args = p.parse_args()
    if args.table:
        return print_table(args.table)
    if args.requests < 10 or args.work_ms < 0 or args.kernel_ms <= 0:
        p.error("--requests must be >= 10, --work-ms >= 0, --kernel-ms > 0")
    if args.cuda:
        import torch
        torch.cuda.init()
        torch.cuda._sleep(1000)                      # the context and the kernel's module, before any timing
        torch.cuda.synchronize()
        cycles = _cycles_per_ms(torch)
    else:
        import fake_torch
        gpu = fake_torch.FakeGPU()
        torch = sys.modules["torch"] = fake_torch.make(gpu)
    os.environ["XSCHED_LV3_BOARD"] = str(Path(tempfile.mkdtemp()) / "board")
    import xsched_lv3.pytorch as xt
    from benchlib import percentile, provenance, write_results
    from xsched_lv3.gate import Gate
    from xsched_lv3.gil import short_switch
    if args.short_switch_ms is not None:
        short_switch.seconds = args.short_switch_ms / 1e3
    slack = {"latency_slack": 0} if args.strict else {}
    service = Gate(xt.TorchRecorder(), 10, window_us=None, **slack)
    below = Gate(xt.TorchRecorder(), 0, window_us=None)
    marks, delays = [], []                           # marks: (active, when)
    mark = service._mark
    service._mark = lambda active: (marks.append((active, time.monotonic())), mark(active))
    for _ in range(args.requests):
        first = len(marks)
        service.begin_request()
        if args.cuda:
            torch.cuda._sleep(int(cycles * args.kernel_ms))
        else:
            done_at = gpu.launch("k", args.kernel_ms / 1e3)
        service.end_request()
        torch.cuda.current_stream().synchronize()    # the service's result
        if args.cuda:
            done_at = time.monotonic()               # (the GPU's completion is not on this clock)
        t = time.monotonic()
        while time.monotonic() - t < args.work_ms / 1e3:
            pass                                     # its Python after the result
        time.sleep(0.03)                             # idle until the next request: marked by now
        if [active for active, _ in marks[first:]] == [True, False]:    # held the lower client, and let go
            delays.append(marks[-1][1] - done_at)
    service.close()
    below.close()
    if len(delays) < args.requests // 2:
        sys.exit(f"only {len(delays)} of {args.requests} requests held the lower client: try --strict")
    ordered = sorted(d * 1e3 for d in delays)
    summary = {q: round(percentile(ordered, p), 3) for q, p in (("p10", 0.1), ("p50", 0.5), ("p90", 0.9))}
    summary["max"] = round(ordered[-1], 3)
    print(f"lower clients released after the GPU was done (ms), {len(delays)} requests: {summary}; "
          f"the first request's {delays[0] * 1e3:.3f}")
    if args.out:
        write_results(args.out, {"probe": "release delay after a service's request", **provenance(),
                                 "gpu": "cuda" if args.cuda else "fake torch (polled events)",
                                 "delay_from": "the result's return" if args.cuda else "the GPU's completion",
                                 "work_ms": args.work_ms, "kernel_ms": args.kernel_ms, "requests": args.requests,
                                 "strict": args.strict, "requests_that_held": len(delays),
                                 "switch_interval_ms": sys.getswitchinterval() * 1e3,
                                 "short_switch_ms": short_switch.seconds * 1e3, "release_ms": summary,
                                 "first_ms": round(delays[0] * 1e3, 3)})


def print_table(files):
    import json
    print("| results | GPU | from | switch interval while waiting (ms) | requests that held | release P10 / P50 / P90 / max (ms) |")
    print("|---|---|---|---|---|---|")
    for f in files:
        r = json.loads(Path(f).read_text())
        ms = r["release_ms"]
        card = r["card"] if r.get("gpu") == "cuda" else f"fake torch ({r['cpu_count']} CPUs)"
        held = r.get("requests_that_held")
        held = f"{held} of {r['requests']}" if held is not None else f"not counted ({r['requests']} requests)"
        origin = r.get("delay_from", "the GPU's completion")
        print(f"| {Path(f).stem} | {card} | {origin} | "
              f"{r.get('short_switch_ms', r['switch_interval_ms']):g} | {held} | "
              f"{ms['p10']:.2f} / {ms['p50']:.2f} / {ms['p90']:.2f} / {ms['max']:.2f} |")


def _cycles_per_ms(torch):
    """torch.cuda._sleep's cycles in a millisecond on this GPU (timed once)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return 10_000_000 / start.elapsed_time(end)


if __name__ == "__main__":
    main()
