#!/usr/bin/env python3
"""Suspend/resume latency of GPU queues per mechanism, versus resident waves and grace period,
against the physical limit (saved wave-state bytes / memory bandwidth).

Simulation (default): the simulated MI308X (CPX: 20 CUs, 1 XCC per node) and MI300X (SPX: 304 CUs,
8 XCCs), with the simulator's timing model paid in real time. This process owns one compute queue
and suspends it through DBG_TRAP (self-debugging) and through UPDATE_QUEUE 0%/100%. Wall times
include the simulator's socket round trip, measured separately and reported as `ipc_overhead_s`.

Real hardware: `--real PID` measures DBG_TRAP suspend/resume of PID's queues through /dev/kfd
(needs the requirements of `kfdtool preempt`). Not run here: no AMD GPU on this machine.

    python scripts/bench_preempt.py [--rounds 200] [--real PID]
Results: results/bench_preempt.{json,png}
"""
import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchlib import provenance, write_results  # noqa: E402  (next to this script)
from kfdtool.cwsr.debugtrap import DebugTrapSuspend  # noqa: E402
from kfdtool.cwsr.update_queue import OwnQueue, UpdateQueueSuspend  # noqa: E402
from kfdtool.device import KfdDevice  # noqa: E402
from kfdtool.ioctls import structs as s  # noqa: E402

WAVE_FRACTIONS = (0.0, 0.25, 0.5, 1.0)
GRACE_PERIODS = (None, 64, 255)


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q / 100 * len(values)))]


def ipc_overhead(kfd, n=300):
    v = s.kfd_ioctl_get_version_args()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        kfd.ioctl("GET_VERSION", v)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bench_machine(machine_name, rounds):
    from kfdtool.sim import runner, timing
    from kfdtool.sim.cwsr import node_cwsr
    from kfdtool.sim.workload import FakeRuntime
    sim = runner.start(machine_name, realtime=True)
    kfd = KfdDevice(sim.open_kfd())
    ctl = sim.control()
    rt = FakeRuntime(kfd, sim.sysfs_root)
    gpu = next(rt.topology.for_each_gpu())
    qid = rt.create_queue(gpu.gpu_id)
    overhead = ipc_overhead(kfd)
    # the model's own view of this device, for the physical limit
    status = ctl("status")
    assert status["gpus"][0] == gpu.gpu_id
    rows = []
    mechanisms = {}
    try:
        waves_max = timing.max_waves(gpu)
        bandwidth = timing.bandwidth(gpu)
        per_wave = timing.bytes_per_wave(gpu, node_cwsr(gpu.props))   # the model's own sizes
        mechanisms = {
            "debug-trap": DebugTrapSuspend(kfd, os.getpid(), read_wave_state=False),
            "update-queue": UpdateQueueSuspend(kfd, [OwnQueue(qid, rt.queues[qid]["ring_base"],
                                                              rt.queues[qid]["ring_size"], 7, True,
                                                              rt.queues[qid]["ctx_save_restore_address"])],
                                               read_wave_state=False),
        }
        for frac in WAVE_FRACTIONS:
            waves = int(waves_max * frac)
            ctl("set_waves", pid=os.getpid(), qid=qid, waves=waves)
            for name, mech in mechanisms.items():
                for grace in (GRACE_PERIODS if name == "debug-trap" else (None,)):
                    sus, res, modelled = [], [], []
                    for _ in range(rounds):
                        t = time.perf_counter()
                        mech.suspend([qid], grace)
                        sus.append(time.perf_counter() - t)
                        modelled.append(ctl("last_cost"))
                        t = time.perf_counter()
                        mech.resume([qid])
                        res.append(time.perf_counter() - t)
                    saved = statistics.median(m["saved_bytes"] for m in modelled)
                    rows.append({
                        "machine": machine_name, "mechanism": name, "resident_waves": waves,
                        "grace_period": grace, "rounds": rounds,
                        "suspend_p50_s": pct(sus, 50), "suspend_p99_s": pct(sus, 99),
                        "resume_p50_s": pct(res, 50), "resume_p99_s": pct(res, 99),
                        "modelled_suspend_s": statistics.median(m["remap_s"] + m["grace_s"] + m["save_s"]
                                                                for m in modelled),
                        "saved_bytes": saved, "physical_limit_s": waves * per_wave / bandwidth,
                    })
                    r = rows[-1]
                    print(f"{machine_name:7s} {name:12s} waves {waves:5d} grace {str(grace):4s} "
                          f"suspend p50 {r['suspend_p50_s'] * 1e6:7.0f} us p99 {r['suspend_p99_s'] * 1e6:7.0f} us | "
                          f"resume p50 {r['resume_p50_s'] * 1e6:7.0f} us | limit {r['physical_limit_s'] * 1e6:6.1f} us",
                          flush=True)
        return {"machine": machine_name, "gpu": {"gpu_id": gpu.gpu_id, "gfx": gpu.gfx_name, "cus": gpu.cu_count,
                                                  "xcc": gpu.num_xcc},
                "bandwidth_bytes_per_s": bandwidth, "bytes_per_wave": per_wave, "ipc_overhead_s": overhead,
                "rows": rows}
    finally:
        # before the runtime: turning it off while this process debugs itself would wait for an
        # answer only this process could give (kfd_chardev.c: runtime_disable)
        for mech in mechanisms.values():
            mech.close()
        rt.close()
        kfd.close()
        ctl.close()
        runner.stop(machine_name)


