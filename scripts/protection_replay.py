#!/usr/bin/env python3
"""Replay a service's recorded latencies through this tree's latency protection: which probes it ran,
the overrun bound each was judged by (and the slowest protected requests it came from), and what ended
each exposure. For two-model results recorded before the gate reported its own timeline (14377d6 to
badb64a: per-request latencies, no `timeline`); later files carry the real phases, which are printed.

    python scripts/protection_replay.py results/bench_two_models_processes_r18b4-r50b16_h100_r12.json

The replay is exact where the service's decisions depended only on its latencies (they do: the
protection sees nothing else) and the recorded latencies are what it saw. Two approximations: a request's
latency here is the benchmark's (scheduled arrival to result), the gate's is its busy period (begin to
GPU done); and the busy periods before the benchmark's first counted request (its 1 s warm-up) are not
recorded, so their number is taken from the gate's report and their latencies don't matter (warm-up
requests are not kept). A replay that ends with the recorded probe and exposed counts is checked.
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from xsched_lv3.protection import Protection  # noqa: E402


def replay(latencies_ms, unrecorded, slack):
    """(probes, exposed, events) for the latencies after `unrecorded` earlier busy periods."""
    protection, events = Protection(slack), []
    filler = statistics.median(latencies_ms)
    for i, ms in enumerate([filler] * unrecorded + latencies_ms):
        probes = protection.probes
        protected = protection.protect_next()
        if protection.probes > probes:                                      # this request begins a probe
            history = sorted(protection.protected)
            events.append(f"request {i - unrecorded}: probe against a bound of {protection.overrun_bound_s() * 1e3:.2f} ms "
                          f"from {len(history)} protected, the slowest {[round(x * 1e3, 1) for x in history[-8:]]}")
        exposing = protection.exposing
        protection.finished(protected, ms / 1e3)
        if protection.exposing != exposing:
            events.append(f"request {i - unrecorded}: {'exposing' if protection.exposing else 'protected again'} "
                          f"(it took {ms:.1f} ms)")
    return protection.probes, protection.exposed_requests, events


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("results", nargs="+", help="bench_two_models results files")
    args = p.parse_args()
    for path in args.results:
        try:
            with open(path) as f:
                doc = json.load(f)
            report(path, doc)
        except (OSError, ValueError) as e:
            sys.exit(f"protection_replay: {path}: {e}")
        except (KeyError, TypeError, AttributeError, IndexError) as e:
            sys.exit(f"protection_replay: {path}: not a bench_two_models results file ({type(e).__name__}: {e})")


def report(path, doc):
    for row in doc.get("rows", []):
        gate = row.get("hp_gate")
        if not gate or "hp_latencies_ms" not in row:
            continue
        print(f"{path}: {row['pair']} {row['variant']}")
        if "timeline" in gate:
            print(f"  recorded timeline from busy period {gate.get('timeline_from', 0)}: {gate['timeline']}")
            continue
        latencies = row["hp_latencies_ms"]
        unrecorded = gate["protected_ms"]["n"] + (gate["exposed_ms"] or {"n": 0})["n"] - len(latencies)
        probes, exposed, events = replay(latencies, max(0, unrecorded), gate["latency_slack"])
        for event in events:
            print("  " + event)
        same = (probes, exposed) == (gate["probes"], gate["exposed_requests"])
        print(f"  replay: {probes} probes, {exposed} exposed; recorded: {gate['probes']}, "
              f"{gate['exposed_requests']}{'' if same else '  (DIFFERENT: the replay does not hold here)'}")


if __name__ == "__main__":
    main()
