"""KFD processes and their queues from ``/sys/class/kfd/kfd/proc`` (never opens /dev/kfd),
with each process's name, user, cmdline and container pid from /proc. Processes that exit
mid-scan are dropped; unreadable ones are counted.

    >>> scan = scan_processes()
    >>> for proc in scan.processes: print(proc.pid, proc.name, [q.qid for q in proc.queues])
"""
import os
import pwd
from operator import attrgetter

from .parallel import fork_map, split
from .pids import alive
from .sysfs import SysfsRoot

# Kernel-internal queue types as sysfs prints them in proc/<pid>/queues/<qid>/type: not the ioctl
# KFD_IOC_QUEUE_TYPE_* values, and the numbering moved when DIQ was removed (kfd_priv.h, 6.12 vs 7.2).
SYSFS_QUEUE_TYPES_L612 = {0: "compute", 1: "sdma", 2: "hiq", 3: "diq", 4: "sdma_xgmi", 5: "sdma_by_eng_id"}
SYSFS_QUEUE_TYPES_L72 = {0: "compute", 1: "sdma", 2: "hiq", 3: "sdma_xgmi", 4: "sdma_by_eng_id"}


class _Record:
    """Equality, repr and pickling from __slots__, whose order each subclass's __init__ takes its
    arguments in. These records are plain slotted classes, not dataclasses, because importing
    dataclasses and generating their methods is ~15 ms of a `kfdtool queues` start-up that the
    0.3 s target cannot spare; slots make the 9,000 records of a 1,000-process scan smaller and
    quicker to build, and pickling them as (class, values) is 3x quicker than slots' default,
    which is what a forked worker's share costs to send back."""
    __slots__ = ()
    __hash__ = None

    def __init_subclass__(cls):
        getter = attrgetter(*cls.__slots__)             # one C call for the whole tuple
        cls._values = getter if len(cls.__slots__) > 1 else lambda obj: (getter(obj),)

    def __reduce__(self):
        return type(self), self._values(self)

    def __eq__(self, other):
        return type(other) is type(self) and other._values(other) == self._values(self)

    def __repr__(self):
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__name__}({fields})"


class KfdQueue(_Record):
    """One queue as proc/<pid>/queues/<qid> shows it. suspended_by: pid of a live
    `kfdtool preempt` holding it (the kernel does not say who suspended a queue)."""
    __slots__ = ("qid", "gpu_id", "type_code", "type_name", "size", "suspended_by")

    def __init__(self, qid, gpu_id, type_code, type_name, size, suspended_by=None):
        self.qid, self.gpu_id, self.type_code, self.type_name = qid, gpu_id, type_code, type_name
        self.size, self.suspended_by = size, suspended_by

    def to_dict(self):
        return {"qid": self.qid, "gpu_id": self.gpu_id, "type": self.type_name,
                "type_code": self.type_code, "ring_size": self.size, "suspended_by": self.suspended_by}


class KfdProcess(_Record):
    """A KFD process. Per-GPU dicts are keyed by gpu_id: vram (bytes), sdma_us (µs of SDMA
    activity), evicted_ms (ms evicted in total), cu_occupancy (CUs' worth of waves in flight),
    counters ({faults, page_in, page_out}). container_pid: the innermost NSpid when it differs."""
    __slots__ = ("pid", "name", "user", "cmdline", "container_pid", "queues",
                 "vram", "sdma_us", "evicted_ms", "cu_occupancy", "counters")

    def __init__(self, pid, name=None, user=None, cmdline=None, container_pid=None, queues=None,
                 vram=None, sdma_us=None, evicted_ms=None, cu_occupancy=None, counters=None):
        self.pid, self.name, self.user, self.container_pid = pid, name, user, container_pid
        self.cmdline = [] if cmdline is None else cmdline
        self.queues = [] if queues is None else queues
        self.vram = {} if vram is None else vram
        self.sdma_us = {} if sdma_us is None else sdma_us
        self.evicted_ms = {} if evicted_ms is None else evicted_ms
        self.cu_occupancy = {} if cu_occupancy is None else cu_occupancy
        self.counters = {} if counters is None else counters

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


