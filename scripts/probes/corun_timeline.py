#!/usr/bin/env python3
"""Where a service's tail goes next to a batch job, from the GPU's own timeline. Both programs run
as scripts/bench_two_models.py runs them (hp-alone, native, xsched: `xsched-lv3 run` with default
options), each under torch's profiler (kineto_wrap.py), and their timelines are put on one clock.
For each of the service's requests, from its arrival to its result:

  hp_gpu_ms      the GPU busy with the service's own work
  lp_gpu_ms      the GPU busy with the batch job's work, split into
    lp_queued_ms   work the batch job had launched before the arrival (queued or running then)
    lp_late_ms     work it launched after the arrival (before the scheduler held it, or let through)
  lp_ahead_ms    the batch job's work that ran between the arrival and the service's first kernel
  first_hp_ms    the arrival to the service's first kernel starting
  hp_first_launch_ms, hp_last_launch_ms   the arrival to the service's first and last launch call
                 (its CPU's part: a late wake-up, the Python that launches)
  idle_ms        the GPU running neither (the service's CPU, launch gaps, a late wake-up)

And for the batch job, where its throughput goes (`lp_busy`): the share of the time its own work kept
the GPU busy, during the service's requests (from arrival to result, where the scheduler holds it)
and between them (where only its own launching and its window can leave the GPU idle), and the GPU's
idle gaps between two of its kernels outside the requests.

Processes on an NVIDIA GPU without MPS time-slice: their kernels never overlap, which checks the
clocks (`overlap_ms`, summed over the run, should be ~0). A diagnostic: profiling adds its own cost
(and turns off the scheduler's direct forward path), so compare variants within one run.

    python scripts/probes/corun_timeline.py --pair encb1-vitb32 --out results/diagnostics/corun_timeline.json
    python scripts/probes/corun_timeline.py --table results/diagnostics/corun_timeline_*.json
"""
import argparse
import bisect
import gzip
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "scripts")]
from bench_two_models import PAIRS, commands, rate  # noqa: E402
from benchlib import PY, percentile, provenance, run_together, write_results  # noqa: E402

WRAP = str(Path(__file__).resolve().parent / "kineto_wrap.py")
VARIANTS = ("hp-alone", "native", "xsched")
WARMUP_S = 1.0                    # serve.py's default: requests before it are not counted
COMPONENTS = ("latency_ms", "hp_first_launch_ms", "hp_last_launch_ms", "first_hp_ms", "hp_gpu_ms", "lp_gpu_ms", "lp_queued_ms", "lp_late_ms",
              "lp_ahead_ms", "idle_ms")


def wrapped(cmd, out):
    """`cmd` with the workload's python running it under kineto_wrap.py (the last python in it:
    under `xsched-lv3 run` the first one runs the scheduler's CLI)."""
    i = max(k for k, a in enumerate(cmd) if a == PY)
    return cmd[:i + 1] + [WRAP, "--out", out, "--"] + cmd[i + 1:]


class Work:
    """One process's GPU work: intervals in start order, for the union of those within a span."""

    def __init__(self, timeline):
        self.items = timeline["work"]                    # [start, end, launch, name]
        self.starts = [w[0] for w in self.items]
        self.longest = max((w[1] - w[0] for w in self.items), default=0.0)

    def within(self, a, e):
        """Items that overlap [a, e]."""
        lo = bisect.bisect_left(self.starts, a - self.longest)
        hi = bisect.bisect_right(self.starts, e)
        return [w for w in self.items[lo:hi] if w[1] > a]

    def first_start(self, a, e):
        i = bisect.bisect_left(self.starts, a)
        return self.starts[i] if i < len(self.starts) and self.starts[i] <= e else None


def union(intervals, a, e):
    """Length of the union of `intervals` clipped to [a, e]."""
    total, reach = 0.0, a
    for s, t in sorted((max(s, a), min(t, e)) for s, t in intervals):
        if t > reach and t > s:
            total += t - max(s, reach)
            reach = t
    return total


def arrivals(start_at, per_s, n):
    """The arrival times of the n requests serve.py counted (benchlib.open_loop's schedule)."""
    out, i = [], 0
    while len(out) < n:
        if i / per_s >= WARMUP_S:
            out.append(start_at + i / per_s)
        i += 1
    return out


