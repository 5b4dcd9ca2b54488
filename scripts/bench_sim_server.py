"""The simulated KFD's request rate: GET_VERSION round trips per second through the real client
(kfdtool.sim.client.SimBackend), with 1, 8 and 64 client processes at once.

    python scripts/bench_sim_server.py [--clients 1 8 64] [--seconds 3] [--out results/bench_sim_server.json]
    python scripts/bench_sim_server.py --table results/bench_sim_server.json      # the README table

Every client is its own process (its own KFD process and connection); all start together, each
counts its round trips for --seconds and times every one of them. GET_VERSION does no work in the
simulated kernel, so the rate is the server's per-request cost (one thread: framing, dispatch,
reply) plus the client's, on this host's CPUs.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import latency_summary, provenance, write_results  # noqa: E402

PRESET = "mi210"


def worker(socket_path, seconds):
    """One client process: connects, says "ready", reads the start time from stdin, then makes
    round trips from then for `seconds` and prints their count and latencies."""
    from kfdtool.ioctls import structs as s
    from kfdtool.ioctls.requests import BY_NAME
    from kfdtool.sim.client import SimBackend
    request = BY_NAME["GET_VERSION"].request()
    backend = SimBackend(socket_path)               # connects and opens /dev/kfd before the clock starts
    args = s.kfd_ioctl_get_version_args()
    print("ready", flush=True)
    start_at = float(sys.stdin.readline())
    while time.time() < start_at:
        time.sleep(0.001)
    latencies = []
    t_end = time.perf_counter() + seconds
    while True:
        t0 = time.perf_counter()
        if t0 >= t_end:
            break
        backend.ioctl(request, args)
        latencies.append(time.perf_counter() - t0)
    backend.close()
    print(json.dumps({"count": len(latencies), "latencies": latencies}), flush=True)


def run_level(socket_path, clients, seconds):
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", str(socket_path), str(seconds)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(clients)]
    for proc in procs:                               # every client started, connected and idle
        if proc.stdout.readline().strip() != "ready":
            sys.exit("a client failed to start")
    start_at = time.time() + 0.2
    for proc in procs:
        proc.stdin.write(f"{start_at}\n")
        proc.stdin.flush()
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=seconds + 120)
        if proc.returncode != 0:
            sys.exit(f"a client exited with {proc.returncode}")
        results.append(json.loads(out))
    total = sum(r["count"] for r in results)
    latencies = [x for r in results for x in r["latencies"]]
    rates = sorted(r["count"] / seconds for r in results)
    return {"clients": clients, "seconds": seconds, "round_trips": total,
            "requests_per_s": round(total / seconds),
            "per_client_min_per_s": round(rates[0]), "per_client_max_per_s": round(rates[-1]),
            **{k: round(v, 4) for k, v in latency_summary(latencies, prefix="round_trip").items()}}


def table(path):
    """The README table of one results file."""
    doc = json.loads(Path(path).read_text())
    lines = ["| clients | round trips/s | per client | p50 | p99 |", "|---|---|---|---|---|"]
    for row in doc["levels"]:
        lines.append(f"| {row['clients']} | {row['requests_per_s']:,} | {row['per_client_min_per_s']:,}–"
                     f"{row['per_client_max_per_s']:,}/s | {row['round_trip_p50_ms']:.2f} ms | "
                     f"{row['round_trip_p99_ms']:.2f} ms |")
    return "\n".join(lines) + "\n"


def main():
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2], float(sys.argv[3]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--out", default="results/bench_sim_server.json")
    parser.add_argument("--table", metavar="RESULTS", help="print the README table of this results file")
    args = parser.parse_args()
    if args.table:
        print(table(args.table), end="")
        return 0
    load_at_start = os.getloadavg()[0]      # other work on the host skews every number
    from kfdtool.sim import runner
    state = tempfile.mkdtemp(prefix="kfdtool-bench-server-")
    os.environ["KFDTOOL_SIM_DIR"] = state
    rows = []
    try:
        sim = runner.start(PRESET, realtime=False)
        for clients in args.clients:
            row = run_level(sim.socket, clients, args.seconds)
            rows.append(row)
            print(f"{clients:3} clients: {row['requests_per_s']:7} round trips/s   per client "
                  f"{row['per_client_min_per_s']}-{row['per_client_max_per_s']}/s   "
                  f"p50 {row['round_trip_p50_ms']:.3f} ms  p99 {row['round_trip_p99_ms']:.3f} ms")
    finally:
        runner.stop(PRESET)
        shutil.rmtree(state, ignore_errors=True)
    doc = {**provenance(), "preset": PRESET, "request": "GET_VERSION", "levels": rows,
           "load_average_at_start": load_at_start}
    write_results(args.out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
