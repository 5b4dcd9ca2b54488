"""The simulated kernel's /sys/class/kfd/kfd/proc/<pid>/ tree, in the formats of kfd_process.c:
single values end in a newline, queue attributes do not (kfd-abi.md §4.2)."""
import os
import shutil
from pathlib import Path

# kernel-internal queue types as sysfs prints them
SYSFS_COMPUTE, SYSFS_SDMA = 0, 1


class ProcSysfs:
    def __init__(self, proc_root, profile):
        self.root = Path(proc_root)
        self.profile = profile

    def _write(self, path, text):
        with open(path, "w") as f:
            f.write(text)

    def add_process(self, pid, gpu_ids, svm_gpu_ids):
        d = self.root / str(pid)
        d.mkdir(parents=True, exist_ok=True)
        self._write(d / "pasid", "0\n" if self.profile.pasid_is_zero else f"{0x8000 + pid % 0x7FFF}\n")
        for gpu in gpu_ids:
            self._write(d / f"vram_{gpu}", "0\n")
            self._write(d / f"sdma_{gpu}", "0\n")
            os.mkdir(d / f"stats_{gpu}")
            self._write(d / f"stats_{gpu}" / "evicted_ms", "0\n")
            self._write(d / f"stats_{gpu}" / "cu_occupancy", "0\n")
            if gpu in svm_gpu_ids:
                os.mkdir(d / f"counters_{gpu}")
                for counter in ("faults", "page_in", "page_out"):
                    self._write(d / f"counters_{gpu}" / counter, "0\n")
        os.mkdir(d / "queues")

    def remove_process(self, pid):
        shutil.rmtree(self.root / str(pid), ignore_errors=True)

    def set(self, pid, relpath, value):
        self._write(self.root / str(pid) / relpath, f"{value}\n")

    def add_queue(self, pid, qid, size, type_code, gpu_id):
        q = self.root / str(pid) / "queues" / str(qid)
        os.mkdir(q)
        self._write(q / "size", f"{size}")
        self._write(q / "type", f"{type_code}")
        self._write(q / "gpuid", f"{gpu_id}")

    def set_queue_size(self, pid, qid, size):
        self._write(self.root / str(pid) / "queues" / str(qid) / "size", f"{size}")

    def remove_queue(self, pid, qid):
        shutil.rmtree(self.root / str(pid) / "queues" / str(qid), ignore_errors=True)
