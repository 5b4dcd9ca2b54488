#!/usr/bin/env python3
"""The seeds' two-model experiment on one GPU: a latency-critical ResNet-18 (batch 4, open-loop
arrivals at 20 req/s, latency = completion - scheduled arrival, first second discarded) next to
ResNet-50 inference (batch 16 and batch 64, back to back). Variants, all in one run on one GPU:
HP alone, LP alone, native co-run, CUDA/HIP stream priorities, xsched_lv3 (inline gates + HPF).
Both as two threads in one process and as two processes.

    python scripts/bench_two_models.py [--seconds 10] [--modes threads processes]
Results: results/bench_two_models.{json,png}. Ratios within the run are what count.
"""
import argparse
import json
import multiprocessing as mp
import os
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchlib import latency_summary, open_loop  # noqa: E402  (next to this script)
HP_RATE = 20.0
HP_BATCH = 4
WARMUP_S = 1.0


def build(name, batch, device="cuda"):
    import torch
    import torchvision
    model = getattr(torchvision.models, name)(weights=None).to(device).eval()
    x = torch.randn(batch, 3, 224, 224, device=device)
    return model, x


def warmed(name, batch, stream, iterations):
    """build(), then `iterations` untimed forward passes on `stream` (cuDNN autotuning, caches)."""
    import torch
    model, x = build(name, batch)
    with torch.no_grad(), torch.cuda.stream(stream):
        for _ in range(iterations):
            model(x)
        stream.synchronize()
    return model, x


def hp_loop(seconds, stream, start_at, results, gate_ctx=None):
    """Open-loop requests at HP_RATE; latency from each request's scheduled arrival."""
    import torch
    model, x = warmed("resnet18", HP_BATCH, stream, 20)
    ctx = gate_ctx() if gate_ctx else _null()

    def request():
        model(x)
        stream.synchronize()
    with torch.no_grad(), torch.cuda.stream(stream), ctx:
        while time.monotonic() < start_at:
            time.sleep(0.001)
        results["hp_latencies_s"] = open_loop(HP_RATE, seconds, request, WARMUP_S)


def lp_loop(seconds, batch, stream, start_at, results, stop_at=None, gate_ctx=None):
    import torch
    model, x = warmed("resnet50", batch, stream, 10)
    ctx = gate_ctx() if gate_ctx else _null()
    done = 0
    with torch.no_grad(), torch.cuda.stream(stream), ctx as gate:
        while time.monotonic() < start_at:
            time.sleep(0.001)
        t_begin = start_at + WARMUP_S
        t_end = start_at + seconds
        counted_from = None
        while time.monotonic() < t_end:
            model(x)
            stream.synchronize()
            now = time.monotonic()
            if now >= t_begin:
                if counted_from is None:
                    counted_from = now
                else:
                    done += 1
        results["lp_iters_per_s"] = done / (time.monotonic() - counted_from) if counted_from else 0.0
        gate = gate if gate is not None and hasattr(gate, "waits") else _process_gate()
        if gate is not None:
            results["lp_gate_waits"], results["lp_gate_held_s"] = gate.waits, gate.held_s


def _process_gate():
    mod = sys.modules.get("xsched_lv3.pytorch")
    return getattr(mod, "_process_gate", None) if mod else None


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


def streams(variant):
    import torch
    lo, hi = torch.cuda.Stream.priority_range() if hasattr(torch.cuda.Stream, "priority_range") else (0, -1)
    if variant in ("priorities", "xsched"):
        return torch.cuda.Stream(priority=hi), torch.cuda.Stream(priority=lo)
    return torch.cuda.Stream(), torch.cuda.Stream()


def gates(variant, window_us):
    if variant not in ("xsched", "lp-alone-xsched"):
        return None, None
    import xsched_lv3.pytorch as xt
    return (lambda: xt.client(priority=10, window_us=None)), (lambda: xt.client(priority=0, window_us=window_us))


