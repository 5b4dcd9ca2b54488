"""Who holds which queues suspended. The kernel does not publish debugger-suspended state in
sysfs, so every `kfdtool preempt` records its hold in a small file while it lives; `kfdtool
queues` reads them. Files of holders that died are stale (the kernel resumed those queues when the
holder exited) and are removed on sight.

The default directory has a predictable name (/tmp/kfdtool-run-<uid>), so another local user could
create it first, or plant a file or a symbolic link there: it is used only if it is a real directory
of ours that nobody else may write (`private_run_dir`), records are created without following a link
(O_NOFOLLOW | O_EXCL), and a record is believed only if every field has the type it should."""
import errno
import json
import os
import stat
import time
from pathlib import Path

from ..errors import Error
from ..pids import alive

PID_MAX = 1 << 22                  # the kernel's limit (PID_MAX_LIMIT on 64-bit): a larger pid is no pid


def run_dir():
    override = os.environ.get("KFDTOOL_RUN_DIR")
    if override:
        return Path(override)
    if os.geteuid() == 0 and os.path.isdir("/run"):
        return Path("/run/kfdtool")
    return Path(f"/tmp/kfdtool-run-{os.getuid()}")


def ensure_run_dir():
    """The hold records' directory, created 0700 if needed and refused unless it is a directory of
    ours that no other user may write: checked before anything is suspended."""
    d = run_dir()
    try:
        d.parent.mkdir(parents=True, exist_ok=True)
        d.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise Error(f"cannot create {d} (KFDTOOL_RUN_DIR): {e.strerror}") from None
    why = _not_private(d)
    if why:
        raise Error(f"{d} (KFDTOOL_RUN_DIR) {why}: refusing to keep hold records there")
    return d


def private_run_dir():
    """The records' directory if it exists and is ours alone to write, else None (then there are no
    records to believe: whoever else made it could have written them)."""
    d = run_dir()
    return None if _not_private(d) else d


def _not_private(d):
    """Why `d` is not a directory we may trust, or None. Its own entry is looked at (a symbolic link
    named like it is refused, not followed)."""
    try:
        st = os.lstat(d)
    except OSError as e:
        return "does not exist" if e.errno == errno.ENOENT else f"cannot be read ({e.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != os.geteuid():
        return f"belongs to uid {st.st_uid}"
    if st.st_mode & 0o022:
        return f"may be written by others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


class Hold:
    """Context manager: the record exists exactly while this process holds the queues."""

    def __init__(self, target_pid, qids, mechanism):
        self.path = run_dir() / f"{target_pid}.{os.getpid()}.json"
        self.record = {"target_pid": target_pid, "holder_pid": os.getpid(), "queues": sorted(qids),
                       "mechanism": mechanism, "since": time.time()}

    def update(self, qids):
        self.record["queues"] = sorted(qids)
        self._write()

    def _write(self):
        ensure_run_dir()
        _write_record(self.path, self.record)

    def __enter__(self):
        self._write()
        return self

    def __exit__(self, *exc):
        self.path.unlink(missing_ok=True)


def for_each_hold():
    """Live holds: dicts with target_pid, holder_pid, queues, mechanism, since."""
    d = private_run_dir()
    for path in d.glob("*.json") if d else ():
        record = _read_record(path)
        if record is None:
            continue
        if not alive(record["holder_pid"]) or not alive(record["target_pid"]):
            path.unlink(missing_ok=True)
            continue
        yield record


def _read_record(path):
    """The record in `path` if it is one (a regular file holding the fields with their types), else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            record = json.loads(f.read(1 << 16))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not all(_is_pid(record.get(k)) for k in ("target_pid", "holder_pid")):
        return None
    queues = record.get("queues")
    if not isinstance(queues, list) or not all(isinstance(q, int) and not isinstance(q, bool) for q in queues):
        return None
    return record


def _is_pid(value):
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= PID_MAX


def forget(target_pid, qids=None):
    """Queues of `target_pid` resumed by someone else (`kfdtool resume`): drop them from every live
    hold, so `kfdtool queues` stops naming a holder that no longer holds them."""
    d = private_run_dir()
    for path in d.glob(f"{target_pid}.*.json") if d else ():
        record = _read_record(path)
        if record is None:
            continue
        # the record stays while its holder lives: it is still the target's debugger
        record["queues"] = [] if qids is None else [q for q in record.get("queues", []) if q not in set(qids)]
        _write_record(path, record)


def _write_record(path, record):
    """Whole or not at all: readers never see half a record. The temporary file is created anew,
    never through whatever (a link) is already at its name."""
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)            # one of ours that a crash left
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(record))
    os.replace(tmp, path)                  # replaces the name itself, a link there included


def holders():
    """{(target pid, qid): holder pid} of every live hold."""
    return {(record["target_pid"], qid): record["holder_pid"] for record in for_each_hold()
            for qid in record["queues"]}


def debugger_of(target_pid):
    """The pid of a live `kfdtool preempt` attached to `target_pid` as its debugger, or None."""
    return next((r["holder_pid"] for r in for_each_hold() if r["target_pid"] == target_pid), None)


def suspended_by(target_pid):
    """{qid: holder pid} for a target."""
    return {qid: holder for (pid, qid), holder in holders().items() if pid == target_pid}


def mark_held(scan):
    """Set `suspended_by` on every queue of a process scan that a live `kfdtool preempt` holds."""
    held = holders()
    for proc in scan.processes:
        for q in proc.queues:
            q.suspended_by = held.get((proc.pid, q.qid))
    return scan
