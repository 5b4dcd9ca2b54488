"""GPU hotplug through udev (pyudev, imported only here): KFD topology changes when an amdgpu
device is added, removed or reset, or a partition mode switch re-creates its nodes. Each event
says what happened; the caller re-reads the topology (generation_id changes too)."""
from dataclasses import dataclass


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
        if dev.subsystem == "drm" and not (dev.sys_name or "").startswith(("card", "renderD")):
            continue
        yield HotplugEvent(dev.action or "change", dev.subsystem, dev.device_node or dev.sys_path)