class ProcessScan(_Record):
    """What a scan found; unreadable: entries we could not read (permission, I/O); vanished:
    processes that exited between listing and reading."""
    __slots__ = ("processes", "unreadable", "vanished")

    def __init__(self, processes, unreadable=0, vanished=0):
        self.processes, self.unreadable, self.vanished = processes, unreadable, vanished

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


# The most read from one file: more than any command line the kernel accepts by default (ARG_MAX,
# a quarter of an 8 MiB stack); bounds a /dev/zero planted in a sysfs tree.
MAX_READ_BYTES = 8 << 20


def _read(path, dir_fd=None):
    # os.open/os.read, relative to an open directory: a short path walk and no file object,
    # which is most of the cost of a 1,000-process scan. sysfs and /proc answer a read with
    # everything up to its size: one read for an attribute, more only for a long cmdline, read to
    # its end. Non-blocking, so a FIFO planted in the tree reads as empty instead of hanging.
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    try:
        data = chunk = os.read(fd, 4096)
        if len(chunk) == 4096:                 # long (a cmdline): read to its end
            while chunk and len(data) < MAX_READ_BYTES:
                chunk = os.read(fd, 65536)
                data += chunk
        return data[:MAX_READ_BYTES]
    except BlockingIOError:
        return b""
    finally:
        os.close(fd)


# Larger than any queue ring, VRAM or counter a kernel reports: a value past it is corruption
MAX_SYSFS_VALUE = 1 << 62


def _int(data):
    """A sysfs number, or None for junk: not ASCII digits, or beyond MAX_SYSFS_VALUE."""
    if not data.isascii():
        return None
    try:
        value = int(data)
    except ValueError:
        return None
    return value if abs(value) <= MAX_SYSFS_VALUE else None


def _optional_int(path, dir_fd):
    try:
        return _int(_read(path, dir_fd))
    except FileNotFoundError:
        return None        # cu_occupancy exists only where the ASIC implements it; counters_ only with SVM


def read_process(proc_root_fd, pid, type_names):
    """One proc/<pid> entry, relative to the open proc/ directory. Raises FileNotFoundError if it
    vanished, PermissionError if hidden.

    Every GPU the process could open has vram_/sdma_/stats_ entries, mostly zero; only the GPUs it
    uses (VRAM allocated or queues) are read in full, which keeps a 1,000-process scan cheap."""
    proc = KfdProcess(pid)
    dfd = os.open(str(pid), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=proc_root_fd)
    try:
        present = set(os.listdir(dfd))
        for name in present:
            if name.startswith("vram_") and name[5:].isdigit():
                vram = _int(_read(name, dfd))
                proc.vram[int(name[5:])] = vram if vram is None or vram >= 0 else None
        if "queues" in present:
            proc.queues = _read_queues(dfd, type_names)
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


def _read_queues(proc_dfd, type_names):
    qfd = os.open("queues", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=proc_dfd)
    try:
        queues = []
        for qname in os.listdir(qfd):
            if not qname.isdigit():
                continue
            try:
                code = _int(_read(f"{qname}/type", qfd))
                queues.append(KfdQueue(int(qname), _int(_read(f"{qname}/gpuid", qfd)), code,
                                       type_names.get(code, "unknown" if code is None else f"type{code}"),
                                       _int(_read(f"{qname}/size", qfd))))
            except FileNotFoundError:
                continue       # destroyed between listdir and read
    finally:
        os.close(qfd)
    queues.sort(key=lambda q: q.qid)
    return queues


_users = {}


def identify(proc, procfs="/proc"):
    """Name, user, cmdline and container pid from /proc/<pid>/status and /cmdline. False if the
    process is gone.

    Two reads give what psutil.Process would (name: the kernel's 15-byte comm, completed from
    argv[0] when truncated, as psutil does; cmdline: NUL-separated, or space-separated for a process
    that rewrote it) at a fourth to a half of psutil.Process's cost (scripts/bench_queues.py
    measures both: 39 vs 163 µs a process on a 2-vCPU VM, 28 vs 59 µs on a 16-core host), which
    at 1,000 processes is much of a 0.3 s budget. A /proc we may not read (hidepid) leaves them
    unknown."""
    try:
        status = _read(f"{procfs}/{proc.pid}/status")
        raw_cmdline = _read(f"{procfs}/{proc.pid}/cmdline")
    except (FileNotFoundError, ProcessLookupError):
        return alive(proc.pid)            # hidden from this /proc, or exited
    except OSError:
        return True
    name, uid, nspid = (_status_field(status, key) for key in (b"Name:", b"Uid:", b"NSpid:"))
    proc.name = name.decode(errors="replace") if name is not None else None
    proc.user = _user_name(int(uid.split()[0])) if uid else None
    if nspid:
        innermost = int(nspid.split()[-1])
        proc.container_pid = innermost if innermost != proc.pid else None
    proc.cmdline = _split_cmdline(raw_cmdline.decode(errors="replace"))
    if proc.name and len(proc.name) >= 15 and proc.cmdline:
        argv0 = os.path.basename(proc.cmdline[0])
        if argv0.startswith(proc.name):
            proc.name = argv0
    return True


