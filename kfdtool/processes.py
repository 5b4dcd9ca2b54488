"""KFD processes and their queues from ``/sys/class/kfd/kfd/proc`` (never opens /dev/kfd),
enriched with psutil. Processes that exit mid-scan are dropped; unreadable ones are counted.

    >>> scan = scan_processes()
    >>> for proc in scan.processes: print(proc.pid, proc.name, [q.qid for q in proc.queues])
"""
import os
import pwd
import re
from dataclasses import dataclass, field

from .sysfs import SysfsRoot

# Kernel-internal queue types as sysfs prints them in proc/<pid>/queues/<qid>/type: not the ioctl
# KFD_IOC_QUEUE_TYPE_* values, and the numbering moved when DIQ was removed (kfd_priv.h, 6.12 vs 7.2).
SYSFS_QUEUE_TYPES_L612 = {0: "compute", 1: "sdma", 2: "hiq", 3: "diq", 4: "sdma_xgmi", 5: "sdma_by_eng_id"}
SYSFS_QUEUE_TYPES_L72 = {0: "compute", 1: "sdma", 2: "hiq", 3: "sdma_xgmi", 4: "sdma_by_eng_id"}

_PER_GPU = re.compile(r"^(vram|sdma)_(\d+)$")


@dataclass
class KfdQueue:
    qid: int
    gpu_id: int | None
    type_code: int | None
    type_name: str
    size: int | None
    suspended_by: int | None = None      # pid of a live `kfdtool preempt` holding it (kernel: unknown)

    def to_dict(self):
        return {"qid": self.qid, "gpu_id": self.gpu_id, "type": self.type_name,
                "type_code": self.type_code, "ring_size": self.size, "suspended_by": self.suspended_by}


@dataclass
class KfdProcess:
    pid: int
    name: str | None = None
    user: str | None = None
    cmdline: list = field(default_factory=list)
    container_pid: int | None = None          # innermost NSpid when it differs from pid
    queues: list = field(default_factory=list)
    vram: dict = field(default_factory=dict)          # gpu_id -> bytes
    sdma_us: dict = field(default_factory=dict)       # gpu_id -> µs of SDMA activity
    evicted_ms: dict = field(default_factory=dict)    # gpu_id -> ms evicted in total
    cu_occupancy: dict = field(default_factory=dict)  # gpu_id -> CUs' worth of waves in flight
    counters: dict = field(default_factory=dict)      # gpu_id -> {faults, page_in, page_out}

    @property
    def gpu_ids(self):
        """GPUs this process uses: has queues on, or VRAM allocated on (every GPU it could access
        has sysfs entries, mostly zero)."""
        used = {g for g, v in self.vram.items() if v} | {q.gpu_id for q in self.queues if q.gpu_id is not None}
        return sorted(used)

    def to_dict(self):
        per_gpu = {str(g): {"vram_bytes": self.vram.get(g), "sdma_us": self.sdma_us.get(g),
                            "evicted_ms": self.evicted_ms.get(g), "cu_occupancy": self.cu_occupancy.get(g),
                            **({"counters": self.counters[g]} if g in self.counters else {})}
                   for g in self.gpu_ids}
        return {"pid": self.pid, "name": self.name, "user": self.user, "cmdline": self.cmdline,
                "container_pid": self.container_pid, "gpus": per_gpu,
                "queues": [q.to_dict() for q in self.queues]}


@dataclass
class ProcessScan:
    processes: list
    unreadable: int = 0          # entries we could not read (permission, I/O)
    vanished: int = 0            # exited between listing and reading

    def to_dict(self):
        return {"schema": "kfdtool.queues/1", "processes": [p.to_dict() for p in self.processes],
                "unreadable": self.unreadable, "vanished": self.vanished}


def queue_type_names(kernel_release=None):
    """sysfs queue `type` numbering: kernels that still have DIQ (6.12 and older) count
    SDMA_XGMI as 4; newer ones (7.x; exact cut-over UNVERIFIED) as 3."""
    release = kernel_release or os.uname().release
    try:
        major = int(release.split(".")[0])
    except ValueError:
        major = 0
    return SYSFS_QUEUE_TYPES_L72 if major >= 7 else SYSFS_QUEUE_TYPES_L612


def _read(path, dir_fd=None):
    # os.open/os.read, relative to an open directory: a short path walk and no file object,
    # which is most of the cost of a 1,000-process scan
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def _int(data):
    try:
        return int(data)
    except ValueError:
        return None


