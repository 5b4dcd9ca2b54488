"""The benchmarks' harness (scripts/benchlib.py): a comparison of two trees runs each tree's
scheduler in its programs, or says it did not."""
import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import benchlib  # noqa: E402

# A program as the benchmarks start one: READY, the start time on stdin, one JSON line; and the report
# that `xsched-lv3 run` has its process write (runenv._write_report), naming the xsched_lv3 it imported.
PROGRAM = """
import json, os, sys
{prelude}
import xsched_lv3
package = os.path.dirname(os.path.abspath(xsched_lv3.__file__))
with open(os.environ["XSCHED_LV3_REPORT"], "w") as f:
    json.dump({{"package": package}}, f)
print("READY", flush=True)
input()
print(json.dumps({{"imported": package}}))
"""


def program(directory, prelude=""):
    """The program as a script (as serve.py is: its own directory first on sys.path, not the cwd)."""
    path = directory / "program.py"
    path.write_text(PROGRAM.format(prelude=prelude))
    return [sys.executable, str(path)]


@pytest.fixture
def other_tree(tmp_path, monkeypatch):
    """Another release's tree, named relative to the current directory (as `--baseline .baseline`)."""
    shutil.copytree(REPO / "xsched_lv3", tmp_path / "old" / "xsched_lv3",
                    ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(REPO))       # this tree further down, as on the device machine
    return Path("old")


def test_a_relative_baseline_checkout_schedules_its_programs_with_its_own_package(other_tree):
    """Seen on the device machine: `--baseline .baseline` with this tree on PYTHONPATH ran this
    tree's scheduler in the baseline's programs (the relative path named nothing from their cwd)."""
    (out,) = benchlib.run_together([program(Path.cwd())], 30, checkout=other_tree)
    assert Path(out["imported"]) == (other_tree / "xsched_lv3").resolve()


def test_a_program_scheduled_by_another_tree_is_an_error(other_tree):
    imports_this_tree = program(Path.cwd(), prelude=f"sys.path.insert(0, {str(REPO)!r})")
    with pytest.raises(RuntimeError, match="not by"):
        benchlib.run_together([imports_this_tree], 30, checkout=other_tree)


def test_a_threads_mode_program_names_its_scheduler_in_its_output_and_is_checked(other_tree):
    """pair_threads.py writes no report: its gates' stats are in its output, with the package."""
    path = Path.cwd() / "threads.py"
    path.write_text(f"""
import json, sys
sys.path.insert(0, {str(REPO)!r})
import xsched_lv3
print("READY", flush=True)
input()
print(json.dumps({{"lp_gate": {{"package": xsched_lv3.__path__[0]}}}}))
""")
    with pytest.raises(RuntimeError, match="not by"):
        benchlib.run_together([[sys.executable, str(path)]], 30, checkout=other_tree)


def test_the_report_of_a_scheduled_process_names_its_package(tmp_path):
    """What the check reads (runenv._write_report): without it, every check would pass unseen."""
    import json

    from xsched_lv3 import runenv

    class Gate:
        def stats(self):
            return {"requests": 3}
    runenv._write_report(tmp_path / "child.json", Gate(), os.getpid() + 1)     # a forked child's exit: the parent's
    assert not (tmp_path / "child.json").exists()
    runenv._write_report(tmp_path / "report.json", Gate(), os.getpid())
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["requests"] == 3 and Path(report["package"]) == REPO / "xsched_lv3"


def test_an_ab_of_two_schedulers_can_leave_out_the_unscheduled_co_run():
    """`--no-native` (a pair's A/B then fits one device call): the baseline's run still comes before
    this tree's, and without anything to compare it with the option is refused."""
    import subprocess
    from argparse import Namespace
    import bench_two_models
    args = Namespace(no_native=True, baseline="/some/tree", strict=False, stream_priority=False)
    assert bench_two_models.co_run_variants("processes", args) == ["xsched-baseline", "xsched"]
    args.no_native = False
    assert bench_two_models.co_run_variants("threads", args) == ["native-threads", "xsched-threads-baseline",
                                                                 "xsched-threads"]
    args.stream_priority, args.baseline = True, None           # threads only: the service's stream prioritised
    assert bench_two_models.co_run_variants("threads", args) == ["native-threads", "xsched-threads",
                                                                 "native-threads-prio", "xsched-threads-prio"]
    assert bench_two_models.co_run_variants("processes", args) == ["native", "xsched"]
    assert "--hp-stream-priority" in bench_two_models.commands("xsched-threads-prio", "r18b4-r50b64", 26)[0]
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_two_models.py"), "--no-native"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--no-native leaves a single co-run" in out.stderr