def per_request(hp_timeline, hp_out, per_s, lp_timeline=None):
    hp = Work(hp_timeline)
    lp = Work(lp_timeline) if lp_timeline else None
    rows, overlap = [], 0.0
    latencies = hp_out["hp_latencies_s"]
    for a, latency in zip(arrivals(hp_timeline["start_at"], per_s, len(latencies)), latencies):
        e = a + latency
        items = [w for w in hp.within(a, e) if w[0] >= a]
        mine = [(w[0], w[1]) for w in items]
        launches = [w[2] for w in items if w[2] == w[2]] or [e]
        first = hp.first_start(a, e)
        row = {"latency_ms": latency, "hp_gpu_ms": union(mine, a, e),
               "hp_first_launch_ms": min(launches) - a, "hp_last_launch_ms": max(launches) - a,
               "first_hp_ms": (first - a) if first is not None else latency}
        theirs = lp.within(a, e) if lp else []
        queued = [(w[0], w[1]) for w in theirs if not w[2] >= a]      # launched before (or unknown: nan)
        late = [(w[0], w[1]) for w in theirs if w[2] >= a]
        row.update(lp_gpu_ms=union(queued + late, a, e), lp_queued_ms=union(queued, a, e),
                   lp_late_ms=union(late, a, e),
                   lp_ahead_ms=union(queued + late, a, a + row["first_hp_ms"]),
                   idle_ms=latency - (busy := union(mine + queued + late, a, e)))
        overlap += row["hp_gpu_ms"] + row["lp_gpu_ms"] - busy
        rows.append({k: round(v * 1e3, 4) for k, v in row.items()})
    return rows, overlap * 1e3


def lp_busy(lp, spans, t0, t1):
    """Where the batch job's GPU time goes over [t0, t1]: the share of the time its work kept the GPU
    busy during the service's requests (`spans`, (arrival, result) pairs) and between them, and its
    GPU's idle gaps between requests (between two of its kernels, neither inside a request)."""
    merged = []
    for a, e in sorted(spans):
        a, e = max(a, t0), min(e, t1)
        if e <= a:
            continue
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([a, e])
    intervals = [(w[0], w[1]) for w in lp.within(t0, t1)]
    busy = union(intervals, t0, t1)
    inside = sum(union([(w[0], w[1]) for w in lp.within(a, e)], a, e) for a, e in merged)
    in_requests = sum(e - a for a, e in merged)
    between = (t1 - t0) - in_requests
    starts = [a for a, _ in merged]
    gaps, reach = [], None
    for s, t in intervals:                                      # in start order, as Work keeps them
        if reach is not None and s > reach:
            i = bisect.bisect_right(starts, reach) - 1          # the gap lies between requests
            if (i < 0 or merged[i][1] <= reach) and (i + 1 >= len(merged) or merged[i + 1][0] >= s):
                gaps.append((s - reach) * 1e3)
        reach = t if reach is None else max(reach, t)
    return {"requests_share": round(in_requests / (t1 - t0), 4),
            "in_requests": round(inside / in_requests, 4) if in_requests > 0 else None,
            "between": round((busy - inside) / between, 4) if between > 0 else None,
            "gaps_between_per_s": round(len(gaps) / (t1 - t0), 1),
            "gap_ms": quantiles(gaps) if gaps else None,
            "gap_total_share": round(sum(gaps) * 1e-3 / between, 4) if between > 0 else None}


def remaining_at(lp, a):
    """The batch job's launched work still to run at `a` (what a request arriving then finds ahead
    of it), in ms: each item launched before `a` and not done by then, its part after `a`. One
    stream runs its items in launch order, so the scan stops at the first item launched after `a`."""
    total = 0.0
    for w in lp.items[bisect.bisect_left(lp.starts, a - lp.longest):]:
        if w[2] >= a:
            break
        if w[1] > a:
            total += w[1] - max(w[0], a)
    return total * 1e3


LET_THROUGH_MS = 0.5             # a request with more of the batch job's late work ran beside it


def summary(rows):
    """Medians, the slowest requests' means, and the P99 over all requests and over those during
    which the batch job ran under LET_THROUGH_MS of work launched after the arrival (held: the
    protected ones, apart from the scheduler's reaction time)."""
    held = [r for r in rows if r["lp_late_ms"] < LET_THROUGH_MS]
    return {**_summary(rows), "held": _summary(held) if held else None}


