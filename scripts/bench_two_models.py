#!/usr/bin/env python3
"""Two models on one GPU, as a user runs them: a latency-critical service next to a batch job.

Every job is an ordinary PyTorch program (scripts/workloads/serve.py, batch.py) with no scheduler
imports. Variants, all measured in one run on one GPU:

  hp-alone, lp-alone      each program by itself
  hp-lp-between           the service alone, its own process running the batch job's iterations
                          between its requests, each ended before the next arrival: what perfect
                          preemption of the batch job would give it (caches and clocks as the job
                          leaves them, none of its work in the way): a bound for every scheduler
  lp-alone-xsched         the batch job alone under `xsched-lv3 run` (default options): its overhead
  native                  both programs at once, no scheduler (left out with --no-native)
  xsched                  `xsched-lv3 run --priority 10 -- python serve.py ...` next to
                          `xsched-lv3 run -- python batch.py ...`: default options everywhere
  native-threads          both jobs as two threads of one process (pair_threads.py), plain streams
  xsched-threads          the same, each thread bound with `xt.client(priority=...)`, defaults
  native-threads-prio, xsched-threads-prio  with --stream-priority: the same with the service thread's
                          stream at the device's highest priority, the batch thread's at the default
  xsched[-threads]-baseline  with --baseline CHECKOUT: the xsched variant with that tree's scheduler
  xsched[-threads]-strict with --strict: the service at --latency-slack 0 (strict priority: lower
                          clients held for every request), to show what holding only while they
                          endanger it changes

The service takes open-loop requests (latency from scheduled arrival to result); the batch job runs
back to back. Alone baselines are re-measured in every run, interleaved A/B with the scheduled LP
alone, and every ratio is against the same run's baselines.

    python scripts/bench_two_models.py --modes processes --rep 1      # one repetition, ~6 min on an H200
    python scripts/bench_two_models.py --table results/bench_two_models_*.json   # the README table
    python scripts/bench_two_models.py --pairs r18b4-r50b64 --baseline /abs/old --no-native   # scheduler A/B

Results: results/bench_two_models_<modes>_r<rep>.json (git revision, dirty flag, command, card,
CPU count in each). Diagnostics: with BENCH_GC_LOG=1 in the environment each program also reports its
interpreter's garbage collections of 1 ms or more (`gc_pauses`, `hp_gc_pauses`, `lp_gc_pauses`: seconds
from the common start, negative while it built and warmed its models, generation, ms; threads mode: the one
process's). Results at 906480d-d768f91 have the setup's collections in threads mode only.
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORK = REPO / "scripts" / "workloads"
sys.path.insert(0, str(REPO / "scripts"))
from benchlib import git_revision_of, latency_summary, provenance, run_together, write_results, xsched_run  # noqa: E402

PAIRS = {                       # name: (HP model, batch[, service]), (LP model, batch[, "train"])
    "r18b4-r50b16": (("resnet18", 4), ("resnet50", 16)),
    "r18b4-r50b64": (("resnet18", 4), ("resnet50", 64)),
    "encb1-vitb32": (("encoder", 1), ("vit_b_16", 32)),
    # a pair no round before 97d7fa9 measured, the scheduler untuned to it: a CNN service at batch 1
    # next to a transformer batch job
    "r50b1-vitb32": (("resnet50", 1), ("vit_b_16", 32)),
    # two more pairs nothing was tuned to, first measured at c2b715b's scheduler: a transformer service
    # at batch 1 next to a deep CNN batch job, and a CNN service next to a ConvNeXt (depthwise
    # convolutions, LayerNorm, GELU: another kernel mix)
    "vitb1-r152b32": (("vit_b_16", 1), ("resnet152", 32)),
    "r18b4-convnextb64": (("resnet18", 4), ("convnext_tiny", 64)),
    "r18b4-r50b256": (("resnet18", 4), ("resnet50", 256)),     # four times b64's work a kernel
    "r18b4-r50b32train": (("resnet18", 4), ("resnet50", 32, "train")),   # training steps: backward and SGD too
    # Hugging Face's GPT-2 small (transformers installed; random weights), 256 tokens a sequence
    "encb1-gpt2b16": (("encoder", 1), ("gpt2", 16)),
    "r18b4-gpt2b8train": (("resnet18", 4), ("gpt2", 8, "train")),
    # an LLM service: a request generates 8 tokens (8 model calls, each token to the CPU as it comes)
    "gpt2gen8-r50b64": (("gpt2", 1, "gen8"), ("resnet50", 64)),
}
# A service's requests (serve.py's options) and their rate; a forward pass at 20 a second by default
SERVICES = {"gen8": (["--decode-tokens", "8"], 5.0)}
DEFAULT_RATE = 20.0
REQUESTS = 500                  # after 1 s of warm-up: P99 = the 496th smallest latency
ISSUE_PAIRS = ["r18b4-r50b16", "r18b4-r50b64", "encb1-vitb32"]   # the default: the README's main tables
PY = sys.executable


def commands(variant, pair, seconds, window_us=None):
    if variant.endswith("-baseline"):            # the same programs under another tree's scheduler, defaults
        return commands(variant.removesuffix("-baseline"), pair, seconds)
    (hp_model, hp_batch, *_), (lp_model, lp_batch, *lp_mode) = PAIRS[pair]
    assert lp_mode in ([], ["train"]), pair
    train = bool(lp_mode)
    lp_job = f"{lp_model}:{lp_batch}" + ":train" * train          # MODEL:BATCH[:train], as the workloads take it
    service_args = service_options(pair)
    hp = [PY, str(WORK / "serve.py"), "--model", hp_model, "--batch", str(hp_batch), "--seconds", str(seconds)] + \
        service_args
    lp = [PY, str(WORK / "batch.py"), "--model", lp_model, "--batch", str(lp_batch), "--seconds", str(seconds)] + \
        ["--train"] * train
    threads = [PY, str(WORK / "pair_threads.py"), "--hp", f"{hp_model}:{hp_batch}",
               "--lp", lp_job, "--seconds", str(seconds)] + service_args
    return {
        "hp-alone": [hp],
        "hp-lp-between": [hp + ["--between-requests", lp_job]],
        "lp-alone": [lp],
        "lp-alone-xsched": [xsched_run(lp, window_us=window_us)],
        "native": [hp, lp],
        "xsched": [xsched_run(hp, priority=10), xsched_run(lp, window_us=window_us)],
        "xsched-strict": [xsched_run(hp, priority=10, latency_slack=0), xsched_run(lp, window_us=window_us)],
        "native-threads": [threads],
        "xsched-threads": [threads + ["--scheduled"]],
        "xsched-threads-strict": [threads + ["--scheduled", "--latency-slack", "0"]],
        "native-threads-prio": [threads + ["--hp-stream-priority"]],
        "xsched-threads-prio": [threads + ["--scheduled", "--hp-stream-priority"]],
    }[variant]


def service(pair):
    """(serve.py's options for the pair's requests, their rate per second)."""
    _model, _batch, *name = PAIRS[pair][0]
    return SERVICES[name[0]] if name else ([], DEFAULT_RATE)


def rate(pair):
    return service(pair)[1]


def service_options(pair):
    """serve.py's (and pair_threads.py's) options for the pair's service: its requests, its rate."""
    options, per_s = service(pair)
    return options + ["--rate", f"{per_s:g}"]


