#!/usr/bin/env python3
"""What a ptrace window around each DBG_TRAP op costs: `kfdtool preempt --json` of another process's
queues, its suspend and resume wall times, on one simulated machine started with the 7.2 profile
(ABI 1.23: the process that did ENABLE may make every later op) and with the 6.12 profile (ABI 1.17:
only the ptrace parent may, so each op is made inside PTRACE_SEIZE ... detach). The runs alternate
between the two kernels; the machine is restarted for each (a simulator runs one profile).

    python scripts/probes/ptrace_window_cost.py [--machine mi308x] [--rounds 30] [--out FILE]

Times are the simulator's (a socket round trip per call, its timing model paid in real time) plus
the ptrace calls, which are real: the difference between the two profiles is the windows' cost.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchlib import provenance, write_results  # noqa: E402

PY = sys.executable
PROFILES = {"7.2 (ABI 1.23)": "1.23", "6.12 (ABI 1.17)": "1.17"}


def one_round(machine, abi, env):
    from kfdtool.cli.sim_cmd import spawn_workload
    from kfdtool.sim import runner
    runner.stop(machine)
    runner.start(machine, abi)
    pid = spawn_workload(machine, "victim", queues=2, waves=200)
    try:
        r = subprocess.run([PY, "-m", "kfdtool", "--sim", machine, "preempt", "--pid", str(pid), "--for", "1ms",
                            "--json"], capture_output=True, text=True, env=env, timeout=60, check=True)
        report = json.loads(r.stdout)
        assert {q["outcome"] for q in report["suspend"] + report["resume"]} == {"suspended", "resumed"}, report
        return report["suspend_s"], report["resume_s"]
    finally:
        os.kill(pid, 9)
        runner.stop(machine)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--machine", default="mi308x")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--out")
    args = p.parse_args()
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    with tempfile.TemporaryDirectory(prefix="ptrace-window-") as tmp:
        env = dict(os.environ, KFDTOOL_SIM_DIR=f"{tmp}/sims", KFDTOOL_RUN_DIR=f"{tmp}/run")
        os.environ.update(env)
        times = {name: {"suspend_ms": [], "resume_ms": []} for name in PROFILES}
        for _ in range(args.rounds):
            for name, abi in PROFILES.items():
                suspend_s, resume_s = one_round(args.machine, abi, env)
                times[name]["suspend_ms"].append(suspend_s * 1e3)
                times[name]["resume_ms"].append(resume_s * 1e3)
    summary = {name: {k: {"median": round(statistics.median(v), 3), "min": round(min(v), 3), "max": round(max(v), 3)}
                      for k, v in t.items()} for name, t in times.items()}
    doc = {**provenance(), "machine": args.machine, "rounds": args.rounds, "summary": summary, "times": times}
    print(json.dumps(summary, indent=1))
    if args.out:
        write_results(args.out, doc)


if __name__ == "__main__":
    main()