def bench_real(pid, rounds):
    kfd = KfdDevice.open()
    with DebugTrapSuspend(kfd, pid) as mech:
        qids = [e.queue_id for e in mech.queues()]
        sus, res = [], []
        for _ in range(rounds):
            t = time.perf_counter()
            mech.suspend(qids)
            sus.append(time.perf_counter() - t)
            t = time.perf_counter()
            mech.resume()
            res.append(time.perf_counter() - t)
    return {"machine": "real /dev/kfd", "pid": pid, "queues": len(qids), "kfd_abi": str(kfd.abi),
            "suspend_p50_s": pct(sus, 50), "suspend_p99_s": pct(sus, 99),
            "resume_p50_s": pct(res, 50), "resume_p99_s": pct(res, 99)}


def plot(results, path):
    """The figure, where matplotlib is installed (it is not a dependency); True when written."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib not installed: no plot")
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.2), squeeze=False)
    for ax, res in zip(axes[0], results):
        rows = res["rows"]
        for (mech, grace), style in {("debug-trap", None): "o-", ("debug-trap", 255): "s--",
                                     ("update-queue", None): "^-"}.items():
            sel = [r for r in rows if r["mechanism"] == mech and r["grace_period"] == grace]
            x = [r["resident_waves"] for r in sel]
            ax.plot(x, [r["suspend_p50_s"] * 1e6 for r in sel], style,
                    label=f"{mech}{'' if grace is None else f' grace {grace}'} p50")
            ax.fill_between(x, [r["suspend_p50_s"] * 1e6 for r in sel], [r["suspend_p99_s"] * 1e6 for r in sel],
                            alpha=0.15)
        sel = [r for r in rows if r["mechanism"] == "debug-trap" and r["grace_period"] is None]
        ax.plot([r["resident_waves"] for r in sel], [r["physical_limit_s"] * 1e6 for r in sel], "k:",
                label="physical limit (bytes / bandwidth)")
        ax.plot([r["resident_waves"] for r in sel], [r["modelled_suspend_s"] * 1e6 for r in sel], "k-", lw=0.8,
                label="timing model: remap + grace + save")
        ax.axhline(res["ipc_overhead_s"] * 1e6, color="grey", lw=1, ls="-.", label="simulator IPC round trip")
        g = res["gpu"]
        ax.set_title(f"simulated {res['machine']} ({g['gfx']}, {g['cus']} CUs, {g['xcc']} XCC)")
        ax.set_xlabel("resident waves in the queue")
        ax.set_ylabel("suspend latency, µs (p50, band to p99)")
        ax.legend(fontsize=7)
    fig.suptitle("Queue suspend latency — SIMULATION (timing model, not hardware)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--real", type=int, metavar="PID", help="measure the real ioctls on PID's queues")
    parser.add_argument("--out", default=str(REPO / "results" / "bench_preempt"))
    args = parser.parse_args()
    if args.real:
        print(json.dumps(bench_real(args.real, args.rounds), indent=2))
        return
    os.environ.setdefault("KFDTOOL_SIM_DIR", tempfile.mkdtemp(prefix="kfdtool-bench-"))
    results = [bench_machine(name, args.rounds) for name in ("mi308x", "mi300x")]
    doc = {"benchmark": "queue suspend/resume latency", **provenance(), "simulation": True,
           "note": "simulated KFD with kfdtool.sim.timing; wall times include the simulator IPC round trip",
           "host": {"cores": os.cpu_count(), "python": platform.python_version()}, "machines": results}
    write_results(args.out + ".json", doc)
    if plot(results, args.out + ".png"):
        print(f"wrote {args.out}.png")


if __name__ == "__main__":
    main()
