"""kfdtool monitor (live view) and the udev hotplug event filter."""
import os
import subprocess
import sys
import time
import types

from conftest import run_cli
from kfdtool.cli.sim_cmd import spawn_workload
from kfdtool.hostusage import HostUsage
from kfdtool.hotplug import events
from simhelpers import start


def test_monitor_shows_processes_and_counts_refreshes(sim_dir):
    start("mi308x")
    pid = spawn_workload("mi308x", "watched", queues=2)
    try:
        result = run_cli("--sim", "mi308x", "monitor", "--count", "2", "--interval", "0.2")
        assert result.returncode == 0, result.stderr
        assert "kfdtool monitor" in result.stdout and str(pid) in result.stdout and "watched" in result.stdout
        assert "CPU %" in result.stdout and "RSS" in result.stdout and "MiB" in result.stdout
        assert result.stdout.count("kfdtool monitor") == 2      # not a terminal: every refresh, as top -b
    finally:
        os.kill(pid, 9)


def test_monitor_into_a_pipe_shows_each_refresh_as_it_comes(sim_dir):
    """`kfdtool monitor | ...` without --count: the first table arrives at once, not at exit."""
    start("mi308x")
    proc = subprocess.Popen([sys.executable, "-m", "kfdtool", "--sim", "mi308x", "monitor", "--interval", "5"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert "kfdtool monitor" in proc.stdout.readline()
    finally:
        proc.kill()
        proc.wait()


def test_host_usage_sees_a_busy_process_and_forgets_gone_ones():
    # the child says when it runs its loop: sampled earlier, it is still exec'ing (RSS not yet there)
    busy = subprocess.Popen([sys.executable, "-c", "print(flush=True)\nwhile True: pass"], stdout=subprocess.PIPE)
    busy.stdout.readline()
    idle = subprocess.Popen(["sleep", "30"])
    try:
        host = HostUsage()
        first = host.sample([busy.pid, idle.pid])
        assert first[busy.pid][0] is None and first[busy.pid][1] > 1 << 20     # no interval yet; RSS known
        time.sleep(0.5)
        second = host.sample([busy.pid, idle.pid])
        assert second[busy.pid][0] > 50 and second[idle.pid][0] < 5
        idle.kill()
        idle.wait()
        assert host.sample([busy.pid, idle.pid])[idle.pid] == (None, None)
        host.sample([busy.pid])
        assert idle.pid not in host._procs
    finally:
        busy.kill()
        busy.wait()


def test_monitor_shows_the_busiest_rows_that_fit():
    from rich.console import Console
    from kfdtool.cli.monitor_cmd import _grid
    from kfdtool.processes import ProcessScan
    rows = [{"pid": 100 + i, "name": f"job{i}", "cpu": float(i * 10), "rss": 1 << 20, "gpu": 7, "queues": 1,
             "suspended": 0, "vram": (10 - i) << 30, "cu_occupancy": None, "sdma_pct": None, "evict_rate": None}
            for i in range(10)]

    def shown(sort, limit):
        out = Console(width=200, record=True)
        out.print(_grid(ProcessScan([]), rows, sort, limit, []))
        text = out.export_text()
        return [name for name in (f"job{i}" for i in range(10)) if name in text], text

    names, text = shown("cpu", 3)
    assert names == ["job7", "job8", "job9"] and "7 more rows below" in text
    assert text.index("job9") < text.index("job8") < text.index("job7")          # largest first
    names, text = shown("vram", None)
    assert len(names) == 10 and "more rows" not in text and text.index("job0") < text.index("job9")


def test_monitor_bad_interval():
    result = run_cli("--sim", "mi308x", "monitor", "--interval", "0")
    assert result.returncode == 2 and "argument --interval: must be > 0" in result.stderr     # a usage error


class FakeMonitor:
    def __init__(self, devices):
        self.devices = list(devices)

    def poll(self, timeout=None):
        return self.devices.pop(0) if self.devices else None


def dev(subsystem, sys_name, action, node=None):
    return types.SimpleNamespace(subsystem=subsystem, sys_name=sys_name, action=action, device_node=node,
                                 sys_path=f"/sys/class/{subsystem}/{sys_name}")


def test_hotplug_events_keep_gpu_nodes_only():
    mon = FakeMonitor([dev("drm", "card1", "add", "/dev/dri/card1"), dev("drm", "card1-DP-1", "change"),
                       dev("kfd", "kfd", "change", "/dev/kfd"), dev("drm", "renderD129", "remove", "/dev/dri/renderD129")])
    got = [(e.subsystem, e.action, e.device) for e in events(mon, timeout=0)]
    assert got == [("drm", "add", "/dev/dri/card1"), ("kfd", "change", "/dev/kfd"),
                   ("drm", "remove", "/dev/dri/renderD129")]
