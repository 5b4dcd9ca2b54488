"""Who holds which queues suspended. The kernel does not publish debugger-suspended state in
sysfs, so every `kfdtool preempt` records its hold in a small file while it lives; `kfdtool
queues` reads them. Files of holders that died are stale (the kernel resumed those queues when the
holder exited) and are removed on sight."""
import json
import os
import time
from pathlib import Path

from ..pids import alive


def run_dir():
    override = os.environ.get("KFDTOOL_RUN_DIR")
    if override:
        return Path(override)
    if os.geteuid() == 0 and os.path.isdir("/run"):
        return Path("/run/kfdtool")
    return Path(f"/tmp/kfdtool-run-{os.getuid()}")


def ensure_run_dir():
    """The hold records' directory, created if needed: checked before anything is suspended."""
    d = run_dir()
    try:
        d.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        from ..errors import Error
        raise Error(f"{d} (KFDTOOL_RUN_DIR) is not a directory") from None
    return d


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
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _write_record(self.path, self.record)

    def __enter__(self):
        self._write()
        return self

    def __exit__(self, *exc):
        self.path.unlink(missing_ok=True)


def for_each_hold():
    """Live holds: dicts with target_pid, holder_pid, queues, mechanism, since."""
    d = run_dir()
    if not d.is_dir():
        return
    for path in d.glob("*.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not alive(record.get("holder_pid", -1)) or not alive(record.get("target_pid", -1)):
            path.unlink(missing_ok=True)
            continue
        yield record


def forget(target_pid, qids=None):
    """Queues of `target_pid` resumed by someone else (`kfdtool resume`): drop them from every live
    hold, so `kfdtool queues` stops naming a holder that no longer holds them."""
    d = run_dir()
    for path in d.glob(f"{target_pid}.*.json") if d.is_dir() else ():
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        # the record stays while its holder lives: it is still the target's debugger
        record["queues"] = [] if qids is None else [q for q in record.get("queues", []) if q not in set(qids)]
        _write_record(path, record)


def _write_record(path, record):
    """Whole or not at all: readers never see half a record."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)


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
