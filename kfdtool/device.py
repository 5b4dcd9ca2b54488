"""The one I/O seam: `KfdDevice` owns a /dev/kfd fd (or a simulated one) and performs ioctls.

    >>> with KfdDevice.open() as kfd:                  # real /dev/kfd
    ...     print(kfd.abi)                              # 1.17 (from GET_VERSION)
    >>> kfd = KfdDevice.open(sim="mi308x")              # the running simulated MI308X

Opening registers the caller as a KFD process until it exits (the kernel keeps the kfd_process
until the mm goes away), so read-only tools never get here.
"""
import errno
import fcntl
import os

from .errors import NotSupported, ioctl_error
from .ioctls import constants as c
from .ioctls import structs as s
from .ioctls.history import KfdAbi

EAGAIN_RETRIES = 1000
# EAGAIN is an answer, not a transient, for these (ioctl, op) pairs.
_EAGAIN_IS_ANSWER = {("DBG_TRAP", "QUERY_DEBUG_EVENT")}


class OsBackend:
    def __init__(self, path="/dev/kfd"):
        try:
            self.fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            raise NotSupported("OPEN", errno.ENODEV, f"{path} does not exist: no amdgpu/KFD driver "
                               f"(use --sim NAME for a simulated GPU)") from None
        except PermissionError:
            raise ioctl_error("OPEN", errno.EACCES) from None

    def ioctl(self, request, arg):
        return fcntl.ioctl(self.fd, request, arg, True)

    def close(self):
        os.close(self.fd)


class KfdDevice:
    def __init__(self, backend):
        self.backend = backend
        self.abi = KfdAbi(23)                  # until GET_VERSION answers
        version = s.kfd_ioctl_get_version_args()
        self.ioctl("GET_VERSION", version)
        if version.major_version != 1:
            raise NotSupported("GET_VERSION", errno.EPROTO, f"KFD ABI {version.major_version}.x is unknown")
        self.abi = KfdAbi(version.minor_version)

    @classmethod
    def open(cls, path="/dev/kfd", sim=None):
        if sim is not None:
            from .sim import runner
            return cls(runner.machine(sim).open_kfd())
        return cls(OsBackend(path))

    @property
    def fd(self):
        return self.backend.fd

    def close(self):
        self.backend.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def supports(self, name):
        return self.abi.supports(name)

    def ioctl(self, name, arg, op=None):
        """Perform AMDKFD_IOC_<name> on `arg` (a ctypes struct of this ABI's layout). Returns the
        ioctl's return value (a count for SUSPEND/RESUME_QUEUES). Raises a typed KfdIoctlError."""
        if not self.abi.supports(name):
            raise NotSupported(name, errno.ENOTTY, f"KFD ABI {self.abi} has no AMDKFD_IOC_{name}")
        request = self.abi.request(name)
        op_name = None
        if name == "DBG_TRAP":
            op_name = c.kfd_dbg_trap_operations(arg.op).name.removeprefix("KFD_IOC_DBG_TRAP_")
        eagain_left = 0 if (name, op_name) in _EAGAIN_IS_ANSWER else EAGAIN_RETRIES
        while True:
            try:
                return self.backend.ioctl(request, arg)
            except InterruptedError:
                continue
            except OSError as e:
                if e.errno == errno.EAGAIN and eagain_left > 0:
                    eagain_left -= 1
                    continue
                raise ioctl_error(name, e.errno, op_name) from None

    def raw_ioctl(self, request, arg, name="UNKNOWN"):
        """An ioctl by request number (probing patched-driver extensions)."""
        try:
            return self.backend.ioctl(request, arg)
        except OSError as e:
            raise ioctl_error(name, e.errno) from None

    def dbg_trap(self, op, pid, member=None, **fields):
        """DBG_TRAP `op` (e.g. "SUSPEND_QUEUES") on `pid`, filling the union member's fields."""
        arg = s.kfd_ioctl_dbg_trap_args()
        arg.pid = pid
        arg.op = c.kfd_dbg_trap_operations[f"KFD_IOC_DBG_TRAP_{op}"]
        if member:
            target = getattr(arg, member)
            for key, value in fields.items():
                setattr(target, key, value)
        ret = self.ioctl("DBG_TRAP", arg)
        return ret, arg