def _status_field(status, key):
    """The value of `key` ("Uid:") in /proc/<pid>/status, or None."""
    at = (b"\n" + status).find(b"\n" + key)
    if at < 0:
        return None
    end = status.find(b"\n", at)
    return status[at + len(key):end if end >= 0 else None].strip()


def _split_cmdline(text):
    """psutil's rule: NUL-separated; space-separated when a process rewrote its argv without NULs
    (setproctitle), or left one NUL-terminated string with spaces in it."""
    if not text:
        return []                         # kernel threads and zombies
    sep = "\0" if text.endswith("\0") else " "
    text = text[:-1] if text.endswith(sep) else text
    args = text.split(sep)
    return text.split(" ") if sep == "\0" and len(args) == 1 and " " in text else args


def _user_name(uid):
    if uid not in _users:
        try:
            _users[uid] = pwd.getpwuid(uid).pw_name
        except KeyError:
            _users[uid] = str(uid)
    return _users[uid]


# a forked worker costs ~1 ms to start and ~30 µs a process to send its results back (pickled),
# against ~250 µs to read a process: worth it from a few hundred processes on
PROCESSES_PER_WORKER = 250


def scan_processes(root=None, pids=None, names=None, with_identity=True, kernel_release=None,
                   exclude_self=True, workers=1):
    """All KFD processes (optionally only `pids` / whose name contains one of `names`).

    workers=None spreads a large scan over forked processes, one per usable CPU and at most one
    per PROCESSES_PER_WORKER processes (the scan is tens of thousands of small sysfs reads); the
    CLI does. The default, 1, never forks: a library caller inside a big multi-threaded process
    (PyTorch) gets no surprise children."""
    sysfs = root if isinstance(root, SysfsRoot) else SysfsRoot(root)
    sysfs.require_kfd()
    scan = ProcessScan([])
    try:
        proc_root_fd = os.open(sysfs.proc, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return scan          # no process has opened /dev/kfd since boot
    try:
        todo = [int(e) for e in os.listdir(proc_root_fd) if e.isdigit()]
        wanted = set(pids) if pids else None
        me = os.getpid() if exclude_self else None
        todo = [pid for pid in todo if (wanted is None or pid in wanted) and pid != me]
        reader = _ShareReader(proc_root_fd, queue_type_names(kernel_release), with_identity)
        for results in fork_map(reader, split(todo, PROCESSES_PER_WORKER, workers)):
            for result in results:
                if isinstance(result, KfdProcess):
                    if not names or any(n in (result.name or "") for n in names):
                        scan.processes.append(result)
                elif result == "vanished":
                    scan.vanished += 1
                else:
                    scan.unreadable += 1
    finally:
        os.close(proc_root_fd)
    scan.processes.sort(key=lambda p: p.pid)
    return scan


class _ShareReader:
    """Reads one share of the pids (in this process or a forked worker): a KfdProcess, or
    "vanished" / "unreadable", per pid."""

    def __init__(self, proc_root_fd, type_names, with_identity):
        self.proc_root_fd, self.type_names, self.with_identity = proc_root_fd, type_names, with_identity

    def __call__(self, pids):
        return [self.one(pid) for pid in pids]

    def one(self, pid):
        try:
            proc = read_process(self.proc_root_fd, pid, self.type_names)
        except FileNotFoundError:
            return "vanished"
        except OSError:
            return "unreadable"
        return proc if not self.with_identity or identify(proc) else "vanished"
