#!/usr/bin/env python3
"""Both jobs as two threads of one process: the HP service (serve.py's loop) and the LP batch job
(batch.py's loop), each on its own stream without priorities. With --scheduled each thread is a
client of xsched_lv3 through `xt.client` with default options (HP priority 10, LP 0).

    python pair_threads.py --hp resnet18:4 --lp resnet50:16 [--scheduled] [--no-hp | --no-lp]
"""
import argparse
import contextlib
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from batch import make_step  # noqa: E402
from models import build, job_spec  # noqa: E402
from serve import add_service_options, build_service, check_service, serve, warm  # noqa: E402
from benchlib import gc_pauses_if_asked, iterations_per_second, open_loop  # noqa: E402  (serve's import put scripts/ on the path)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hp", type=job_spec, default=("resnet18", 4, False), help="MODEL:BATCH")
    p.add_argument("--lp", type=lambda text: job_spec(text, ("", "train")), default=("resnet50", 16, False),
                   help="MODEL:BATCH, or MODEL:BATCH:train for training steps")
    p.add_argument("--rate", type=float, default=20.0)
    add_service_options(p)
    p.add_argument("--seconds", type=float, default=26.0)
    p.add_argument("--warmup-s", type=float, default=1.0)
    p.add_argument("--scheduled", action="store_true", help="bind each thread with xt.client (defaults)")
    p.add_argument("--latency-slack", type=float, help="--scheduled: the service's latency slack (0: strict priority)")
    p.add_argument("--hp-stream-priority", action="store_true",
                   help="the service thread's stream at the device's highest priority (the batch thread's stays "
                        "at the default): pending work of a higher-priority stream is dispatched first")
    p.add_argument("--no-hp", action="store_true")
    p.add_argument("--no-lp", action="store_true")
    p.add_argument("--switch-interval-ms", type=float,
                   help="diagnostics: the interpreter's GIL switch interval for the whole run (with --scheduled, "
                        "also the short one the scheduler sets for two clients and while a watcher waits: gil.short_switch)")
    p.add_argument("--hp-hold-ms", type=float,
                   help="diagnostics, with --scheduled: the service thread launches nothing; each of its requests "
                        "holds the batch thread back for this long (a sleep between begin and end of a request)")
    args = p.parse_args()
    problem = check_service(args.hp[0], args.hp[1], args.decode_tokens, args.prompt_tokens)
    if problem:
        p.error(problem)
    if args.hp_hold_ms is not None and (not args.scheduled or args.no_hp or not args.hp_hold_ms > 0):
        p.error("--hp-hold-ms wants --scheduled, a service thread (no --no-hp) and a time > 0")
    import torch
    xt = None
    if args.scheduled:
        import xsched_lv3.pytorch as xt
        from xsched_lv3 import runenv
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1e3)
        if xt:
            from xsched_lv3.gil import short_switch
            short_switch.seconds = args.switch_interval_ms / 1e3     # what the scheduler would set
    results, ready, go = {}, threading.Barrier(3 - args.no_hp - args.no_lp), {}

    failed = []

    def role(kind, priority, fn):
        try:
            run_role(kind, priority, fn)
        except BaseException as e:             # the other threads and main wait at the barrier: free them
            failed.append(f"{kind} thread: {type(e).__name__}: {e}")
            ready.abort()

    def run_role(kind, priority, fn):
        name, batch, train = args.hp if kind == "hp" else args.lp
        highest = torch.cuda.Stream.priority_range()[1]      # (lowest, highest): numerically lower is higher
        stream = torch.cuda.Stream(priority=highest if kind == "hp" and args.hp_stream_priority else 0)
        options = {} if args.latency_slack is None or kind == "lp" else {"latency_slack": args.latency_slack}
        ctx = xt.client(priority=priority, **options) if xt else contextlib.nullcontext()
        with torch.cuda.stream(stream), ctx as gate:
            if kind == "hp":
                model, x, request = build_service(name, batch, args.decode_tokens, args.prompt_tokens)
                warm(model, x, 20, request)
                work = (model, x, request)
            else:
                work = (make_step(*build(name, batch), train),)
            ready.wait()
            ready.wait()                       # the main thread has read the start time
            while time.monotonic() < go["at"]:
                time.sleep(0.0005)
            results.update(fn(*work, go["at"], gate))
            if xt:
                results[f"{kind}_gate"] = runenv.report(gate)     # with which scheduler it was

    threads = []
    if not args.no_hp:
        def hold_only(gate):
            gate.begin_request()
            try:
                time.sleep(args.hp_hold_ms / 1e3)
            finally:
                gate.end_request()

        def service(m, x, request, t, gate):
            if args.hp_hold_ms is None:
                return serve(m, x, args.rate, args.seconds, args.warmup_s, t, request)
            return {"hp_latencies_s": open_loop(args.rate, args.seconds, lambda: hold_only(gate), args.warmup_s, t)}
        threads.append(threading.Thread(target=role, args=("hp", 10, service)))
    if not args.no_lp:
        threads.append(threading.Thread(target=role, args=("lp", 0, lambda step, t, gate: {
            "lp_iters_per_s": iterations_per_second(step, t, args.seconds, args.warmup_s)})))
    gc_pauses = gc_pauses_if_asked()
    for t in threads:
        t.start()
    try:
        ready.wait()
        print("READY", flush=True)
        go["at"] = float(input())
        ready.wait()
    except threading.BrokenBarrierError:
        pass
    for t in threads:
        t.join()
    if failed:
        sys.exit("pair_threads: " + "; ".join(failed))
    if gc_pauses and "at" in go:
        results["gc_pauses"] = gc_pauses.since(go["at"])      # the process's: both threads stop
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