def _summary(rows):
    ordered = sorted(rows, key=lambda r: r["latency_ms"])
    n = len(ordered)

    def mean_of(part):
        return {k: round(statistics.fmean(r[k] for r in part), 3) for k in COMPONENTS}
    return {"requests": n,
            "p50": {k: round(statistics.median(r[k] for r in rows), 3) for k in COMPONENTS},
            "slowest_5pct_mean": mean_of(ordered[-max(1, n // 20):]),
            "slowest_1pct_mean": mean_of(ordered[-max(1, n // 100):]),
            "p99_ms": round(percentile([r["latency_ms"] for r in ordered], 0.99), 3),
            "p99_request": ordered[min(n - 1, int(0.99 * n) - 1)]}


def quantiles(values):
    v = sorted(values)
    return {q: round(v[min(len(v) - 1, int(len(v) * p))], 3) for q, p in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))}


def scalars(report):
    return {k: v for k, v in report.items() if isinstance(v, (int, float, str, bool)) or v is None}


def run_variant(pair, variant, seconds, tmp):
    """One run of `variant`; its timelines go to the fresh directory `tmp`."""
    cmds = commands(variant, pair, seconds)
    outs = [f"{tmp}/{role}.json.gz" for role in ("hp", "lp")[:len(cmds)]]
    outputs = run_together([wrapped(c, o) for c, o in zip(cmds, outs)], seconds + 300)
    timelines = []
    for o in outs:
        with gzip.open(o, "rt") as f:
            timelines.append(json.load(f))
    per_s = rate(pair)
    rows, overlap = per_request(timelines[0], outputs[0], per_s, timelines[1] if len(timelines) > 1 else None)
    result = {"variant": variant, "clock_offsets_s": [t["offsets_s"] for t in timelines],
              "overlap_ms": round(overlap, 3), **summary(rows)}
    if len(timelines) > 1:
        starts = arrivals(timelines[0]["start_at"], per_s, len(rows))
        result["lp_remaining_at_arrival_ms"] = quantiles(remaining_at(Work(timelines[1]), a) for a in starts)
        result["lp_iters_per_s"] = outputs[1].get("lp_iters_per_s")
        result["lp_kernels_ms"] = quantiles((w[1] - w[0]) * 1e3 for w in timelines[1]["work"])
        ends = [a + lat for a, lat in zip(starts, outputs[0]["hp_latencies_s"])]
        result["lp_busy"] = lp_busy(Work(timelines[1]), list(zip(starts, ends)), starts[0], ends[-1])
    for role, out in zip(("hp", "lp"), outputs):
        if "gate" in out:
            result[f"{role}_gate"] = scalars(out["gate"])
    result["slowest"] = sorted(rows, key=lambda r: r["latency_ms"])[-10:]
    result["per_request"] = {k: [r[k] for r in rows] for k in rows[0]}     # in arrival order
    return result


def _held(held):
    return f"{held['requests']}, {held['p99_ms']:.2f}" if held else "-, -"


def _busy(busy):
    if not busy:
        return "-"
    gaps = busy["gap_ms"]
    gaps = f"{gaps['p50']:.3f} / {gaps['p90']:.3f}" if gaps else "-"
    return (f"{busy['in_requests']:.2f} / {busy['between']:.2f} ({busy['requests_share']:.2f}), "
            f"{busy['gaps_between_per_s']:.0f}, {gaps}")


def _means(means, parts):
    return ", ".join(f"{means[k]:.2f}" if k in means else "-" for k in parts)     # (older runs lack some)


def table(paths):
    """Per run and variant: the P99, and the means over its slowest 1 % of requests (all of them, and
    those the batch job was held through) of the parts above; the batch job's work found at arrivals."""
    parts = ("latency_ms", "hp_last_launch_ms", "hp_gpu_ms", "lp_queued_ms", "lp_late_ms")
    head = "launch span, service's GPU, batch job's queued / late work"
    lines = [f"| run | variant | P99 (ms) | slowest 1 %: latency, {head} (ms) | those with under {LET_THROUGH_MS} ms of the "
             f"batch job's work launched after their arrival: n, P99, slowest 1 % as before | batch job's work ahead at arrival P50 / P99 (ms) | "
             "batch job's GPU busy in requests / between them (their share of the time), idle gaps between: per s, P50 / P90 (ms) |",
             "|---|---|---|---|---|---|---|"]
    cards, revisions = set(), set()
    for path in paths:
        doc = json.loads(Path(path).read_text())
        cards.add(doc["card"])
        revisions.add(doc["git_revision"][:7])
        for v in doc["variants"]:
            held = v.get("held") or {}
            slow = _means(v["slowest_1pct_mean"], parts)
            held_slow = _means(held["slowest_1pct_mean"], parts) if held else "-"
            ahead = v.get("lp_remaining_at_arrival_ms")
            ahead = f"{ahead['p50']:.2f} / {ahead['p99']:.2f}" if ahead else "-"
            lines.append(f"| {Path(path).stem} | {v['variant']} | {v.get('p99_ms', v['p99_request']['latency_ms']):.2f} | "
                         f"{slow} | {_held(held)}, {held_slow} | "
                         f"{ahead} | {_busy(v.get('lp_busy'))} |")
    lines.append("")
    lines.append(f"{len(paths)} results files ({', '.join(sorted(cards))}; revisions {', '.join(sorted(revisions))}); "
                 "profiled runs: the profiler slows every launch.")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--table", nargs="+", metavar="RESULTS", help="print the table of these results")
    p.add_argument("--pair", choices=sorted(PAIRS), default="encb1-vitb32")
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--seconds", type=float, default=26.0)
    p.add_argument("--out")
    args = p.parse_args()
    if args.table:
        print(table(args.table), end="")
        return
    doc = {**provenance(), "probe": "corun timeline", "pair": args.pair, "variants": []}
    with tempfile.TemporaryDirectory() as tmp:
        for variant in args.variants:
            r = run_variant(args.pair, variant, args.seconds, tempfile.mkdtemp(dir=tmp))
            doc["variants"].append(r)
            print(json.dumps({k: v for k, v in r.items() if k not in ("slowest", "hp_gate", "lp_gate", "per_request")}), flush=True)
    if args.out:
        write_results(args.out, doc)


if __name__ == "__main__":
    main()