def co_run_seconds(args, pair):
    """--seconds, or long enough for REQUESTS requests at the pair's rate after 1 s of warm-up."""
    return args.seconds if args.seconds is not None else 1.0 + REQUESTS / rate(pair)


def merged(outputs):
    """One dict from the programs' outputs; the scheduler's reports as hp_gate, lp_gate (only_gate
    for a single program)."""
    roles = ("hp", "lp") if len(outputs) == 2 else ("only",)
    out = {}
    for role, o in zip(roles, outputs):
        gate = o.pop("gate", None)
        out.update(o)
        if gate is not None:
            out[f"{role}_gate"] = gate
    return out


def summarize(raw):
    out = {}
    if "hp_latencies_s" in raw:
        out.update(latency_summary(raw["hp_latencies_s"]), hp_requests=len(raw["hp_latencies_s"]))
        # every request, in arrival order (ms, to the µs): where a tail is, and whether it was a late start
        out["hp_latencies_ms"] = [round(s * 1e3, 3) for s in raw["hp_latencies_s"]]
    for part in ("wake_late", "gpu_wait"):          # how late each began; its wait for the GPU after launching
        if f"hp_{part}_s" in raw:
            out.update(latency_summary(raw[f"hp_{part}_s"], prefix=f"hp_{part}"))
            out[f"hp_{part}_ms"] = [round(s * 1e3, 3) for s in raw[f"hp_{part}_s"]]
    if "lp_iters_per_s" in raw:
        out["lp_iters_per_s"] = raw["lp_iters_per_s"]
    out.update({k: v for k, v in raw.items() if k.startswith("gap_") or k.endswith("gc_pauses")})
    out.update({k: v for k, v in raw.items() if k.endswith("_gate")})
    return out


