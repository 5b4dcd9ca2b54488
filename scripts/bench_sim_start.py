"""How long `kfdtool sim start PRESET` takes, for every preset: first starts, each in an empty
state directory (it builds the sysfs tree), and the starts after one (the tree is kept while current).

    python scripts/bench_sim_start.py [--firsts 5] [--restarts 5] [--out results/bench_sim_start.json]
    python scripts/bench_sim_start.py --table results/bench_sim_start.json results/bench_sim_start_before.json

Each start is the real command in a subprocess, timed from exec to exit (it returns once the
server is ready), followed by `kfdtool sim stop`. The state directories are fresh ones under --dir
(default: the system's temporary directory); its filesystem is recorded, since a first start is
dominated by creating thousands of files there, and so is the load average, since other work on
the host slows file creation most of all. The kfdtool measured is the one `python -m kfdtool`
imports (PYTHONPATH can point it at another checkout; BENCH_GIT_REVISION then names that one).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import provenance  # noqa: E402

TARGET_S = 1.0          # issue 9: `kfdtool sim start` in at most a second for every preset


def kfdtool(*args, env):
    t0 = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "kfdtool", *args], env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if result.returncode != 0:
        sys.exit(f"kfdtool {' '.join(args)} failed: {result.stderr.strip()}")
    return elapsed


def filesystem_of(path):
    try:
        out = subprocess.run(["df", "--output=fstype", str(path)], capture_output=True, text=True, timeout=10)
        return out.stdout.split()[-1] if out.returncode == 0 else None
    except OSError:
        return None


def table(after, before):
    """The README table: this version's starts next to an earlier version's (same script)."""
    rows_after, rows_before = (json.loads(Path(p).read_text()) for p in (after, before))
    earlier = {r["preset"]: r for r in rows_before["presets"]}
    lines = ["| preset | first start, median (max) | restarts, median (max) | before: first start | before: restarts |",
             "|---|---|---|---|---|"]
    for r in rows_after["presets"]:
        was = earlier.get(r["preset"])
        before = f"{_spread(was, 'first_start')} | {_spread(was, 'restart')}" if was else "– | –"
        lines.append(f"| {r['preset']} | {_spread(r, 'first_start')} | {_spread(r, 'restart')} | {before} |")
    return "\n".join(lines) + "\n"


def _spread(row, what):
    """'median (max)', or the one time of a results file that measured one first start."""
    if what == "first_start" and "first_start_median_s" not in row:
        return f"{row['first_start_s']:.2f} s"
    return f"{row[what + '_median_s']:.2f} s ({row[what + '_max_s']:.2f} s)"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--firsts", type=int, default=5, help="first starts per preset, each in an empty directory")
    parser.add_argument("--restarts", type=int, default=5, help="starts after a first one, per preset")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the fresh state directory goes")
    parser.add_argument("--out", default="results/bench_sim_start.json")
    parser.add_argument("--table", nargs=2, metavar=("RESULTS", "EARLIER_RESULTS"),
                        help="print the README table of these results files")
    args = parser.parse_args()
    if args.table:
        print(table(*args.table), end="")
        return 0
    load_at_start = os.getloadavg()[0]      # other work on the host skews every number
    import kfdtool as measured
    from kfdtool.sim.machine import PRESETS
    rows = []
    for preset in PRESETS:
        firsts, again = [], []
        for _ in range(args.firsts):
            state = Path(tempfile.mkdtemp(prefix="kfdtool-bench-start-", dir=args.dir))
            env = {**os.environ, "KFDTOOL_SIM_DIR": str(state)}
            try:
                firsts.append(kfdtool("sim", "start", preset, env=env))
                kfdtool("sim", "stop", preset, env=env)
                if len(firsts) == args.firsts:
                    for _ in range(args.restarts):
                        again.append(kfdtool("sim", "start", preset, env=env))
                        kfdtool("sim", "stop", preset, env=env)
            finally:
                shutil.rmtree(state, ignore_errors=True)
        row = {"preset": preset, "first_start_median_s": round(statistics.median(firsts), 3),
               "first_start_max_s": round(max(firsts), 3), "first_starts_s": [round(t, 3) for t in firsts],
               "restart_median_s": round(statistics.median(again), 3), "restart_max_s": round(max(again), 3),
               "within_target": max(firsts + again) <= TARGET_S}
        rows.append(row)
        print(f"{preset:12} first start median {row['first_start_median_s']:.2f} s  max {row['first_start_max_s']:.2f} s"
              f"   restart median {row['restart_median_s']:.2f} s  max {row['restart_max_s']:.2f} s")
    doc = {**provenance(), "target_s": TARGET_S, "first_starts_per_preset": args.firsts,
           "restarts_per_preset": args.restarts, "kfdtool_measured": str(Path(measured.__file__).parent),
           "state_dir_filesystem": filesystem_of(args.dir),
           "load_average_at_start": load_at_start, "load_average_at_end": os.getloadavg()[0], "presets": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0 if all(r["within_target"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
