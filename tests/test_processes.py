"""Process scanning: the parallel scan gives the serial scan's answer, fork_map's safety rules,
and /proc identities that match psutil's."""
import json
import os
import pickle
import subprocess
import sys
import threading
import time

import psutil
import pytest

from conftest import run_cli
from kfdtool import parallel, processes
from kfdtool.processes import KfdProcess, identify, scan_processes


def write_proc_tree(root, pids, gpus=(1001, 1002), queues_per_proc=3):
    """class/kfd/kfd/proc/<pid> as the kernel lays it out: every GPU has vram_/sdma_/stats_
    entries, queues/<qid>/{type,gpuid,size}."""
    proc = root / "class" / "kfd" / "kfd" / "proc"
    for i, pid in enumerate(pids):
        d = proc / str(pid)
        used = gpus[i % len(gpus)]
        for gpu in gpus:
            (d / f"stats_{gpu}").mkdir(parents=True)
            (d / f"vram_{gpu}").write_text(f"{(i + 1) << 20 if gpu == used else 0}\n")
            (d / f"sdma_{gpu}").write_text(f"{i}\n")
            (d / f"stats_{gpu}" / "evicted_ms").write_text(f"{i % 7}\n")
        for qid in range(queues_per_proc):
            q = d / "queues" / str(qid)
            q.mkdir(parents=True)
            (q / "type").write_text("0\n")
            (q / "gpuid").write_text(f"{used}\n")
            (q / "size").write_text(f"{4096 << qid}\n")
    return root


def test_parallel_scan_gives_the_serial_answer(tmp_path, monkeypatch):
    root = write_proc_tree(tmp_path, range(100, 400))
    # exclude_self off: in a fresh container (a CI runner) this test's own pid can be one of 100..399,
    # and the scan leaves its own process out by default (seen: 299 of 300)
    serial = scan_processes(root, with_identity=False, workers=1, exclude_self=False)
    forks = []
    real_fork = os.fork
    parent = os.getpid()

    def counting_fork():
        if os.getpid() == parent:
            forks.append(1)
        return real_fork()

    monkeypatch.setattr(os, "fork", counting_fork)
    monkeypatch.setattr(processes, "PROCESSES_PER_WORKER", 50)
    parallel_scan = scan_processes(root, with_identity=False, workers=4, exclude_self=False)
    assert len(forks) == 3                          # three shares in children, one here
    assert parallel_scan.to_dict() == serial.to_dict()
    assert len(serial.processes) == 300
    p = serial.processes[5]
    assert p.pid == 105 and p.gpu_ids == [1002] and p.vram == {1001: 0, 1002: 6 << 20}
    assert [q.size for q in p.queues] == [4096, 8192, 16384] and p.evicted_ms == {1002: 5}


def test_a_failed_worker_share_is_redone_here():
    parent = os.getpid()

    def fn(chunk):
        if os.getpid() != parent:
            raise RuntimeError("worker broke")
        return [x * 2 for x in chunk]

    assert parallel.fork_map(fn, [[1, 2], [3], [4, 5]]) == [[2, 4], [6], [8, 10]]


def test_an_error_here_reaps_the_workers():
    parent = os.getpid()

    def fn(chunk):
        if os.getpid() == parent:
            raise ValueError("bad share")
        time.sleep(30)
        return chunk

    before = set(psutil.Process().children())
    with pytest.raises(ValueError):
        parallel.fork_map(fn, [[1], [2], [3]])
    assert set(psutil.Process().children()) == before       # killed and waited for, no zombies


def test_a_process_with_threads_never_forks():
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        pids = parallel.fork_map(lambda chunk: os.getpid(), [[1], [2], [3]])
    finally:
        stop.set()
        t.join()
    assert pids == [os.getpid()] * 3


def test_split_keeps_order_and_sizes():
    assert parallel.split(list(range(10)), 3, max_chunks=3) == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert parallel.split(list(range(10)), 100, max_chunks=8) == [list(range(10))]
    assert parallel.split([], 5, max_chunks=4) == [[]]