def _brief(record):
    """A row for the log: its numbers, without the per-request series (they are in the results file)."""
    return {k: _brief(v) if isinstance(v, dict) else round(v, 3) if isinstance(v, float) else v
            for k, v in record.items() if not isinstance(v, (list, str)) or k in ("pair", "variant")}


def measure(args, doc):
    def run(variant, pair, seconds):
        t = time.monotonic()
        checkout = args.baseline if variant.endswith("-baseline") else REPO
        r = summarize(merged(run_together(commands(variant, pair, seconds, args.window_us), seconds + 180, checkout)))
        row = {"pair": pair, "variant": variant, "wall_s": round(time.monotonic() - t, 1), **r}
        doc["rows"].append(row)
        print(json.dumps(_brief(row)), flush=True)
        return r

    hp_alone = {}
    for pair in args.pairs:
        hp = PAIRS[pair][0]
        seconds = co_run_seconds(args, pair)
        if hp not in hp_alone:
            hp_alone[hp] = run("hp-alone", pair, seconds)
        if not args.no_between:
            run("hp-lp-between", pair, seconds)
        for _ in range(args.overhead_reps):                   # A/B interleaved: the host drifts
            run("lp-alone", pair, args.alone_seconds)
            if "processes" in args.modes:
                run("lp-alone-xsched", pair, args.alone_seconds)
                if args.baseline:
                    run("lp-alone-xsched-baseline", pair, args.alone_seconds)
        for mode in args.modes:
            for variant in co_run_variants(mode, args):
                run(variant, pair, seconds)


def baseline_provenance(checkout):
    """What a results file records of the --baseline tree: its path and commit (git's, else
    BENCH_BASELINE_REVISION, as for a `git archive` copied to the device machine, else "unknown")."""
    return {"checkout": str(Path(checkout).resolve()),
            "git_revision": git_revision_of(checkout) or os.environ.get("BENCH_BASELINE_REVISION", "unknown")}


def co_run_variants(mode, args):
    """The co-runs of one mode, in the order they run."""
    scheduled = "xsched" if mode == "processes" else "xsched-threads"
    variants = [] if args.no_native else ["native" if mode == "processes" else "native-threads"]
    if args.baseline:
        variants.append(scheduled + "-baseline")           # interleaved: native, baseline, this tree
    variants.append(scheduled)
    if args.strict:
        variants.append(scheduled + "-strict")
    if args.stream_priority and mode == "threads":
        variants += ([] if args.no_native else ["native-threads-prio"]) + ["xsched-threads-prio"]
    return variants


def ratios(doc):
    """Per (pair, variant): HP P99 over HP alone, LP throughput over LP alone (medians of the run's
    alone rows for that pair), as in the README."""
    rows = doc["rows"]
    out = {}
    for pair in dict.fromkeys(r["pair"] for r in rows):
        hp = PAIRS[pair][0]
        hp_alone = [r["hp_p99_ms"] for r in rows if r["variant"] == "hp-alone" and PAIRS[r["pair"]][0] == hp]
        lp_alone = [r["lp_iters_per_s"] for r in rows if r["variant"] == "lp-alone" and r["pair"] == pair]
        for r in rows:
            if r["pair"] != pair or r["variant"] in ("hp-alone", "lp-alone"):
                continue
            got = out.setdefault((pair, r["variant"]), {})
            if "hp_p99_ms" in r and hp_alone:
                got["hp_p99_vs_alone"] = r["hp_p99_ms"] / statistics.median(hp_alone)
            if "lp_iters_per_s" in r and lp_alone:
                got.setdefault("lp_vs_alone_all", []).append(r["lp_iters_per_s"] / statistics.median(lp_alone))
                got["lp_vs_alone"] = statistics.median(got["lp_vs_alone_all"])
    return out


