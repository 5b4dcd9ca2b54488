"""kfdtool's error tree (after psutil's): every failure a user can cause is one of these.

    Error
    ├── SysfsError            the KFD sysfs tree is missing or unreadable
    ├── NoSuchProcess         a pid is not (or no longer) a KFD process
    ├── SimulatorError        the simulated KFD is not running / refused a request
    └── KfdIoctlError         an ioctl failed; names the ioctl, the errno and what it means here
        ├── PermissionDenied      EPERM, EACCES
        ├── ProcessNotFound       ESRCH
        ├── InvalidArgument       EINVAL
        ├── BadAddress            EFAULT
        ├── Busy                  EBUSY, EAGAIN
        ├── AlreadyDebugged       EALREADY
        ├── NotSupported          ENOTTY, EOPNOTSUPP, ENOTSUPP(524), ENODEV
        ├── NoSpace               ENOSPC, ENOMEM
        └── TimedOut              ETIME, EIO
"""
import errno as _errno

ENOTSUPP = 524       # kernel-internal errno that leaks out of CREATE_QUEUE for a bad queue type


class Error(Exception):
    """Base of every kfdtool error; str() is a one-line message fit for a CLI."""


class SysfsError(Error):
    pass


class NoSuchProcess(Error):
    def __init__(self, pid, why="is not a KFD process"):
        super().__init__(f"pid {pid} {why}")
        self.pid = pid


class SimulatorError(Error):
    pass


class AttachDenied(Error):
    """ptrace refused (before any KFD call): the message says what attaching would need."""


class KfdIoctlError(Error):
    def __init__(self, ioctl, err, meaning=None, op=None):
        self.ioctl, self.errno, self.op = ioctl, err, op
        self.meaning = meaning or describe(ioctl, err, op)
        name = _errno.errorcode.get(err, "ENOTSUPP" if err == ENOTSUPP else str(err))
        what = f"AMDKFD_IOC_{ioctl}" + (f"({op})" if op else "")
        super().__init__(f"{what} failed with {name}: {self.meaning}")


class PermissionDenied(KfdIoctlError):
    pass


class ProcessNotFound(KfdIoctlError):
    pass


class InvalidArgument(KfdIoctlError):
    pass


class BadAddress(KfdIoctlError):
    pass


class Busy(KfdIoctlError):
    pass


class AlreadyDebugged(KfdIoctlError):
    pass


class NotSupported(KfdIoctlError):
    pass


class NoSpace(KfdIoctlError):
    pass


class TimedOut(KfdIoctlError):
    pass


_CLASS_BY_ERRNO = {
    _errno.EPERM: PermissionDenied, _errno.EACCES: PermissionDenied, _errno.ESRCH: ProcessNotFound,
    _errno.EINVAL: InvalidArgument, _errno.EFAULT: BadAddress, _errno.EBUSY: Busy,
    _errno.EAGAIN: Busy, _errno.EALREADY: AlreadyDebugged, _errno.ENOTTY: NotSupported,
    _errno.EOPNOTSUPP: NotSupported, ENOTSUPP: NotSupported, _errno.ENODEV: NotSupported,
    _errno.ENOSPC: NoSpace, _errno.ENOMEM: NoSpace, _errno.ETIME: TimedOut, _errno.EIO: TimedOut,
}

