"""GPU hotplug through udev (pyudev, imported only here): KFD topology changes when an amdgpu
device is added, removed or reset, or a partition mode switch re-creates its nodes. Each event
says what happened; the caller re-reads the topology (generation_id changes too)."""
import re
from dataclasses import dataclass

_GPU_NODE = re.compile(r"^(card|renderD)\d+$")


@dataclass
class HotplugEvent:
    action: str          # add | remove | change | bind | unbind
    subsystem: str       # kfd | drm
    device: str          # sys path or node name


def monitor(context=None):
    """A pyudev monitor filtered to what changes the KFD topology."""
    import pyudev
    context = context or pyudev.Context()
    mon = pyudev.Monitor.from_netlink(context)
    mon.filter_by("kfd")
    mon.filter_by("drm")
    return mon


def events(mon, timeout=None):
    """Yield HotplugEvents (stop after `timeout` seconds without one, if given)."""
    while True:
        dev = mon.poll(timeout=timeout)
        if dev is None:
            return
        if dev.subsystem == "drm" and not _GPU_NODE.match(dev.sys_name or ""):
            continue                     # connectors (card1-DP-1) and other drm objects
        yield HotplugEvent(dev.action or "change", dev.subsystem, dev.device_node or dev.sys_path)