def table(paths, only=None):
    """The README table: median (min–max) over the repetitions in `paths`; `only`: these variants'
    rows (and hp-alone's), where the files hold others a table must not merge (another tree's)."""
    docs = [json.loads(Path(p).read_text()) for p in paths]
    per = {}
    for doc in docs:
        for key, r in ratios(doc).items():
            for metric, value in r.items():
                if metric != "lp_vs_alone_all":
                    per.setdefault(key, {}).setdefault(metric, []).append(value)
        for row in doc["rows"]:                 # absolute HP latencies: how jittery the host itself is
            if row.get("hp_p99_ms") is not None:
                per.setdefault((row["pair"], row["variant"]), {}).setdefault("hp_ms", []).append(
                    (row["hp_p50_ms"], row["hp_p99_ms"]))
    cards = sorted({d["card"] for d in docs})

    def cell(values, fmt):
        if not values:
            return "–"
        return f"{fmt(statistics.median(values))} ({fmt(min(values))}–{fmt(max(values))})"
    x, f2 = (lambda v: f"{v:.2f}x"), (lambda v: f"{v:.2f}")
    lines = ["| pair (HP / LP) | variant | runs | HP P50 / P99 (ms) | HP P99 vs alone | LP vs alone |",
             "|---|---|---|---|---|---|"]
    names = {"r18b4-r50b16": "ResNet-18 b4 / ResNet-50 b16", "r18b4-r50b64": "ResNet-18 b4 / ResNet-50 b64",
             "encb1-vitb32": "Transformer encoder b1 / ViT-B/16 b32",
             "r50b1-vitb32": "ResNet-50 b1 / ViT-B/16 b32", "r18b4-r50b256": "ResNet-18 b4 / ResNet-50 b256",
             "vitb1-r152b32": "ViT-B/16 b1 / ResNet-152 b32", "r18b4-convnextb64": "ResNet-18 b4 / ConvNeXt-T b64",
             "r18b4-r50b32train": "ResNet-18 b4 / ResNet-50 b32 training",
             "encb1-gpt2b16": "Transformer encoder b1 / GPT-2 b16", "r18b4-gpt2b8train": "ResNet-18 b4 / GPT-2 b8 training",
             "gpt2gen8-r50b64": "GPT-2 b1, 8 tokens a request, 5/s / ResNet-50 b64"}
    order = ["hp-alone", "hp-lp-between", "lp-alone-xsched", "lp-alone-xsched-baseline", "native", "xsched-baseline", "xsched",
             "xsched-strict", "native-threads", "native-threads-prio", "xsched-threads-baseline", "xsched-threads",
             "xsched-threads-prio", "xsched-threads-strict"]
    if only:
        order = [v for v in order if v == "hp-alone" or v in only]
    for pair in PAIRS:
        for variant in order:
            got = per.get((pair, variant))
            if got:
                runs = max(len(v) for v in got.values())
                ms = got.get("hp_ms", [])
                latency = f"{statistics.median(m[0] for m in ms):.1f} / {statistics.median(m[1] for m in ms):.1f}" \
                    if ms else "–"
                lines.append(f"| {names[pair]} | {variant} | {runs} | {latency} | "
                             f"{cell(got.get('hp_p99_vs_alone', []), x)} | {cell(got.get('lp_vs_alone', []), f2)} |")
    revisions = sorted({d["git_revision"][:7] + ("+dirty" if d["git_dirty"] else "") for d in docs})
    notes = "".join(f"\n{Path(path).name}: {doc['harness_note']}\n" for path, doc in zip(paths, docs)
                    if doc.get("harness_note"))          # rows that are not what their names say
    return "\n".join(lines) + (f"\n\n{', '.join(cards)}, revision {', '.join(revisions)}; median (min–max) of the "
                               f"ratios over the runs; HP P50 / P99: medians over the runs.\n") + \
        stalls_note(docs, names, order) + notes


STALL_FACTOR = 3        # a request this many times the service's P50 alone is counted as a stall