class ScriptedGpu:
    """A clock that a batch iteration moves by its duration (the iterations take `durations_s` in turn)."""
    def __init__(self, durations_s):
        self.now, self.durations = 0.0, list(durations_s)

    def clock(self):
        return self.now

    def step(self):
        self.now += self.durations.pop(0) if len(self.durations) > 1 else self.durations[0]


def test_work_between_requests_fills_each_gap_begins_none_it_expects_to_overrun_and_outlives_a_slow_one():
    """The perfect-preemption baseline (serve.py --between-requests): the batch job's iterations run in
    each gap, one expected to still run at the next arrival is not begun, and an unexpectedly slow one
    is counted (that request was not alone) without stopping the work in later gaps."""
    sys.path.insert(0, str(REPO / "scripts" / "workloads"))
    from serve import GapWork
    gpu = ScriptedGpu([0.010])
    work = GapWork(gpu.step, gpu.clock)
    assert gpu.now == pytest.approx(0.030)              # three timed iterations: its first estimate
    work(next_arrival=gpu.now + 0.050)                  # a 50 ms gap: 10 ms iterations while > 13.5 ms remain
    assert work.iterations == 4 and work.late == 0
    gpu.durations = [0.060, 0.010]                      # one slow iteration does not stop the work
    for _ in range(3):
        arrival = gpu.now + 0.050
        before = work.iterations
        work(next_arrival=arrival)
        assert work.iterations > before
    assert work.late == 1                               # the slow one ran into its arrival, and says so
    assert work.report() == {"gap_iterations": work.iterations, "gap_late": 1}