def _optional_int(path, dir_fd):
    try:
        return _int(_read(path, dir_fd))
    except FileNotFoundError:
        return None        # cu_occupancy exists only where the ASIC implements it; counters_ only with SVM


def read_process(proc_dir, pid, type_names):
    """One proc/<pid> entry. Raises FileNotFoundError if it vanished, PermissionError if hidden.

    Every GPU the process could open has vram_/sdma_/stats_ entries, mostly zero; only the GPUs it
    uses (VRAM allocated or queues) are read in full, which keeps a 1,000-process scan cheap."""
    proc = KfdProcess(pid)
    dfd = os.open(proc_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        names = os.listdir(dfd)
        for name in names:
            if name.startswith("vram_"):
                m = _PER_GPU.match(name)
                if m:
                    proc.vram[int(m.group(2))] = _int(_read(name, dfd))
        if "queues" in names:
            for qname in os.listdir(os.path.join(proc_dir, "queues")):
                if not qname.isdigit():
                    continue
                try:
                    code = _int(_read(f"queues/{qname}/type", dfd))
                    queue = KfdQueue(int(qname), _int(_read(f"queues/{qname}/gpuid", dfd)), code,
                                     type_names.get(code, f"type{code}"), _int(_read(f"queues/{qname}/size", dfd)))
                except FileNotFoundError:
                    continue       # destroyed between listdir and read
                proc.queues.append(queue)
            proc.queues.sort(key=lambda q: q.qid)
        present = set(names)
        for gpu in proc.gpu_ids:
            if f"sdma_{gpu}" in present:
                proc.sdma_us[gpu] = _optional_int(f"sdma_{gpu}", dfd)
            if f"stats_{gpu}" in present:
                proc.evicted_ms[gpu] = _optional_int(f"stats_{gpu}/evicted_ms", dfd)
                proc.cu_occupancy[gpu] = _optional_int(f"stats_{gpu}/cu_occupancy", dfd)
            if f"counters_{gpu}" in present:
                proc.counters[gpu] = {c: _optional_int(f"counters_{gpu}/{c}", dfd)
                                      for c in ("faults", "page_in", "page_out")}
    finally:
        os.close(dfd)
    return proc


_users = {}


def enrich(proc):
    """Name, user, cmdline and container pid. psutil gives name and cmdline (and knows how to fail);
    /proc/<pid>/status gives uid and NSpid in one read. False if the pid is gone."""
    import psutil
    try:
        p = psutil.Process(proc.pid)
        with p.oneshot():
            proc.name = p.name()
            proc.cmdline = p.cmdline()
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        pass
    try:
        status = _read(f"/proc/{proc.pid}/status")
    except OSError:
        return True
    for line in status.split(b"\n"):
        if line.startswith(b"Uid:"):
            uid = int(line.split()[1])
            if uid not in _users:
                try:
                    _users[uid] = pwd.getpwuid(uid).pw_name
                except KeyError:
                    _users[uid] = str(uid)
            proc.user = _users[uid]
        elif line.startswith(b"NSpid:"):
            innermost = int(line.split()[-1])
            proc.container_pid = innermost if innermost != proc.pid else None
    return True


def scan_processes(root=None, pids=None, names=None, with_psutil=True, kernel_release=None,
                   exclude_self=True):
    """All KFD processes (optionally only `pids` / whose name contains one of `names`)."""
    sysfs = root if isinstance(root, SysfsRoot) else SysfsRoot(root)
    sysfs.require_kfd()
    type_names = queue_type_names(kernel_release)
    scan = ProcessScan([])
    try:
        entries = os.listdir(sysfs.proc)
    except FileNotFoundError:
        return scan          # no process has opened /dev/kfd since boot
    wanted = set(pids) if pids else None
    me = os.getpid()
    todo = [int(e) for e in entries if e.isdigit()]
    todo = [pid for pid in todo if (wanted is None or pid in wanted) and not (exclude_self and pid == me)]

    def one(pid):       # serial on purpose: a thread pool measured 2x slower (GIL + syscall-bound)
        try:
            proc = read_process(f"{sysfs.proc}/{pid}", pid, type_names)
        except FileNotFoundError:
            return "vanished"
        except OSError:
            return "unreadable"
        if with_psutil and not enrich(proc):
            return "vanished"
        return proc

    for result in map(one, todo):
        if result == "vanished":
            scan.vanished += 1
        elif result == "unreadable":
            scan.unreadable += 1
        elif not names or any(n in (result.name or "") for n in names):
            scan.processes.append(result)
    scan.processes.sort(key=lambda p: p.pid)
    return scan
