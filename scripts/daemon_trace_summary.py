#!/usr/bin/env python3
"""Summarise an `xsched-lv3 daemon --trace FILE` (or BENCH_DAEMON_TRACE) file: how long SUSPEND_QUEUES
and RESUME_QUEUES calls took, and how long after the activation it serves each suspend started (the
daemon's lag), and of that how long until its loop woke (traces since a91574c). Percentiles in
microseconds.

    python scripts/daemon_trace_summary.py /tmp/daemon.trace
    python scripts/daemon_trace_summary.py results/diagnostics/trace_mi308x_16cpu_c0ef027.txt.gz
"""
import argparse
import gzip
import re
import sys

from benchlib import percentile  # (next to this script) the benchmarks' one rank rule

SUSPEND = re.compile(r"suspend pid \d+ took (\d+) us(?: (\d+) us after the activation(?: \(woken after (\d+) us\))?)?")
RESUME = re.compile(r"resume pid \d+ took (\d+) us")


def read(path):
    opener = gzip.open if path.endswith(".gz") else open
    suspends, lags, wakes, resumes = [], [], [], []
    with opener(path, "rt") as f:
        for line in f:
            m = SUSPEND.search(line)
            if m:
                suspends.append(int(m.group(1)))
                if m.group(2) is not None:
                    lags.append(int(m.group(2)))
                if m.group(3) is not None:
                    wakes.append(int(m.group(3)))
                continue
            m = RESUME.search(line)
            if m:
                resumes.append(int(m.group(1)))
    return {"suspend call": suspends, "suspend lag after the activation": lags,
            "  of which until the daemon woke": wakes, "resume call": resumes}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("trace")
    args = ap.parse_args(argv)
    try:
        series = read(args.trace)
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


if __name__ == "__main__":
    main()
