#!/usr/bin/env python3
"""The latency protection's verdicts on synthetic services, offline: how many requests each rule
exposes (lower clients run on) and what that does to the service's P99, against the same requests
with nothing exposed.

A service's request latencies are drawn from a log-normal with spread `sigma` (a 15 % spread is about
a P99 1.4x its median: a text generation on an H200 had 80 and 110 ms). An exposed request is slowed
as a scenario says: multiplied by `h` (a lower client that slows every request), slowed only in its
body but not its tail, hit by host pauses that hit protected ones too, harmful from halfway, slowed
now and then, or harmful once the service got faster. A rule is `xsched_lv3/protection.py` of this
tree, or of another checkout (`--baseline DIR`): both are run on the very same draws.

    python scripts/protection_montecarlo.py                      # this tree's rule, 40 runs a scenario
    python scripts/protection_montecarlo.py --baseline ../old --out results/diagnostics/x.json

What a rule should do: expose nearly every request where lower clients change nothing (h = 1; the
ceiling is about 0.76: 64 warm-up and baseline requests, then one in REFRESH_EVERY protected), and keep
the P99 within the slack (1.10x) where they do.
"""
import argparse
import importlib.util
import math
import os
import random
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchlib import provenance, write_results  # noqa: E402  (next to this script)


def load_rule(checkout):
    """protection.py of a checkout, loaded on its own (it imports nothing of the package)."""
    path = os.path.join(checkout, "xsched_lv3", "protection.py")
    spec = importlib.util.spec_from_file_location(f"protection_{abs(hash(checkout))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Protection


def slowed(sigma, h):
    return lambda rng, i, n, exposed: math.exp(rng.gauss(0, sigma)) * (h if exposed else 1.0)


def body_only(sigma, extra):
    """Exposed requests `extra` (of the median) slower, but not the slowest fifth: the service's own
    slow requests (host, not GPU) are as slow either way (a ResNet-18 next to a batch job on an H100)."""
    def draw(rng, i, n, exposed):
        z = rng.gauss(0, sigma)
        return math.exp(z) + (extra if exposed and z < 0.84 * sigma else 0.0)
    return draw


def with_pauses(sigma, h, rate=0.01, pause=5.0):
    def draw(rng, i, n, exposed):
        x = math.exp(rng.gauss(0, sigma)) * (h if exposed else 1.0)
        return x * pause if rng.random() < rate else x
    return draw


def harmful_from_halfway(sigma, h):
    return lambda rng, i, n, exposed: math.exp(rng.gauss(0, sigma)) * (h if exposed and i > n // 2 else 1.0)


def faster_then_harmful(sigma, h):
    """The service gets twice as fast a third of the way in, and from then on the lower client slows
    it by `h`: judged on the rest of the run (a baseline taken before the change is too loose)."""
    def draw(rng, i, n, exposed):
        later = i >= n // 3
        return math.exp(rng.gauss(0, sigma)) * (0.5 if later else 1.0) * (h if exposed and later else 1.0)
    draw.judged_from = 1 / 3
    return draw


def now_and_then(sigma, p, h):
    return lambda rng, i, n, exposed: math.exp(rng.gauss(0, sigma)) * (h if exposed and rng.random() < p else 1.0)


SCENARIOS = {
    **{f"slowed x{h} spread {s}": slowed(s, h) for s in (0.05, 0.15, 0.3) for h in (1.0, 1.05, 1.1, 1.2, 1.5, 3.0)},
    **{f"body +0.3 spread {s}": body_only(s, 0.3) for s in (0.1, 0.2)},
    **{f"pauses, slowed x{h}": with_pauses(0.1, h) for h in (1.0, 1.5)},
    **{f"harmful x{h} from halfway": harmful_from_halfway(0.1, h) for h in (1.5, 3.0)},
    **{f"x2 for {p:.0%} of requests": now_and_then(0.1, p, 2.0) for p in (0.02, 0.1)},
    "2x faster at 1/3, then x1.5": faster_then_harmful(0.1, 1.5),
}


def p99(values):
    return sorted(values)[int(0.99 * len(values)) - 1]


def run(rule, draw, requests, seed):
    """One service run: (share of requests exposed, its P99 / the P99 of the same draws unexposed)."""
    protection = rule(0.10)
    served, unexposed, exposed = [], [], 0
    for i in range(requests):
        protected = protection.protect_next()
        latency = draw(random.Random(seed * 1_000_003 + i), i, requests, not protected)
        unexposed.append(draw(random.Random(seed * 1_000_003 + i), i, requests, False))
        protection.finished(protected, latency)
        served.append(latency)
        exposed += not protected
    start = int(getattr(draw, "judged_from", 0) * requests)
    return exposed / requests, p99(served[start:]) / p99(unexposed[start:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", metavar="CHECKOUT", help="another tree whose rule runs on the same draws")
    ap.add_argument("--runs", type=int, default=40, help="runs per scenario (seeds 0..N-1)")
    ap.add_argument("--requests", type=int, default=500, help="requests a run (a benchmark run has 501)")
    ap.add_argument("--out", help="write the results here (JSON)")
    args = ap.parse_args()
    if args.runs < 1 or args.requests < 100:
        ap.error("--runs must be >= 1 and --requests >= 100")
    rules = {"this tree": load_rule(os.path.dirname(HERE))}
    if args.baseline:
        if not os.path.isfile(os.path.join(args.baseline, "xsched_lv3", "protection.py")):
            ap.error(f"--baseline {args.baseline}: no xsched_lv3/protection.py there")
        rules["baseline"] = load_rule(os.path.abspath(args.baseline))
    rows = []
    print(f"{'scenario':28s}" + "".join(f"{name + ': exposed, P99 x (median / 90th pct)':>46s}" for name in rules))
    for name, draw in SCENARIOS.items():
        row, cells = {"scenario": name}, []
        for rule_name, rule in rules.items():
            results = [run(rule, draw, args.requests, seed) for seed in range(args.runs)]
            ratios = sorted(r[1] for r in results)
            row[rule_name] = {"exposed": statistics.mean(r[0] for r in results),
                              "p99_ratio_median": statistics.median(ratios),
                              "p99_ratio_p90": ratios[int(0.9 * (len(ratios) - 1))]}
            cells.append("{exposed:.2f}, {p99_ratio_median:.2f}x / {p99_ratio_p90:.2f}x".format(**row[rule_name]))
        rows.append(row)
        print(f"{name:28s}" + "".join(f"{c:>46s}" for c in cells))
    if args.out:
        write_results(args.out, {**provenance(), "runs": args.runs, "requests": args.requests,
                                 "baseline": args.baseline, "rows": rows})


if __name__ == "__main__":
    main()
