#!/usr/bin/env python3
"""Summarise an `xsched-lv3 daemon --trace FILE` (or BENCH_DAEMON_TRACE) file: how long SUSPEND_QUEUES
and RESUME_QUEUES calls took, and how long after the activation it serves each suspend started (the
daemon's lag), and of that how long until its loop woke (traces since a91574c); how long each client
stayed suspended (from a suspend call's start to the next resume call's start for its pid: each takes
effect from its start), and which share of its traced span (its first line to its last) each pid's queues
spent suspended. Percentiles in microseconds.

    python scripts/daemon_trace_summary.py /tmp/daemon.trace
    python scripts/daemon_trace_summary.py results/diagnostics/trace_mi308x_16cpu_c0ef027.txt.gz
"""
import argparse
import gzip
import re
import sys

from benchlib import percentile  # (next to this script) the benchmarks' one rank rule

SUSPEND = re.compile(r"^([\d.]+) suspend pid (\d+) took (\d+) us"
                     r"(?: (\d+) us after the activation(?: \(woken after (\d+) us\))?)?")
RESUME = re.compile(r"^([\d.]+) resume pid (\d+) took (\d+) us")


def read(path):
    """The series of the trace, and per pid the suspended share of its traced span."""
    opener = gzip.open if path.endswith(".gz") else open
    suspends, lags, wakes, resumes, held = [], [], [], [], []
    suspended_since, suspended_us, first, last = {}, {}, {}, {}
    with opener(path, "rt") as f:
        for line in f:
            m = SUSPEND.search(line) or RESUME.search(line)
            if not m:
                continue
            at, pid, took = float(m.group(1)), int(m.group(2)), int(m.group(3))
            first.setdefault(pid, at)
            last[pid] = at
            if m.re is SUSPEND:
                suspends.append(took)
                if m.group(4) is not None:
                    lags.append(int(m.group(4)))
                if m.group(5) is not None:
                    wakes.append(int(m.group(5)))
                suspended_since.setdefault(pid, at)
                continue
            resumes.append(took)
            since = suspended_since.pop(pid, None)
            if since is not None:
                held.append(round((at - since) * 1e6))
                suspended_us[pid] = suspended_us.get(pid, 0) + held[-1]
    shares = {pid: us / ((last[pid] - first[pid]) * 1e6) for pid, us in suspended_us.items()
              if last[pid] > first[pid]}
    return {"suspend call": suspends, "suspend lag after the activation": lags,
            "  of which until the daemon woke": wakes, "resume call": resumes,
            "suspended for (suspend to resume)": held}, shares


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("trace")
    args = ap.parse_args(argv)
    try:
        series, shares = read(args.trace)
    except (OSError, EOFError, UnicodeDecodeError) as e:
        sys.exit(f"daemon_trace_summary: cannot read {args.trace}: {e}")
    if not any(series.values()):
        sys.exit(f"daemon_trace_summary: {args.trace} has no suspend or resume lines")
    for name, values in series.items():
        if not values:
            print(f"{name:34s} none")
            continue
        ordered = sorted(values)
        ranks = "".join(f"  p{round(p * 100)} {percentile(ordered, p):6d}" for p in (0.5, 0.9, 0.99))
        print(f"{name:34s} n={len(ordered):5d}{ranks}  max {ordered[-1]:6d} us")
    if shares:
        print("suspended share of its traced span " + ", ".join(f"pid {pid} {share:.3f}" for pid, share in
                                                                 sorted(shares.items())))


if __name__ == "__main__":
    main()