# What an errno means for a given ioctl (and DBG_TRAP op), from kfd-abi.md §2e and §2b.
# Keys: (ioctl, op or None, errno); lookups fall back to (ioctl, None, errno), then (None, None, errno).
_MEANINGS = {
    (None, None, _errno.ENOTTY): "this kernel has no such ioctl",
    (None, None, _errno.EBADF): "the /dev/kfd fd belongs to another process (KFD binds it to its opener)",
    (None, None, _errno.EACCES): "permission denied",
    (None, None, _errno.EPERM): "operation not permitted",
    (None, None, _errno.EINVAL): "invalid argument",
    (None, None, _errno.EFAULT): "bad address, or no such queue id in this process",
    (None, None, _errno.ETIME): "the GPU scheduler did not preempt in time; the driver escalates to a GPU reset",
    (None, None, _errno.EIO): "a GPU reset is in progress",
    ("CREATE_QUEUE", None, _errno.EINVAL): "bad gpu_id, percentage, priority or ring size, or buffers "
                                           "not mapped as the kernel requires (ctl_stack_size must equal "
                                           "the node's, ctx save area >= cwsr_size)",
    ("CREATE_QUEUE", None, _errno.ENOSPC): "the per-process queue limit on this GPU is reached",
    ("CREATE_QUEUE", None, _errno.ENOMEM): "no free queue id (1024 per process)",
    ("CREATE_QUEUE", None, _errno.EPERM): "sched_policy=1 and the hardware queues are oversubscribed",
    ("CREATE_QUEUE", None, ENOTSUPP): "unsupported queue type",
    ("DESTROY_QUEUE", None, _errno.EINVAL): "no such queue id in this process",
    ("DESTROY_QUEUE", None, _errno.EBUSY): "another destroy of this suspended queue is already waiting",
    ("UPDATE_QUEUE", None, _errno.EFAULT): "no such queue id in this process, or the ring address/size "
                                           "is not exactly one mapped buffer",
    ("UPDATE_QUEUE", None, _errno.EACCES): "this process had a queue reset; its queues can no longer be updated",
    ("UPDATE_QUEUE", None, _errno.EINVAL): "percentage > 100, priority > 15 or ring size not a power of two",
    ("GET_QUEUE_WAVE_STATE", None, _errno.EINVAL): "the queue must be an inactive compute queue on a GPU "
                                                   "with CWSR enabled",
    ("GET_QUEUE_WAVE_STATE", None, _errno.EFAULT): "no such queue id in this process, or ctl_stack_address "
                                                   "is not writable memory",
    ("RUNTIME_ENABLE", None, _errno.EBUSY): "the runtime is already enabled",
    ("RUNTIME_ENABLE", None, _errno.EEXIST): "queues already exist; the runtime must be enabled before any queue",
    ("DBG_TRAP", None, _errno.ESRCH): "target pid not found, or it has never opened /dev/kfd",
    ("DBG_TRAP", None, _errno.EOPNOTSUPP): "the caller or the target is a secondary KFD context",
    ("DBG_TRAP", None, _errno.EINVAL): "debugging is not enabled on the target, or the GPU runs without "
                                       "hardware scheduling (amdgpu sched_policy=2)",
    ("DBG_TRAP", None, _errno.EPERM): "target not runtime-enabled or not being debugged by us (need to be the "
                                      "target itself, its ptrace parent, or its registered debugger)",
    ("DBG_TRAP", "ENABLE", _errno.EALREADY): "another debugger (e.g. rocgdb, rocr-debug-agent, or an "
                                             "xsched-lv3 daemon at Lv3: `xsched-lv3 status`) is attached "
                                             "to the target",
    ("DBG_TRAP", "ENABLE", _errno.EPERM): "not allowed to debug the target: be the process itself or its "
                                          "ptrace parent (root, CAP_SYS_PTRACE or "
                                          "kernel.yama.ptrace_scope=0 lets you attach)",
    ("DBG_TRAP", "ENABLE", _errno.ENODEV): "the target uses a pre-gfx9 GPU, which has no debugger support",
    ("DBG_TRAP", "ENABLE", _errno.EBADF): "dbg_fd is not an open file descriptor",
    ("DBG_TRAP", "SUSPEND_QUEUES", _errno.EPERM): "target not runtime-enabled (no ROCr runtime) or not being "
                                                  "debugged by us",
    ("DBG_TRAP", "RESUME_QUEUES", _errno.EPERM): "target not runtime-enabled or not being debugged by us",
    ("DBG_TRAP", "QUERY_DEBUG_EVENT", _errno.EAGAIN): "no debug event pending",
    ("SMI_EVENTS", None, _errno.EINVAL): "gpuid is not a GPU this process can use",
    ("CRIU_OP", None, _errno.EACCES): "needs CAP_CHECKPOINT_RESTORE or CAP_SYS_ADMIN",
    ("PREEMPT_QUEUE", None, _errno.ENOTTY): "this kernel has no such ioctl (it exists only in patched drivers)",
    ("RESUME_QUEUE", None, _errno.ENOTTY): "this kernel has no such ioctl (it exists only in patched drivers)",
}


def describe(ioctl, err, op=None):
    for key in ((ioctl, op, err), (ioctl, None, err), (None, None, err)):
        if key in _MEANINGS:
            return _MEANINGS[key]
    return _errno.errorcode.get(err, f"errno {err}") if err != ENOTSUPP else "not supported"


def ioctl_error(ioctl, err, op=None):
    """The typed exception for `err` returned by `ioctl` (op: DBG_TRAP op name without prefix)."""
    return _CLASS_BY_ERRNO.get(err, KfdIoctlError)(ioctl, err, op=op)
