"""What a launch and a wait cost on the simulated GPU (kfdtool.sim.hip over the execution model):
the dispatch and query round trips, and how late a wait returns after its kernel's modelled end.

    python scripts/bench_sim_dispatch.py [--samples 500] [--out results/bench_sim_dispatch.json]

One process, one stream on an idle simulated mi308x device (real-time server, as `kfdtool sim
start` runs it). Round trips: `hip.launch` of a 1 us kernel (one "D" dispatch message and its
reply), then `hip.query` (one "D" query). Wait overshoot: time from just before `hip.launch` of a
kernel of W us to `hip.synchronize` returning, minus W; it is an upper bound on the server's
wake-up lateness (it also holds the dispatch round trip and the wait message's trip).
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import provenance, write_results  # noqa: E402

PRESET = "mi308x"
WAIT_KERNELS_US = (200.0, 2000.0, 20000.0)


def summary_us(samples_s):
    ordered = sorted(samples_s)
    return {"n": len(ordered), "p50_us": round(statistics.median(ordered) * 1e6, 1),
            "p99_us": round(ordered[int(0.99 * (len(ordered) - 1))] * 1e6, 1), "max_us": round(ordered[-1] * 1e6, 1)}


def measure(samples):
    from kfdtool.sim.hip import SimHip
    hip = SimHip(PRESET)
    try:
        stream = hip.stream(device=0)
        hip.launch(stream, work_us=1.0, waves=1)            # creates the queue outside the timing
        hip.stream_synchronize(stream)
        dispatch, query = [], []
        for _ in range(samples):
            t0 = time.perf_counter()
            hip.launch(stream, work_us=1.0, waves=1)
            t1 = time.perf_counter()
            hip.query(hip.record(stream))
            t2 = time.perf_counter()
            dispatch.append(t1 - t0)
            query.append(t2 - t1)
        hip.stream_synchronize(stream)
        overshoot = {}
        for work_us in WAIT_KERNELS_US:
            late = []
            for _ in range(max(20, samples // 5) if work_us < 10000 else 30):
                t0 = time.perf_counter()
                hip.launch(stream, work_us=work_us, waves=64)
                hip.stream_synchronize(stream)
                late.append(time.perf_counter() - t0 - work_us * 1e-6)
            overshoot[f"{work_us:g}us"] = summary_us(late)
        return {"dispatch_round_trip": summary_us(dispatch), "query_round_trip": summary_us(query),
                "wait_overshoot": overshoot}
    finally:
        hip.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--out", default="results/bench_sim_dispatch.json")
    args = parser.parse_args()
    load_at_start = os.getloadavg()[0]      # other work on the host skews every number
    from kfdtool.sim import runner
    state = tempfile.mkdtemp(prefix="kfdtool-bench-dispatch-")
    os.environ["KFDTOOL_SIM_DIR"] = state
    try:
        runner.start(PRESET, realtime=True)
        result = measure(args.samples)
    finally:
        runner.stop(PRESET)
        shutil.rmtree(state, ignore_errors=True)
    for name in ("dispatch_round_trip", "query_round_trip"):
        r = result[name]
        print(f"{name:20} p50 {r['p50_us']:7.1f} us  p99 {r['p99_us']:7.1f} us  max {r['max_us']:8.1f} us")
    for kernel, r in result["wait_overshoot"].items():
        print(f"wait overshoot {kernel:>8}: p50 {r['p50_us']:7.1f} us  p99 {r['p99_us']:7.1f} us  "
              f"max {r['max_us']:8.1f} us")
    doc = {**provenance(), "preset": PRESET, "server": "realtime", **result, "load_average_at_start": load_at_start}
    write_results(args.out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