def test_the_perfect_preemption_baseline_runs_the_pairs_batch_job_between_the_services_requests():
    import bench_two_models
    (serve,) = bench_two_models.commands("hp-lp-between", "r18b4-r50b32train", 26)
    assert serve[1].endswith("serve.py") and serve[serve.index("--between-requests") + 1] == "resnet50:32:train"
    out = __import__("subprocess").run(
        [sys.executable, str(REPO / "scripts" / "workloads" / "serve.py"), "--between-requests", "resnet50"],
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--between-requests wants MODEL:BATCH[:train]" in out.stderr


def test_an_ab_records_which_commit_its_baseline_tree_was(other_tree, monkeypatch):
    """A results file of two schedulers names both: the baseline's commit from git where the tree is a
    checkout, else from BENCH_BASELINE_REVISION (a `git archive` copied to the device machine)."""
    import bench_two_models
    monkeypatch.delenv("BENCH_BASELINE_REVISION", raising=False)
    assert bench_two_models.baseline_provenance(other_tree)["git_revision"] == "unknown"
    monkeypatch.setenv("BENCH_BASELINE_REVISION", "c8ac8ca")
    assert bench_two_models.baseline_provenance(other_tree) == {"checkout": str(other_tree.resolve()),
                                                               "git_revision": "c8ac8ca"}
    assert bench_two_models.baseline_provenance(REPO)["git_revision"] == benchlib.git_revision_of(REPO)


def test_the_open_loop_tells_a_late_start_from_a_slow_request(monkeypatch):
    """A request that begins late (the previous one overran its arrival) shows in wake_late; a slow
    one shows only in its latency. The results row keeps both, request by request."""
    clock = {"now": 0.0}
    monkeypatch.setattr(benchlib.time, "monotonic", lambda: clock["now"])
    monkeypatch.setattr(benchlib.time, "sleep", lambda s: clock.__setitem__("now", clock["now"] + s))
    durations = iter([0.001, 0.150, 0.001, 0.001, 0.001])     # the second overruns the next two arrivals

    def request():
        clock["now"] += next(durations)
    late = []
    latencies = benchlib.open_loop(10, 0.4, request, t0=0.0, wake_late=late)
    assert [round(x, 3) for x in latencies] == [0.001, 0.150, 0.051, 0.001, 0.001]
    assert [round(x, 3) for x in late] == [0.0, 0.0, 0.050, 0.0, 0.0]
    import bench_two_models
    row = bench_two_models.summarize({"hp_latencies_s": latencies, "hp_wake_late_s": late})
    assert row["hp_max_ms"] == pytest.approx(150) and row["hp_wake_late_max_ms"] == pytest.approx(50)
    assert row["hp_latencies_ms"][2] == pytest.approx(51) and row["hp_wake_late_ms"][2] == pytest.approx(50)


def test_the_table_counts_the_requests_a_stalling_host_slowed_in_every_variant():
    """Under the table: per pair and variant, the requests over STALL_FACTOR x the service's P50 alone,
    from runs that recorded every request (a host that stalls shows in the service alone too)."""
    import bench_two_models
    fast, stalled = [3.0] * 98, [3.0] * 95 + [40.0] * 3
    doc = {"rows": [
        {"pair": "r18b4-r50b16", "variant": "hp-alone", "hp_p50_ms": 3.0, "hp_latencies_ms": stalled},
        {"pair": "r18b4-r50b16", "variant": "xsched", "hp_p50_ms": 3.0, "hp_latencies_ms": fast + [9.5, 8.9]},
        {"pair": "r18b4-r50b64", "variant": "xsched", "hp_p50_ms": 3.0},      # no per-request record: not counted
    ]}
    note = bench_two_models.stalls_note([doc, doc], {"r18b4-r50b16": "b16", "r18b4-r50b64": "b64"},
                                        ["hp-alone", "xsched"])
    assert "- b16: hp-alone 6 of 196, xsched 2 of 200\n" in note and "b64" not in note
    assert bench_two_models.stalls_note([{"rows": doc["rows"][2:]}], {}, []) == ""


def test_the_service_says_how_long_each_counted_request_waited_for_the_gpu_after_launching(monkeypatch):
    """serve.py's latency split: after a request's last launch returns, the time until its result is
    on the CPU (the GPU's part the launching did not hide). One entry per counted request, in order,
    the warm-up's left out; the results row keeps it request by request."""
    import contextlib
    import types
    sys.path.insert(0, str(REPO / "scripts" / "workloads"))
    import serve
    clock = {"now": 0.0}
    tick = lambda s: clock.__setitem__("now", clock["now"] + s)       # noqa: E731
    for module in (serve.time, benchlib.time):
        monkeypatch.setattr(module, "monotonic", lambda: clock["now"])
        monkeypatch.setattr(module, "sleep", tick)
    gpu_behind = iter([0.001, 0.002, 0.003, 0.004, 0.020])          # what the GPU still has at each sync
    stream = types.SimpleNamespace(synchronize=lambda: tick(next(gpu_behind)))
    fake = types.SimpleNamespace(no_grad=contextlib.nullcontext, cuda=types.SimpleNamespace(current_stream=lambda: stream))
    monkeypatch.setitem(sys.modules, "torch", fake)

    def model(x):
        tick(0.003)                                     # launching takes 3 ms of the CPU
    out = serve.serve(model, None, rate=10, seconds=0.4, warmup_s=0.1, start_at=0.0)
    assert [round(s, 3) for s in out["hp_latencies_s"]] == [0.005, 0.006, 0.007, 0.023]
    assert [round(s, 3) for s in out["hp_gpu_wait_s"]] == [0.002, 0.003, 0.004, 0.020]
    import bench_two_models
    row = bench_two_models.summarize(out)
    assert row["hp_gpu_wait_ms"] == [2.0, 3.0, 4.0, 20.0] and row["hp_gpu_wait_max_ms"] == pytest.approx(20)


def test_gc_pauses_are_timed_from_the_origin_a_caller_names():
    """BENCH_GC_LOG's record: a full collection shows as generation 2, at a moment counted from
    the origin given (the run's common start), however long after the recorder began."""
    import gc
    import time
    from benchlib import GcPauses
    pauses = GcPauses(min_ms=0)
    try:
        origin = time.monotonic()
        gc.collect()
        t, generation, ms = pauses.since(origin)[-1]
        assert generation == 2 and ms >= 0 and 0 <= t <= time.monotonic() - origin
    finally:
        pauses.close()
    gc.collect()
    assert pauses.since(origin)[-1][0] <= t        # closed: no later collection recorded
