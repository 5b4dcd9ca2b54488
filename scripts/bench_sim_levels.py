#!/usr/bin/env python3
"""The two-model scenario on the simulated MI308X (one CPX partition), Lv1 versus Lv3 — SIMULATION.

A virtual GPU (xsched_lv3.backends.sim.SimGPU) runs kernels one at a time, oldest launch first.
HP: a ResNet-18-like request (60 kernels x 35 µs) at 20 req/s, open loop. LP: ResNet-50-like
iterations (160 kernels of 25 µs, "b16", or 90 µs, "b64") back to back. Variants: HP alone, LP
alone, native (no scheduler), Lv1 (XQueue progressive window + HPF), Lv3 (interrupt/restore whose
cost is kfdtool.sim.timing's model for this partition: HWS remap + CWSR save/restore of the resident
waves at the partition's share of HBM bandwidth).

    python scripts/bench_sim_levels.py [--seconds 4]
Results: results/bench_sim_levels.json
"""
import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchlib import latency_summary, open_loop, provenance, write_results  # noqa: E402  (next to this script)

from xsched_lv3 import Level, LocalScheduler, XQueue  # noqa: E402
from xsched_lv3.backends.sim import SimGPU, SimHwQueue  # noqa: E402

HP_KERNELS, HP_KERNEL_US, HP_RATE = 60, 35, 20.0
LP_KERNELS = 160


def mi308x_switch_seconds():
    """kfdtool.sim.timing's cost of one CWSR switch of a full queue on one MI308X CPX partition:
    HWS remap with the two queues mapped + save of every resident wave at the partition's HBM share."""
    from kfdtool.cwsr.sizing import cwsr_sizes
    from kfdtool.sim import timing
    from kfdtool.sim.machine import PROFILES, materialize
    from kfdtool.topology import read_topology
    with tempfile.TemporaryDirectory() as root:
        materialize("mi308x", root, PROFILES["1.23"])
        node = next(read_topology(root).for_each_gpu())
    saved = timing.max_waves(node) * timing.bytes_per_wave(node, cwsr_sizes(node.props))
    return timing.HWS_REMAP_BASE_S + 2 * timing.HWS_REMAP_PER_QUEUE_S + saved / timing.bandwidth(node)


SWITCH_S = None


class ModeledLv3(SimHwQueue):
    """Interrupt/restore that take the simulated MI308X's modelled CWSR time."""

    def interrupt(self):
        _pause(SWITCH_S)
        super().interrupt()

    def restore(self):
        _pause(SWITCH_S)
        super().restore()


def _pause(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        time.sleep(0)


def run(variant, lp_us, seconds):
    gpu = SimGPU()
    hp_hw = (ModeledLv3 if variant == "lv3" else SimHwQueue)(Level.INTERRUPT, gpu=gpu, name="hp")
    lp_hw = (ModeledLv3 if variant == "lv3" else SimHwQueue)(Level.INTERRUPT, gpu=gpu, name="lp")
    level = Level.INTERRUPT if variant == "lv3" else Level.BLOCK
    window = None if variant == "native" else 500
    hp = XQueue(hp_hw, level=level, window_us=10_000_000)
    lp = XQueue(lp_hw, level=level, window_us=window or 10_000_000)
    sched = None
    if variant in ("lv1", "lv3"):
        sched = LocalScheduler("hpf")
        sched.add(hp)
        sched.add(lp)
        sched.hint(hp, "priority", 10)
        sched.hint(lp, "priority", 0)
    stop = threading.Event()
    lp_iters = [0]

    def lp_loop():
        while not stop.is_set():
            for _ in range(LP_KERNELS):
                lp.submit(("lp", lp_us), est_us=lp_us)
            lp.wait_all()
            lp_hw.synchronize()
            lp_iters[0] += 1
    lat = []
    t0 = time.monotonic()
    threads = []
    if variant != "hp-alone":
        threads.append(threading.Thread(target=lp_loop, daemon=True))
        threads[0].start()
    if variant != "lp-alone":
        def request():
            for _ in range(HP_KERNELS):
                hp.submit(("hp", HP_KERNEL_US), est_us=HP_KERNEL_US)
            hp.wait_all()
            hp_hw.synchronize()
        lat = open_loop(HP_RATE, seconds, request, warmup_s=0.5, t0=t0)
    else:
        time.sleep(seconds)
    lp_start = lp_iters[0]
    t_mid = time.monotonic()
    stop.set()
    out = {"variant": variant}
    if lat:
        out.update(latency_summary(lat))
    if variant != "hp-alone":
        out["lp_iters_per_s"] = lp_start / (t_mid - t0)
    if sched:
        sched.close()
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--out", default=str(REPO / "results" / "bench_sim_levels"))
    args = parser.parse_args()
    global SWITCH_S
    SWITCH_S = mi308x_switch_seconds()
    rows = []
    hp_alone = run("hp-alone", 0, args.seconds)
    rows.append(hp_alone)
    print(hp_alone, flush=True)
    for label, lp_us in (("b16", 25), ("b64", 90)):
        lp_alone = run("lp-alone", lp_us, args.seconds)
        rows.append({**lp_alone, "lp": label})
        print(label, lp_alone, flush=True)
        for variant in ("native", "lv1", "lv3"):
            r = run(variant, lp_us, args.seconds)
            r.update(lp=label, hp_p99_vs_alone=r["hp_p99_ms"] / hp_alone["hp_p99_ms"],
                     lp_vs_alone=r["lp_iters_per_s"] / lp_alone["lp_iters_per_s"])
            rows.append(r)
            print(label, {k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}, flush=True)
    doc = {"benchmark": "two models on the simulated MI308X (CPX partition): Lv1 vs Lv3", **provenance(),
           "simulation": True,
           "note": "virtual GPU in Python; absolute times are the model's, only ratios within this run mean much",
           "modelled_lv3_switch_us": SWITCH_S * 1e6, "rows": rows}
    write_results(args.out + ".json", doc)


if __name__ == "__main__":
    main()
