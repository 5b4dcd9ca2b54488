"""What the benchmark scripts share: open-loop request arrivals and latency summaries."""
import statistics
import time


def open_loop(rate, seconds, request, warmup_s=0.0, t0=None):
    """Call `request()` at `rate` per second for `seconds` (arrivals on a fixed schedule, whatever
    the previous request took). Returns latencies (completion - scheduled arrival) after warm-up."""
    t0 = time.monotonic() if t0 is None else t0
    latencies = []
    i = 0
    while True:
        arrival = t0 + i / rate
        if arrival > t0 + seconds:
            return latencies
        delay = arrival - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        request()
        if arrival - t0 >= warmup_s:
            latencies.append(time.monotonic() - arrival)
        i += 1


def latency_summary(latencies_s, prefix="hp"):
    """p50 / p99 / max in ms (p99 = the value at rank 0.99 of the sorted samples)."""
    lat = sorted(latencies_s)
    return {f"{prefix}_p50_ms": statistics.median(lat) * 1e3, f"{prefix}_p99_ms": lat[int(0.99 * (len(lat) - 1))] * 1e3,
            f"{prefix}_max_ms": lat[-1] * 1e3}
