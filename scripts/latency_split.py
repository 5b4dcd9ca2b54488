#!/usr/bin/env python3
"""Where a service's latency goes, from bench_two_models.py's results (runs that recorded every
request's wait for the GPU, serve.py's `hp_gpu_wait_s`). Each request's latency is three parts:

  late start   its call began after its arrival (benchlib.open_loop's wake_late)
  launching    the call until its last launch returned: the service's own CPU
  GPU wait     the last launch to the result on the CPU: the GPU work the launching did not hide,
               its own and whatever another program had queued ahead of it or slipped in beside it

Under the scheduler the requests are split by what the service's latency protection did with each
(its gate's timeline, aligned to the service's requests by their latencies: the split is left out
where they do not agree): *protected* (lower clients held) and *exposed* (let run).

    python scripts/latency_split.py --table results/bench_two_models_processes_encb1-vitb32_h100_r1[4-7].json
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import percentile  # noqa: E402

PROTECTED = set("WPQR")         # protection.PHASES: the letters of the protected requests
ALIGNED_MS = 0.5                # a gate's busy period and the service's request agree this closely ...
ALIGNED_SHARE = 0.9             # ... for this share of the requests, or the split is not made


def parts(row):
    """Per request: (latency, launching, GPU wait) in ms, or None where the row lacks the GPU wait."""
    if "hp_gpu_wait_ms" not in row:
        return None
    return [(lat, lat - late - wait, wait)
            for lat, late, wait in zip(row["hp_latencies_ms"], row["hp_wake_late_ms"], row["hp_gpu_wait_ms"])]


def phases(row):
    """The protection's letter for each counted request, or None where the gate's timeline does not
    line up with them (busy periods merged among the counted requests, or a report without one)."""
    gate = row.get("hp_gate") or {}
    letters, latencies = gate.get("timeline", ""), gate.get("timeline_ms", [])
    n = len(row["hp_latencies_ms"])
    if len(letters) < n or len(latencies) < n:
        return None
    own = [lat - late for lat, late in zip(row["hp_latencies_ms"], row["hp_wake_late_ms"])]
    agree = sum(abs(a - b) <= ALIGNED_MS for a, b in zip(latencies[-n:], own))
    return letters[-n:] if agree >= ALIGNED_SHARE * n else None


def groups(row):
    """(name, requests' parts) for a results row: the variant, and under the scheduler its protected
    and exposed requests where the timeline lines up."""
    split = parts(row)
    if split is None:
        return []
    out = [(row["variant"], split)]
    letters = phases(row) if row["variant"].startswith("xsched") else None
    if letters is not None:
        for name, wanted in (("protected", True), ("exposed", False)):
            chosen = [p for p, letter in zip(split, letters) if (letter in PROTECTED) == wanted]
            if chosen:
                out.append((f"{row['variant']}, {name}", chosen))
    return out


def stats(requests):
    """P50 / P99 of each part, in ms."""
    out = {}
    for i, name in enumerate(("latency", "launching", "gpu_wait")):
        ordered = sorted(r[i] for r in requests)
        out[name] = (percentile(ordered, 0.5), percentile(ordered, 0.99))
    return out


def table(paths):
    lines = ["| run | requests | n | latency P50 / P99 (ms) | launching P50 / P99 | GPU wait P50 / P99 |",
             "|---|---|---|---|---|---|"]
    revisions, cards, cpus = set(), set(), set()
    for path in paths:
        doc = json.loads(Path(path).read_text())
        revisions.add(doc["git_revision"][:7])
        cards.add(doc["card"])
        cpus.add(str(doc["cpu_count"]))
        for row in doc["rows"]:
            if row["variant"] not in ("hp-alone", "native", "xsched"):
                continue
            for name, requests in groups(row):
                s = stats(requests)
                cells = " | ".join(f"{s[k][0]:.2f} / {s[k][1]:.2f}" for k in ("latency", "launching", "gpu_wait"))
                lines.append(f"| {Path(path).stem.removeprefix('bench_two_models_')}, {row['pair']} | {name} | "
                             f"{len(requests)} | {cells} |")
    lines.append("")
    lines.append(f"{len(paths)} results files ({', '.join(sorted(cards))}; revisions {', '.join(sorted(revisions))}; "
                 f"{', '.join(sorted(cpus))} CPUs). Launching = latency - late start - GPU wait.")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--table", nargs="+", required=True, metavar="RESULTS", help="bench_two_models.py results files")
    args = p.parse_args()
    try:
        print(table(args.table), end="")
    except (OSError, ValueError, KeyError) as e:
        p.error(f"cannot read the results: {e}")


if __name__ == "__main__":
    main()
