#!/usr/bin/env python3
"""Run a workload script under torch's profiler (GPU activity only) and save its GPU timeline in
CLOCK_MONOTONIC, the clock every process on the host shares: each kernel, copy and fill (start,
end, when its launch call began) and each synchronizing call, plus the start time the benchmark
sent the workload on stdin. For scripts/probes/corun_timeline.py; a diagnostic.

    python scripts/probes/kineto_wrap.py --out lp.json.gz -- scripts/workloads/batch.py --model vit_b_16

The profiler's clock is tied to CLOCK_MONOTONIC by a marker: a cudaDeviceSynchronize made right
after the profiler starts and another right before it stops, each bracketed by time.monotonic().
Both offsets are saved; they should agree to a few µs (the clocks do not drift apart in a run).
"""
import argparse
import gzip
import json
import os
import runpy
import sys
import tempfile
import time

GPU_WORK = ("kernel", "gpu_memcpy", "gpu_memset")
CALLS = ("cuda_runtime", "cuda_driver")
SYNCS = ("Synchronize", "EventQuery", "StreamQuery")     # calls that wait for, or ask after, the GPU


class RecordingStdin:
    """sys.stdin, remembering the lines read (the benchmark's start time, models.wait_for_start)."""

    def __init__(self, stream):
        self.stream, self.lines = stream, []

    def readline(self, *args):
        line = self.stream.readline(*args)
        self.lines.append(line)
        return line

    def __getattr__(self, name):
        return getattr(self.stream, name)


def marker(torch):
    before = time.monotonic()
    torch.cuda.synchronize()
    return before, time.monotonic()


def compact(trace, markers):
    """The trace's GPU work and synchronizing calls in CLOCK_MONOTONIC seconds."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    device_syncs = [e for e in events if e.get("cat") in CALLS and e["name"] == "cudaDeviceSynchronize"]
    if len(device_syncs) < 2:
        raise SystemExit("kineto_wrap: the trace has no cudaDeviceSynchronize markers (runtime calls not traced)")
    first, last = min(device_syncs, key=lambda e: e["ts"]), max(device_syncs, key=lambda e: e["ts"])
    offsets = [(before + after) / 2 - (e["ts"] + e["dur"] / 2) * 1e-6
               for (before, after), e in zip(markers, (first, last))]
    offset = offsets[-1]
    launch_at = {e["args"]["correlation"]: e["ts"] * 1e-6 + offset
                 for e in events if e.get("cat") in CALLS and "correlation" in e.get("args", {})}
    names, index = [], {}

    def name_id(name):
        if name not in index:
            index[name] = len(names)
            names.append(name)
        return index[name]
    work = sorted([round(e["ts"] * 1e-6 + offset, 7), round((e["ts"] + e["dur"]) * 1e-6 + offset, 7),
                   round(launch_at.get(e["args"].get("correlation"), float("nan")), 7), name_id(e["name"])]
                  for e in events if e.get("cat") in GPU_WORK)
    syncs = sorted([round(e["ts"] * 1e-6 + offset, 7), round((e["ts"] + e["dur"]) * 1e-6 + offset, 7),
                    name_id(e["name"])]
                   for e in events if e.get("cat") in CALLS and any(s in e["name"] for s in SYNCS))
    return {"offsets_s": offsets, "names": names, "work": work, "syncs": syncs}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="where the timeline goes (.json.gz)")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    args = p.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile
    stdin = sys.stdin = RecordingStdin(sys.stdin)
    torch.cuda.init()
    prof = profile(activities=[ProfilerActivity.CUDA])
    prof.start()
    markers = [marker(torch)]
    try:
        sys.argv = [args.script] + args.args
        runpy.run_path(args.script, run_name="__main__")
    finally:
        markers.append(marker(torch))
        prof.stop()
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.json")
            prof.export_chrome_trace(path)
            with open(path) as f:
                trace = json.load(f)
        starts = [float(line) for line in stdin.lines if line.strip()]
        doc = {"start_at": starts[0] if starts else None, "markers": markers, **compact(trace, markers)}
        with gzip.open(args.out, "wt") as f:
            json.dump(doc, f)


if __name__ == "__main__":
    main()
