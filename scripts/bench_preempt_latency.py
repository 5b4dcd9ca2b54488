#!/usr/bin/env python3
"""Lv1 preemption latency on a real GPU, like XSched's level.cu: a low-priority XQueue runs a stream
of commands of length T (a spin kernel, torch.cuda._sleep) from 100 µs to 2 ms; at random moments
the queue is suspended and we time the request until the queue is idle (in-flight work drained).
Target: <= T + 50 µs (XSched Lv1 is about 8T with its default 16/8 launch config).
Also reports the throughput cost of the window on the queue alone (commands/s vs. unscheduled).

    python scripts/bench_preempt_latency.py [--samples 100]
Results: results/bench_preempt_latency.{json,png}
"""
import argparse
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchlib import provenance, write_results  # noqa: E402  (next to this script)
from xsched_lv3 import XQueue  # noqa: E402
from xsched_lv3.backends.torch import TorchHwQueue  # noqa: E402

LENGTHS_US = (100, 200, 500, 1000, 2000)


def calibrate(torch):
    """Clock cycles per µs of torch.cuda._sleep on this GPU."""
    torch.cuda._sleep(1000)
    torch.cuda.synchronize()
    cycles = 2_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / (start.elapsed_time(end) * 1000)


def measure(torch, cycles_per_us, t_us, samples, window_us, slack_us):
    hwq = TorchHwQueue()
    xq = XQueue(hwq, window_us=window_us)
    cycles = int(t_us * cycles_per_us)
    lat = []
    for _ in range(samples):
        for _ in range(40):
            xq.submit(lambda: torch.cuda._sleep(cycles), est_us=t_us)
        time.sleep(random.uniform(0, 8 * t_us) / 1e6 + 0.002)
        t = time.perf_counter()
        xq.suspend(sync=True)                      # returns when the hw queue is idle
        lat.append((time.perf_counter() - t) * 1e6)
        xq.resume()
        xq.wait_all()
    xq.close()
    # throughput: scheduled (window) vs. plain back-to-back launches
    n = max(20, int(200_000 / t_us))
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        torch.cuda._sleep(cycles)
    torch.cuda.synchronize()
    plain = n / (time.perf_counter() - t)
    xq = XQueue(TorchHwQueue(), window_us=window_us)
    t = time.perf_counter()
    for _ in range(n):
        xq.submit(lambda: torch.cuda._sleep(cycles), est_us=t_us)
    xq.wait_all()
    scheduled = n / (time.perf_counter() - t)
    xq.close()
    lat.sort()
    return {"T_us": t_us, "window_us": window_us, "samples": samples,
            "p50_us": statistics.median(lat), "p99_us": lat[int(0.99 * (len(lat) - 1))], "max_us": lat[-1],
            "target_us": t_us + slack_us, "throughput_vs_plain": scheduled / plain}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--out", default=str(REPO / "results" / "bench_preempt_latency"))
    args = parser.parse_args()
    import torch
    card = torch.cuda.get_device_name(0)
    cpu = calibrate(torch)
    print(f"card {card}: {cpu:.0f} cycles/µs", flush=True)
    rows = []
    for t_us in LENGTHS_US:
        # window = one command + 50 µs: at most one command in flight (latency <= T + launch);
        # and the XSched-like default of a wider window for comparison
        for window in (t_us + 50, 8 * t_us):
            r = measure(torch, cpu, t_us, args.samples, window, 50)
            rows.append(r)
            print({k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}, flush=True)
    doc = {"benchmark": "Lv1 preemption latency (suspend request -> queue idle)", **provenance(), "card": card,
           "torch": torch.__version__, "cycles_per_us": cpu, "rows": rows}
    write_results(args.out + ".json", doc)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 4))
        for mult, style in ((1, "o-"), (8, "s--")):
            sel = [r for r in rows if (r["window_us"] == r["T_us"] + 50) == (mult == 1)]
            ax.plot([r["T_us"] for r in sel], [r["p99_us"] for r in sel], style,
                    label=f"p99, window {'T+50µs' if mult == 1 else '8T'}")
        ax.plot(LENGTHS_US, [t + 50 for t in LENGTHS_US], "k:", label="target T + 50 µs")
        ax.set_xlabel("command length T (µs)")
        ax.set_ylabel("suspend -> idle (µs)")
        ax.set_title(f"Lv1 preemption latency, {card}")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.out + ".png", dpi=120)
    except ImportError:
        pass


if __name__ == "__main__":
    main()
