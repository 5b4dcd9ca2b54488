#!/usr/bin/env python3
"""Why a service launches slower under the scheduler: the service (scripts/workloads/serve.py, its own
process, 20 requests a second) next to companions that each keep one suspect and drop the others.
Each variant is a separate run of the real programs, in alternating order over the rounds:

  alone         serve.py by itself
  run           serve.py under `xsched-lv3 run --priority 10`, nobody else on the board (free)
  run-idle      ... next to an idle lower client (`xsched-lv3 run` of a process that imported torch
                and sleeps): the service tracks its requests (marks itself active and idle, a watcher
                thread), nobody is held
  run-idle-cpu  ... next to an idle lower client that never touched the GPU (imported torch, no
                CUDA context): the tracking without a second context on the GPU
  run-idle-strict  run-idle with the service at --latency-slack 0 (strict priority: every request
                protected, so no exposure and no guard thread)
  idle          serve.py next to the idle process of run-idle, neither under the scheduler: a
                second process's (idle) context on the GPU, nothing else
  burn          serve.py by itself next to a process spinning on a CPU (no GPU): the host's
                power states and clocks as a busy neighbour leaves them
  run-tiny      the service under run next to a lower client under run that launches a tiny kernel
                after another (a launch-bound job with next to no GPU work): it is held through each
                request (its gate spins, then polls), and its GPU time does not delay the service
  tiny          the same two programs without the scheduler (the companion never held)
  native, xsched  next to a real batch job (scripts/workloads/batch.py, --lp, ResNet-50 b64 by
                default), without the scheduler and with both under `xsched-lv3 run` (defaults):
                the two variants of scripts/bench_two_models.py, for reference in the same run

With --baseline CHECKOUT each variant under the scheduler is also run with that tree's xsched_lv3
(VARIANT-baseline, right after it): an A/B of two schedulers on one host.

Per variant: the service's latency, its launching (the call until its last launch returned: its CPU)
and its GPU wait, P50 / P90 / P99 in ms, as scripts/latency_split.py splits them. A diagnostic.

    python scripts/probes/service_launching.py --rounds 2 --out FILE
    python scripts/probes/service_launching.py --table FILES      # the docs' table
"""
import argparse
import json
import os
import re
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "scripts")]
from benchlib import PY, percentile, provenance, run_together, write_results, xsched_run  # noqa: E402
from bench_two_models import summarize  # noqa: E402  (serve.py's output as a results row)
from latency_split import parts  # noqa: E402  (a request's latency in its three parts)

VARIANTS = ("alone", "run", "run-idle", "run-idle-cpu", "run-idle-strict", "idle", "burn", "run-tiny", "tiny",
            "native", "xsched")
COMPANION_OF = {"run-idle": "idle", "run-idle-cpu": "idle-cpu", "run-idle-strict": "idle", "idle": "idle",
                "burn": "burn", "run-tiny": "tiny", "tiny": "tiny"}
WORK = REPO / "scripts" / "workloads"

# Companions: each says READY, waits for the common start (models.wait_for_start's protocol), runs
# for SECONDS, and prints one JSON line.
COMPANIONS = {
    "idle": """
        import sys, time
        sys.path.insert(0, {work!r})
        import torch
        torch.zeros(1, device="cuda")
        from models import wait_for_start
        start = wait_for_start()
        time.sleep(max(0.0, start + {seconds} - time.monotonic()))
        print("{{}}")
    """,
    "idle-cpu": """
        import sys, time
        sys.path.insert(0, {work!r})
        import torch
        from models import wait_for_start
        start = wait_for_start()
        time.sleep(max(0.0, start + {seconds} - time.monotonic()))
        print("{{}}")
    """,
    "burn": """
        import sys, time
        sys.path.insert(0, {work!r})
        from models import wait_for_start
        start = wait_for_start()
        n = 0
        while time.monotonic() < start + {seconds}:
            n += 1
        print('{{"loops": %d}}' % n)
    """,
    "tiny": """
        import sys, time
        sys.path.insert(0, {work!r})
        import torch
        relu, x = torch.nn.ReLU(), torch.zeros(16, device="cuda")
        stream = torch.cuda.current_stream()
        for _ in range(100):
            relu(x)
        stream.synchronize()
        from models import wait_for_start
        start = wait_for_start()
        n = 0
        while time.monotonic() < start + {seconds}:
            relu(x)
            n += 1
            if n % 32 == 0:
                stream.synchronize()
        stream.synchronize()
        print('{{"calls": %d}}' % n)
    """,
}