def test_identity_matches_psutil(tmp_path):
    long_name = tmp_path / "kfd-inference-server-long"          # comm keeps only 15 bytes of it
    long_name.symlink_to("/bin/sleep")
    children = [subprocess.Popen([str(long_name), "30"]),
                subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "a b", ""]),
                subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "x" * 100_000, "end"])]
    try:
        time.sleep(0.2)
        for pid in [os.getpid()] + [c.pid for c in children]:
            mine, theirs = KfdProcess(pid), psutil.Process(pid)
            assert identify(mine)
            assert (mine.name, mine.cmdline, mine.user) == (theirs.name(), theirs.cmdline(), theirs.username())
        assert mine.cmdline[-1] == "end"
        second = KfdProcess(children[1].pid)
        identify(second)
        assert second.cmdline[-2:] == ["a b", ""]
        first = KfdProcess(children[0].pid)
        identify(first)
        assert first.name == "kfd-inference-server-long"
    finally:
        for c in children:
            c.kill()
            c.wait()


def test_identity_from_an_injected_procfs(tmp_path):
    """NSpid's last field is the pid inside the container; Uid's first the real uid."""
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "status").write_bytes(b"Name:\tvllm\nUmask:\t0022\nUid:\t0\t1000\t1000\t1000\n"
                                               b"NSpid:\t4242\t17\n")
    (tmp_path / "4242" / "cmdline").write_bytes(b"python\0-m\0vllm\0")
    proc = KfdProcess(4242)
    assert identify(proc, procfs=tmp_path)
    assert (proc.name, proc.user, proc.container_pid, proc.cmdline) == ("vllm", "root", 17, ["python", "-m", "vllm"])


def test_gone_process_is_not_identified(tmp_path):
    child = subprocess.Popen(["true"])
    child.wait()
    assert not identify(KfdProcess(child.pid))


@pytest.mark.parametrize("raw, argv", [
    ("", []),
    ("python\0-c\0pass\0", ["python", "-c", "pass"]),
    ("nginx: worker process", ["nginx:", "worker", "process"]),       # setproctitle rewrite
    ("chrome --type=renderer\0", ["chrome", "--type=renderer"]),      # one NUL-terminated string
    ("a\0\0b\0", ["a", "", "b"]),
])
def test_cmdline_splitting_follows_psutil(raw, argv):
    assert processes._split_cmdline(raw) == argv


def test_records_compare_print_and_pickle_by_value():
    proc = KfdProcess(7, name="vllm", queues=[processes.KfdQueue(0, 1001, 0, "compute", 4096)], vram={1001: 1 << 30})
    scan = processes.ProcessScan([proc], unreadable=1)
    copy = pickle.loads(pickle.dumps(scan))
    assert copy == scan and copy.processes[0].vram == {1001: 1 << 30} and copy is not scan
    assert copy.processes[0].queues[0] != processes.KfdQueue(0, 1001, 0, "compute", 8192)
    assert repr(proc.queues[0]) == ("KfdQueue(qid=0, gpu_id=1001, type_code=0, type_name='compute', "
                                    "size=4096, suspended_by=None)")


def test_cli_scan_of_many_live_processes(tmp_path):
    """`kfdtool queues --json` over 520 live processes: enough for two workers where there are
    two CPUs. Every process is listed once, named by its /proc entry."""
    sleepers = [subprocess.Popen(["sleep", "60"]) for _ in range(520)]
    try:
        root = write_proc_tree(tmp_path, [p.pid for p in sleepers])
        kfd = root / "class" / "kfd" / "kfd"
        (kfd / "topology" / "nodes").mkdir(parents=True)
        (kfd / "topology" / "generation_id").write_text("1\n")
        result = run_cli("--sysfs-root", str(root), "queues", "--json")
        assert result.returncode == 0, result.stderr
        doc = json.loads(result.stdout)
        assert sorted(p["pid"] for p in doc["processes"]) == sorted(p.pid for p in sleepers)
        assert {p["name"] for p in doc["processes"]} == {"sleep"} and doc["vanished"] == 0
        assert all(len(p["queues"]) == 3 for p in doc["processes"])
    finally:
        for p in sleepers:
            p.kill()
        for p in sleepers:
            p.wait()