def run_threads(variant, batch, seconds, window_us):
    hp_s, lp_s = streams(variant)
    hp_gate, lp_gate = gates(variant, window_us)
    res = {}
    start_at = time.monotonic() + 8.0           # both models built and warm by then
    threads = []
    if not variant.startswith("lp-alone"):
        threads.append(threading.Thread(target=hp_loop, args=(seconds, hp_s, start_at, res, hp_gate)))
    if variant != "hp-alone":
        threads.append(threading.Thread(target=lp_loop, args=(seconds, batch, lp_s, start_at, res, None, lp_gate)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return res


def _proc_main(role, variant, batch, seconds, window_us, start_at, queue):
    import torch
    torch.backends.cudnn.benchmark = False
    hp_s, lp_s = streams(variant)
    if variant in ("xsched", "lp-alone-xsched"):
        # what `xsched-lv3 run --priority N` sets up in each process
        os.environ["XSCHED_LV3_PRIORITY"] = "10" if role == "hp" else "0"
        os.environ["XSCHED_LV3_WINDOW_US"] = "0" if role == "hp" else str(window_us)
        from xsched_lv3.pytorch import enable_for_process
        enable_for_process()
    res = {}
    if role == "hp":
        hp_loop(seconds, hp_s if variant == "priorities" else torch.cuda.current_stream(), start_at, res)
    else:
        lp_loop(seconds, batch, lp_s if variant == "priorities" else torch.cuda.current_stream(), start_at, res)
    queue.put(res)


def run_processes(variant, batch, seconds, window_us):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    start_at = time.monotonic() + 15.0          # CLOCK_MONOTONIC is system-wide
    roles = [r for r in ("hp", "lp") if not (variant == "hp-alone" and r == "lp") and
             not (variant.startswith("lp-alone") and r == "hp")]
    procs = [ctx.Process(target=_proc_main, args=(r, variant, batch, seconds, window_us, start_at, q)) for r in roles]
    for p in procs:
        p.start()
    res = {}
    for _ in procs:
        res.update(q.get(timeout=seconds + 120))
    for p in procs:
        p.join()
    return res


def summarize(res):
    out = {}
    if "hp_latencies_s" in res:
        out.update(latency_summary(res["hp_latencies_s"]), hp_requests=len(res["hp_latencies_s"]))
    for key in ("lp_iters_per_s", "lp_gate_waits", "lp_gate_held_s"):
        if key in res:
            out[key] = res[key]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--modes", nargs="+", default=["threads", "processes"])
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--window-us", type=float, default=None,
                        help="LP progressive window (default: 2000 for threads, where stream priorities let HP "
                             "overtake in-flight LP work; 500 for processes, where they cannot)")
    parser.add_argument("--variants", nargs="+", default=["native", "priorities", "xsched"],
                        help="also: lp-alone-xsched (LP alone under the scheduler: its overhead)")
    parser.add_argument("--out", default=str(REPO / "results" / "bench_two_models"))
    args = parser.parse_args()
    import torch
    card = torch.cuda.get_device_name(0)
    print(f"card: {card}; torch {torch.__version__}", flush=True)
    doc = {"benchmark": "two models, one GPU", "card": card, "torch": torch.__version__,
           "seconds": args.seconds, "window_us": args.window_us, "hp": "resnet18 b4 @ 20 req/s open loop",
           "lp": "resnet50 inference back to back", "runs": []}
    for mode in args.modes:
        run_mode = run_threads if mode == "threads" else run_processes
        window = args.window_us or (2000.0 if mode == "threads" else 500.0)
        doc.setdefault("window_us_by_mode", {})[mode] = window

        def run(variant, batch, seconds, _w, run_mode=run_mode, window=window):
            return run_mode(variant, batch, seconds, window)
        hp_alone = summarize(run("hp-alone", 0, args.seconds, args.window_us))
        doc["runs"].append({"mode": mode, "variant": "hp-alone", **hp_alone})
        print(mode, "hp-alone", hp_alone, flush=True)
        for batch in args.batches:
            lp_alone = summarize(run("lp-alone", batch, args.seconds, args.window_us))
            doc["runs"].append({"mode": mode, "variant": "lp-alone", "lp_batch": batch, **lp_alone})
            print(mode, "lp-alone", batch, lp_alone, flush=True)
            for variant in args.variants:
                r = summarize(run(variant, batch, args.seconds, args.window_us))
                if variant == "lp-alone-xsched":
                    r["lp_vs_alone"] = r["lp_iters_per_s"] / lp_alone["lp_iters_per_s"]
                    doc["runs"].append({"mode": mode, "variant": variant, "lp_batch": batch, **r})
                    print(mode, variant, batch, {k: round(v, 3) for k, v in r.items()}, flush=True)
                    continue
                r["hp_p99_vs_alone"] = r["hp_p99_ms"] / hp_alone["hp_p99_ms"]
                r["lp_vs_alone"] = r["lp_iters_per_s"] / lp_alone["lp_iters_per_s"]
                doc["runs"].append({"mode": mode, "variant": variant, "lp_batch": batch, **r})
                print(mode, variant, batch, {k: round(v, 3) for k, v in r.items()}, flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".json").write_text(json.dumps(doc, indent=2) + "\n")
    try:
        plot(doc, args.out + ".png")
    except ImportError:
        pass
    print(f"wrote {args.out}.json")


def plot(doc, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in doc["runs"] if "hp_p99_vs_alone" in r]
    if not rows:
        return
    labels = [f"{r['mode'][:4]} b{r['lp_batch']}\n{r['variant']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.9), 4.5))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["hp_p99_vs_alone"] for r in rows], 0.4, label="HP P99 / HP-alone P99")
    ax.bar([x + 0.2 for x in xs], [r["lp_vs_alone"] for r in rows], 0.4, label="LP iter/s / LP-alone")
    ax.axhline(1.10, color="tab:blue", ls="--", lw=1)
    ax.axhline(0.90, color="tab:orange", ls="--", lw=1)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_yscale("log")
    ax.set_title(f"ResNet-18 (HP) + ResNet-50 (LP) on {doc['card']} — targets: HP ≤ 1.10x, LP ≥ 0.90x")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
