#!/usr/bin/env python3
"""Lv3 against Lv1 end to end on the simulated KFD — SIMULATION, not hardware.

Separate OS processes (scripts/workloads/sim_job.py, written against the simulator's HIP-like
runtime, no scheduler imports) run kernels on one simulated GPU: a latency-critical service
(open-loop requests) next to 1 or 3 batch jobs. Every variant is started as a user starts it:

  hp-alone, lp-alone   the service alone; the batch jobs alone (together)
  native               all at once, no scheduler
  lv1                  `xsched-lv3 run --priority 10 -- ...serve` and `xsched-lv3 run -- ...batch`,
                       no daemon: the batch jobs' gates hold their launches (progressive window)
  lv3                  the same commands with `xsched-lv3 daemon --sim NAME` running: the daemon
                       suspends the batch jobs' KFD queues (DBG_TRAP, CWSR) while the service is busy
  lv3-attached         the service under `xsched-lv3 run`, the batch jobs started plainly and then
                       `xsched-lv3 attach --pid P` (no scheduler inside them): should match lv3
  lv1-w<US>            with --lv1-windows US...: lv1 with the batch jobs' `--window-us US` (a
                       longer window: more batch throughput, a longer HP wait), to set Lv1's tail
                       and throughput as the window moves beside Lv3's

What is simulated (kfdtool/sim): kernels' GPU time and how kernels of several queues share a GPU
(wave slots: a kernel waits for running waves to retire; ESTIMATE: round-robin dispatch), DBG_TRAP
suspend/resume with the kernel's semantics (CWSR saves the waves and frees their slots), and their cost
from the timing model (HWS unmap+map of the whole device, CWSR save/restore at the partition's share of
HBM bandwidth: ESTIMATE constants in kfdtool/sim/timing.py).
CPU costs are real: every launch is a round trip to the simulator's server (~0.1 ms), so the
programs here are launch-heavy Python, and the host's CPU count matters.

    python scripts/bench_sim_e2e.py --machines mi308x mi300x --lps 1 3 --seconds 26
    python scripts/bench_sim_e2e.py --machines mi308x --lps 1 --lv1-windows 1500 3000
    python scripts/bench_sim_e2e.py --table results/bench_sim_e2e_*.json     # the README table
    python scripts/bench_sim_e2e.py --table FILES --device-side   # the service's P99 less the
                                   # simulator's lateness in answering its waits (sim_job.py)
Results: results/bench_sim_e2e_r<rep>.json (git revision, dirty flag, command, CPU count).
"""
import argparse
import json
import os
import select
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from benchlib import (PY, latency_summary, memory_scratch, provenance, run_together, write_results,  # noqa: E402
                      xsched_run)

JOB = str(REPO / "scripts" / "workloads" / "sim_job.py")
# A ResNet-18-like request (20 kernels of 100 µs, each a quarter of the GPU) and a training-like
# iteration (20 kernels of 1 ms, each filling the GPU): the shapes, not tuned values, matter here.
SERVE = ["--kernels", "20", "--kernel-us", "100", "--occupancy", "0.25", "--rate", "20"]
BATCH = ["--kernels", "20", "--occupancy", "1.0"]     # kernel length: --lp-kernel-us (Lv1 waits for it)
VARIANTS = ("hp-alone", "lp-alone", "native", "lv1", "lv3", "lv3-attached")
LV1_WINDOW = "lv1-w"              # lv1-w<US>: Lv1 with the batch jobs' window at US (--lv1-windows)


def lv1_window_us(variant):
    """The batch jobs' window of an lv1-w<US> variant, µs."""
    return float(variant[len(LV1_WINDOW):])


def commands(variant, machine, lps, seconds, lp_kernel_us):
    common = ["--sim", machine, "--seconds", str(seconds)]
    hp = [PY, JOB, *common, "serve", *SERVE]
    lp = [PY, JOB, *common, "batch", *BATCH, "--kernel-us", str(lp_kernel_us)]
    if variant == "hp-alone":
        return [hp]
    if variant == "lp-alone":
        return [lp] * lps
    if variant == "native":
        return [hp] + [lp] * lps
    if variant == "lv3-attached":
        return [xsched_run(hp, priority=10)] + [lp] * lps
    if variant.startswith(LV1_WINDOW):
        return [xsched_run(hp, priority=10)] + [xsched_run(lp, window_us=lv1_window_us(variant))] * lps
    return [xsched_run(hp, priority=10)] + [xsched_run(lp)] * lps


def attach_batch_jobs(pids):
    """lv3-attached: every program but the first (the service) is attached at priority 0."""
    for pid in pids[1:]:
        out = subprocess.run([PY, "-m", "xsched_lv3", "attach", "--pid", str(pid), "--priority", "0"],
                             capture_output=True, text=True, cwd=REPO, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"attach of pid {pid} failed: {out.stderr.strip()}")


