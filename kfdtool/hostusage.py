"""CPU and host memory of GPU processes, for live views: psutil's cpu_percent and RSS.

A GPU job that is short of CPU (a launch-bound inference server, a data loader) shows up here
before it shows up as idle GPU queues. cpu_percent measures between two calls on the same
psutil.Process, so the objects are kept per pid across refreshes.
"""


class HostUsage:
    def __init__(self):
        import psutil
        self._psutil = psutil
        self._procs = {}

    def sample(self, pids):
        """{pid: (cpu_percent or None, rss_bytes or None)}; cpu is None on a pid's first sample
        (no interval yet) and both are None for a process we may not read or that is gone."""
        usage = {}
        for pid in pids:
            proc = self._procs.get(pid)
            first = proc is None
            try:
                if first:
                    proc = self._procs[pid] = self._psutil.Process(pid)
                with proc.oneshot():
                    cpu, rss = proc.cpu_percent(), proc.memory_info().rss
                usage[pid] = (None if first else cpu, rss)
            except (self._psutil.NoSuchProcess, self._psutil.AccessDenied):
                usage[pid] = (None, None)
        for gone in self._procs.keys() - set(pids):
            del self._procs[gone]
        return usage
