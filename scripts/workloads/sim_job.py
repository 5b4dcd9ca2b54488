#!/usr/bin/env python3
"""A GPU program on the simulated KFD, written against the simulator's HIP-like runtime
(`kfdtool.sim.hip`) and nothing else (no scheduler imports): its kernels take time on the simulated
GPU, share it with other processes' kernels, and stop while its KFD queue is suspended.

    serve  a latency-critical service: requests arrive open-loop at --rate per second, each one a
           model call of --kernels kernels of --kernel-us, then synchronized; prints its latencies
    batch  batch work: model calls back to back, each synchronized; prints iterations per second

A kernel occupies --occupancy of the GPU's wave slots (1.0: it fills the GPU; kernels whose waves
fit together run side by side at full speed, beyond that they share).

    python sim_job.py --sim mi308x serve --kernels 20 --kernel-us 100 --occupancy 0.25 --rate 20 --seconds 26
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]
from benchlib import iterations_per_second, open_loop  # noqa: E402  (the benchmarks' loops)
from models import wait_for_start  # noqa: E402  (torch-free: the common start protocol)

from kfdtool.sim.hip import SimHip, SimModel  # noqa: E402


def build(args):
    hip = SimHip(args.sim)
    node = hip.rt.topology.find_gpu(hip.gpus[args.device])
    waves = max(1, round(args.occupancy * node.cu_count * 40))        # wave slots: CUs x 40 (gfx9)
    model = SimModel(hip, [(args.kernel_us, waves)] * args.kernels, name=args.role)
    return hip, hip.stream(device=args.device), model


def serve(hip, stream, model, args, start_at):
    """Each request's latency, and also: how long it took until its launches were recorded (the
    simulator's one thread has taken them then, SimHip.record, where a real runtime's record costs a
    memory write); and its latency less how long after its work completed on the simulated GPU its
    wait returned (SimHip.synchronize names that moment; the simulator's thread answers when it
    gets to it, where the device's signal wakes a waiter within microseconds). The latency on the
    device's side, without the simulator's own lateness in answering."""
    recorded, answer_lag = [], []

    def request():
        began = time.monotonic()
        event = model(stream)
        recorded.append(time.monotonic() - began)
        completed_ns = hip.synchronize(event)
        answer_lag.append(0.0 if completed_ns is None else max(0.0, time.monotonic() - completed_ns / 1e9))
    latencies = open_loop(args.rate, args.seconds, request, args.warmup_s, t0=start_at)
    n = len(latencies)
    lags = answer_lag[len(answer_lag) - n:]
    return {"hp_latencies_s": latencies, "hp_recorded_s": recorded[len(recorded) - n:],
            "hp_device_s": [latency - lag for latency, lag in zip(latencies, lags)]}


def batch(hip, stream, model, args, start_at):
    rate = iterations_per_second(lambda: hip.synchronize(model(stream)), start_at, args.seconds, args.warmup_s)
    return {"lp_iters_per_s": rate}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sim", required=True, help="a running simulated machine (kfdtool sim start NAME)")
    p.add_argument("--device", type=int, default=0)
    p.add_argument("role", choices=("serve", "batch"))
    p.add_argument("--kernels", type=int, default=20, help="kernels per model call")
    p.add_argument("--kernel-us", type=float, default=100.0, help="a kernel's time with the GPU to itself")
    p.add_argument("--occupancy", type=float, default=1.0, help="share of the GPU's wave slots a kernel occupies")
    p.add_argument("--rate", type=float, default=20.0, help="serve: requests per second")
    p.add_argument("--seconds", type=float, default=26.0)
    p.add_argument("--warmup-s", type=float, default=1.0)
    args = p.parse_args()
    hip, stream, model = build(args)
    for _ in range(3):                               # warm: queues created, connections open
        hip.synchronize(model(stream))
    start_at = wait_for_start()
    result = (serve if args.role == "serve" else batch)(hip, stream, model, args, start_at)
    print(json.dumps(result), flush=True)
    hip.close()


if __name__ == "__main__":
    main()