class Daemon:
    """`xsched-lv3 daemon --sim NAME` for the lv3 variant, on a private socket and board."""

    def __init__(self, machine, env):
        trace = ["--trace", os.environ["BENCH_DAEMON_TRACE"]] if os.environ.get("BENCH_DAEMON_TRACE") else []
        self.proc = subprocess.Popen([PY, "-m", "xsched_lv3", "daemon", "--sim", machine, *trace], env=env, cwd=REPO,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        banner = self.proc.stdout.readline() if ready else ""
        if "Lv3 through" not in banner:
            self.stop()
            raise RuntimeError(f"the daemon did not start with Lv3: {banner!r} {self.proc.stderr.read()[-2000:]}")

    def status(self):
        out = subprocess.run([PY, "-m", "xsched_lv3", "status", "--json"], capture_output=True, text=True, cwd=REPO,
                             timeout=30)
        return json.loads(out.stdout) if out.returncode == 0 else {"error": out.stderr.strip()}

    def cpu_s(self):
        """CPU time the daemon used so far (user + system), from /proc."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self):
        self.cpu_used_s = self.cpu_s() if self.proc.poll() is None else None
        self.proc.terminate()
        try:
            _, err = self.proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return err


def measure(args, doc):
    from kfdtool.sim import runner
    scratch = memory_scratch("xsched-sim-e2e-")
    env = dict(os.environ, KFDTOOL_SIM_DIR=f"{scratch}/sims", XSCHED_LV3_BOARD=f"{scratch}/board",
               XSCHED_LV3_SOCKET=f"{scratch}/daemon.sock", KFDTOOL_RUN_DIR=f"{scratch}/run")
    os.environ.update(env)                     # run_together's children inherit it
    try:
        for machine in args.machines:
            runner.start(machine)
            try:
                for lps in args.lps:
                    for variant in args.variants:
                        row = run_variant(args, machine, lps, variant, env)
                        doc["rows"].append(row)
                        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()
                                          if k != "daemon_log_tail" and not k.endswith("_gate")}), flush=True)
            finally:
                runner.stop(machine)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)   # in memory: never left behind


def run_variant(args, machine, lps, variant, env):
    daemon = Daemon(machine, env) if variant.startswith("lv3") else None
    t = time.monotonic()
    try:
        outputs = run_together(commands(variant, machine, lps, args.seconds, args.lp_kernel_us),
                               args.seconds + 120,
                               when_ready=attach_batch_jobs if variant == "lv3-attached" else None)
    finally:
        log = daemon.stop() if daemon else ""
    row = {"machine": machine, "lps": lps, "lp_kernel_us": args.lp_kernel_us, "variant": variant,
           "wall_s": round(time.monotonic() - t, 1), **summarize(outputs)}
    if daemon:
        row["daemon_log_tail"] = log[-1500:]
        row["daemon_cpu_s"] = daemon.cpu_used_s
    return row


def summarize(outputs):
    out = {}
    lp_rates = [o["lp_iters_per_s"] for o in outputs if "lp_iters_per_s" in o]
    for o in outputs:
        if "hp_latencies_s" in o:
            out.update(latency_summary(o["hp_latencies_s"]), hp_requests=len(o["hp_latencies_s"]))
            if o.get("hp_recorded_s"):         # until the simulator had taken its launches (sim_job.py)
                out.update(latency_summary(o["hp_recorded_s"], prefix="hp_recorded"))
            if o.get("hp_device_s"):           # less the simulator's lateness in answering its waits
                out.update(latency_summary(o["hp_device_s"], prefix="hp_device"))
            if "gate" in o:
                out["hp_gate"] = o["gate"]
    if lp_rates:
        out["lp_iters_per_s"] = sum(lp_rates)
        out["lp_gates"] = [o["gate"] for o in outputs if "gate" in o and "lp_iters_per_s" in o]
    return out


def ratios(doc):
    """Per (machine, lps): HP P99 and LP throughput of each variant against the same run's alone."""
    out = {}
    for machine in {r["machine"] for r in doc["rows"]}:
        for lps in {r["lps"] for r in doc["rows"]}:
            rows = {r["variant"]: r for r in doc["rows"] if r["machine"] == machine and r["lps"] == lps}
            if not {"hp-alone", "lp-alone"} <= set(rows):
                continue
            hp, lp = rows["hp-alone"]["hp_p99_ms"], rows["lp-alone"]["lp_iters_per_s"]
            key = f"{machine}/{lps}/{rows['lp-alone'].get('lp_kernel_us', 1000.0):g}"
            out[key] = {v: {"hp_p99_ms": rows[v]["hp_p99_ms"], "hp_p99_x": rows[v]["hp_p99_ms"] / hp,
                            "lp_share": rows[v]["lp_iters_per_s"] / lp,
                            **({"hp_device_p99_ms": rows[v]["hp_device_p99_ms"]} if "hp_device_p99_ms" in rows[v] else {})}
                        for v in rows if v not in ("hp-alone", "lp-alone")}
            out[key]["hp_alone_p99_ms"] = hp
            if "hp_device_p99_ms" in rows["hp-alone"]:
                out[key]["hp_alone_device_p99_ms"] = rows["hp-alone"]["hp_device_p99_ms"]
    return out


def table(paths, device_side=False):
    """Markdown: HP P99 (ms) and LP throughput (share of the LP alone) per variant over the given
    runs: the value of one run, both of two, the median (min-max) of more. `device_side`: the P99 of
    the service's latencies less the simulator's lateness in answering its waits (sim_job.py)."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    p99, alone_p99 = ("hp_device_p99_ms", "hp_alone_device_p99_ms") if device_side else ("hp_p99_ms", "hp_alone_p99_ms")
    keys = sorted({k for r in runs for k in r["ratios"]}, key=lambda k: (k.split("/")[0], float(k.split("/")[2]),
                                                                        int(k.split("/")[1])))
    windows = sorted({v for r in runs for key in r["ratios"].values() for v in key if v.startswith(LV1_WINDOW)},
                     key=lv1_window_us)
    variants = ["native", "lv1", "lv3"] + windows
    titles = ["native", "Lv1", "Lv3"] + [f"Lv1, window {lv1_window_us(v) / 1000:g} ms" for v in windows]
    hp = "HP P99 on the device's side" if device_side else "HP P99"
    lines = [f"| machine | LP kernel | processes | {hp} alone | "
             + " | ".join(f"{t}: {hp} / LP" for t in titles) + " |",
             "|---|---|---|---|" + "---|" * len(titles)]

    def cell(values, fmt, unit=""):
        if not values:
            return "-"
        if len(values) <= 2:
            return ", ".join(fmt.format(v) for v in values) + unit
        return (f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"
                + unit)
    for key in keys:
        machine, lps, kernel_us = key.split("/")
        per = [r["ratios"][key] for r in runs if key in r["ratios"]]
        row = [machine, f"{float(kernel_us) / 1000:g} ms", f"1 HP + {lps} LP",
               cell([p[alone_p99] for p in per if alone_p99 in p], "{:.1f}", " ms")]
        for v in variants:
            if not any(v in p for p in per):
                row.append("-")
                continue
            row.append(cell([p[v][p99] for p in per if p99 in p.get(v, {})], "{:.1f}", " ms") + " / "
                       + cell([p[v]["lp_share"] for p in per if v in p], "{:.2f}"))
        lines.append("| " + " | ".join(row) + " |")
    revisions = sorted({r['git_revision'][:7] for r in runs})
    cpus = sorted({r["cpu_count"] for r in runs})
    per_row = sorted({sum(key in r["ratios"] for r in runs) for key in keys})
    return "\n".join(lines) + (f"\n\n{len(runs)} results files (revisions {', '.join(revisions)}; "
                               f"{'/'.join(map(str, cpus))} CPUs): {' or '.join(map(str, per_row))} run(s) per row "
                               f"(two: both listed; more: median (min-max)), 501 HP requests each.")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--machines", nargs="+", default=["mi308x", "mi300x"])
    p.add_argument("--lps", nargs="+", type=int, default=[1, 3], help="batch jobs next to the service")
    p.add_argument("--lp-kernel-us", type=float, default=1000.0,
                   help="the batch jobs' kernel length (each fills the GPU): what an HP waits for at Lv1")
    p.add_argument("--seconds", type=float, default=26.0, help="per variant (26 s at 20 req/s: 501 requests)")
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS),
                   help="which variants to run (hp-alone and lp-alone are the baselines of the ratios)")
    p.add_argument("--lv1-windows", nargs="+", type=float, default=[], metavar="US",
                   help="also Lv1 with the batch jobs' window at each US (xsched-lv3 run --window-us): "
                        "Lv1's tail and throughput as the window moves, to set beside Lv3's")
    p.add_argument("--rep", type=int, default=1)
    p.add_argument("--out")
    p.add_argument("--table", nargs="+", metavar="RESULTS")
    p.add_argument("--device-side", action="store_true",
                   help="with --table: the service's P99 less the simulator's lateness in answering its waits")
    args = p.parse_args()
    args.variants += [f"{LV1_WINDOW}{us:g}" for us in args.lv1_windows]
    if args.table:
        print(table(args.table, args.device_side))
        return
    doc = {**provenance(), "serve": SERVE, "batch": BATCH + ["--kernel-us", str(args.lp_kernel_us)],
           "rows": []}
    measure(args, doc)
    doc["ratios"] = ratios(doc)
    print(json.dumps(doc["ratios"], indent=1))
    write_results(args.out or REPO / "results" / f"bench_sim_e2e_r{args.rep}.json", doc)


if __name__ == "__main__":
    main()
