"""kfdtool monitor (live view) and the udev hotplug event filter."""
import os
import types

from conftest import run_cli
from kfdtool.cli.sim_cmd import spawn_workload
from kfdtool.hotplug import events
from simhelpers import start


def test_monitor_shows_processes_and_counts_refreshes(sim_dir):
    start("mi308x")
    pid = spawn_workload("mi308x", "watched", queues=2)
    try:
        result = run_cli("--sim", "mi308x", "monitor", "--count", "2", "--interval", "0.2")
        assert result.returncode == 0, result.stderr
        assert "kfdtool monitor" in result.stdout and str(pid) in result.stdout and "watched" in result.stdout
    finally:
        os.kill(pid, 9)


def test_monitor_bad_interval():
    result = run_cli("--sim", "mi308x", "monitor", "--interval", "0")
    assert result.returncode == 1 and "interval must be > 0" in result.stderr


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