def commands(variant, model, batch, seconds, lp):
    serve = [PY, str(WORK / "serve.py"), "--model", model, "--batch", str(batch), "--seconds", str(seconds)]
    slack = 0 if variant.endswith("-strict") else None
    cmds = [xsched_run(serve, priority=10, latency_slack=slack) if scheduled(variant) else serve]
    companion = COMPANION_OF.get(variant)
    if companion:
        other = [PY, "-c", textwrap.dedent(COMPANIONS[companion]).format(work=str(WORK), seconds=seconds)]
    elif variant in ("native", "xsched"):
        lp_model, lp_batch = lp.split(":")
        other = [PY, str(WORK / "batch.py"), "--model", lp_model, "--batch", lp_batch, "--seconds", str(seconds)]
    else:
        return cmds
    return cmds + [xsched_run(other) if scheduled(variant) else other]


def scheduled(variant):
    return variant.startswith("run") or variant == "xsched"


def split(out):
    """P50 / P90 / P99 (ms) of the service's latency, launching and GPU wait."""
    row = summarize(out)
    requests = parts(row)
    summary = {"requests": len(requests)}
    for i, name in enumerate(("latency", "launching", "gpu_wait")):
        ordered = sorted(r[i] for r in requests)
        summary[name] = [round(percentile(ordered, q), 3) for q in (0.5, 0.9, 0.99)]
    summary["wake_late_p50"] = round(row["hp_wake_late_p50_ms"], 3)
    return summary


def table(paths):
    """One row per file, round and variant: the three parts' P50 / P90 / P99 (ms)."""
    lines = ["| run | round | variant | latency P50 / P90 / P99 (ms) | launching | GPU wait |",
             "|---|---|---|---|---|---|"]
    cards, fewest = set(), None
    for path in paths:
        doc = json.loads(Path(path).read_text())
        cards.add(f"{doc.get('card')}, {doc.get('cpu_count')} CPUs")
        for row in doc["rows"]:
            cells = " | ".join(" / ".join(f"{x:.2f}" for x in row[k]) for k in ("latency", "launching", "gpu_wait"))
            lines.append(f"| {Path(path).stem} | {row['round']} | {row['variant']} | {cells} |")
            fewest = row["requests"] if fewest is None else min(fewest, row["requests"])
    lines += ["", f"{len(paths)} results files ({'; '.join(sorted(cards))}); {fewest} requests a row at least."]
    return "\n".join(lines)


def main():
    if sys.argv[1:2] == ["--table"]:
        print(table(sys.argv[2:]))
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet18")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seconds", type=float, default=26.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--lp", default="resnet50:64", metavar="MODEL:BATCH", help="the batch job of native and xsched")
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--baseline", metavar="CHECKOUT", help="also run the scheduled variants with this tree's scheduler")
    p.add_argument("--out")
    args = p.parse_args()
    if args.rounds < 1 or args.seconds <= 2 or args.batch < 1 or not re.fullmatch(r"\w+:[1-9]\d*", args.lp):
        p.error("--rounds must be >= 1, --seconds > 2, --batch >= 1, --lp MODEL:BATCH")
    doc = {"probe": "the service's launching next to companions", **provenance(), "model": args.model,
           "batch": args.batch, "lp": args.lp, "baseline": args.baseline,
           "baseline_revision": os.environ.get("BENCH_BASELINE_REVISION") if args.baseline else None,
           "seconds": args.seconds, "rows": []}
    for r in range(args.rounds):
        runs = [(v, tree) for v in args.variants
                for tree in [REPO] + ([Path(args.baseline)] if args.baseline and scheduled(v) else [])]
        if r % 2:
            runs.reverse()
        for variant, tree in runs:
            cmds = commands(variant, args.model, args.batch, args.seconds, args.lp)
            outs = run_together(cmds, timeout_s=args.seconds + 120, checkout=tree)
            if tree != REPO:
                variant += "-baseline"
            row = {"round": r + 1, "variant": variant, **split(outs[0]),
                   "companion": outs[1] if len(outs) > 1 else None, "service_gate": outs[0].get("gate")}
            doc["rows"].append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("service_gate",)}), flush=True)
            if args.out:
                write_results(args.out, doc)


if __name__ == "__main__":
    main()