def stalls_note(docs, names, order):
    """Per pair, how many requests of each variant took over STALL_FACTOR x the service's P50 alone (the
    same run's), over the runs that recorded every request: a host that stalls shows in every variant,
    the service alone included, and a ratio of P99s there measures the host."""
    counts = {}
    for doc in docs:
        for pair in dict.fromkeys(r["pair"] for r in doc["rows"]):
            rows = [r for r in doc["rows"] if r["pair"] == pair and "hp_latencies_ms" in r]
            alone = [r["hp_p50_ms"] for r in rows if r["variant"] == "hp-alone"]
            for r in rows if alone else ():
                got = counts.setdefault(pair, {}).setdefault(r["variant"], [0, 0])
                got[0] += sum(ms > STALL_FACTOR * alone[0] for ms in r["hp_latencies_ms"])
                got[1] += len(r["hp_latencies_ms"])
    lines = [f"- {names[pair]}: " + ", ".join(f"{v} {counts[pair][v][0]} of {counts[pair][v][1]}"
                                              for v in order if v in counts[pair])
             for pair in PAIRS if pair in counts]
    if not lines:
        return ""
    return (f"\nRequests over {STALL_FACTOR}x the service's P50 alone (the same run's), over the runs that recorded "
            f"every request:\n" + "\n".join(lines) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--modes", nargs="+", choices=["processes", "threads"], default=["processes", "threads"])
    p.add_argument("--pairs", nargs="+", choices=list(PAIRS), default=ISSUE_PAIRS,
                   help=f"default: {' '.join(ISSUE_PAIRS)}")
    p.add_argument("--seconds", type=float,
                   help=f"per co-run variant (default: {REQUESTS} requests after 1 s at the pair's rate: 26 s at 20/s)")
    p.add_argument("--alone-seconds", type=float, default=10.0, help="per LP-alone variant")
    p.add_argument("--overhead-reps", type=int, default=2, help="A/B pairs of lp-alone / lp-alone-xsched")
    p.add_argument("--window-us", type=float, help="pass --window-us to the LP's xsched-lv3 run (default: none)")
    p.add_argument("--baseline", metavar="CHECKOUT",
                   help="another release's tree: its scheduler also runs the pair (xsched-baseline, "
                        "xsched-threads-baseline) and, in processes mode, the LP alone (A/B/C)")
    p.add_argument("--no-native", action="store_true",
                   help="skip the unscheduled co-run (an A/B of two schedulers with --baseline: a pair's run "
                        "then fits one device call)")
    p.add_argument("--no-between", action="store_true",
                   help="skip hp-lp-between (a long service's run, e.g. gpt2gen8-r50b64's, then fits a 10-minute call)")
    p.add_argument("--strict", action="store_true",
                   help="also run each mode's xsched variant with the service at --latency-slack 0 (strict priority)")
    p.add_argument("--stream-priority", action="store_true",
                   help="threads mode: also native-threads-prio and xsched-threads-prio, the service thread's "
                        "stream at the highest priority")
    p.add_argument("--rep", type=int, default=1)
    p.add_argument("--out", help="results file (default results/bench_two_models_<modes>_r<rep>.json)")
    p.add_argument("--table", nargs="+", metavar="RESULTS", help="print the README table of these results")
    p.add_argument("--only", metavar="VARIANT,...", type=lambda text: text.split(","),
                   help="with --table: only these variants' rows (comma-separated)")
    args = p.parse_args()
    if args.no_native and not (args.baseline or args.strict):
        p.error("--no-native leaves a single co-run: give --baseline CHECKOUT or --strict to compare it with")
    if args.table:
        print(table(args.table, args.only), end="")
        return
    import torch                    # its version only: this process never touches the GPU
    doc = {"benchmark": "two models, one GPU, as users run them", **provenance(), "torch": torch.__version__,
           "hp_rate_per_s": {k: rate(k) for k in args.pairs},
           "seconds": {k: co_run_seconds(args, k) for k in args.pairs},
           "alone_seconds": args.alone_seconds, "window_us": args.window_us, "modes": args.modes,
           "pairs": {k: PAIRS[k] for k in args.pairs}, "rep": args.rep,
           "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
           **({"baseline": baseline_provenance(args.baseline)} if args.baseline else {}), "rows": []}
    print(f"{doc['card']}, {doc['cpu_count']} CPUs, {doc['git_revision']}{' (dirty)' if doc['git_dirty'] else ''}",
          flush=True)
    measure(args, doc)
    doc["ratios"] = {f"{k[0]} {k[1]}": v for k, v in ratios(doc).items()}
    out = Path(args.out or REPO / "results" / f"bench_two_models_{'_'.join(args.modes)}_r{args.rep}.json")
    for key, r in doc["ratios"].items():
        print(key, {k: round(v, 3) for k, v in r.items() if k != "lp_vs_alone_all"})
    write_results(out, doc)


if __name__ == "__main__":
    main()
