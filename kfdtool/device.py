"""The one I/O seam: `KfdDevice` performs KFD ioctls through a backend object and knows nothing
else about where they go.

    >>> with KfdDevice.open() as kfd:                  # the real /dev/kfd (an OsBackend)
    ...     print(kfd.abi)                              # 1.17 (from GET_VERSION)
    >>> kfd = KfdDevice(backend)                        # any other backend, e.g. the one a
    ...                                                 # simulated machine hands out (`--sim`)

A backend is any object with
    fd                          the descriptor user space would pass on (DBG_TRAP ENABLE's dbg_fd)
    ioctl(request, arg)         like fcntl.ioctl(fd, request, arg, True): fills `arg` in place,
                                returns the ioctl's value, raises OSError with the kernel's errno
    ioctls([(request, arg)])    several, made back to back as a loop makes them: [value or OSError]
    read_memory(pid, addr, n)   n bytes of process `pid`'s memory at `addr`, or None if unreadable
                                (the CWSR header the kernel writes into a suspended queue's area)
    close()

Opening registers the caller as a KFD process until it exits (the kernel keeps the kfd_process
until the mm goes away), so read-only tools never get here.
"""
import errno
import fcntl
import os

from .errors import KfdIoctlError, NotSupported, ioctl_error
from .ioctls import constants as c
from .ioctls import structs as s
from .ioctls.history import KfdAbi

EAGAIN_RETRIES = 1000
# EAGAIN is an answer, not a transient, for these (ioctl, op) pairs.
_EAGAIN_IS_ANSWER = {("DBG_TRAP", "QUERY_DEBUG_EVENT")}
# the union member each DBG_TRAP op reads (kfd_chardev.c: kfd_ioctl_set_debug_trap); DISABLE has none
DBG_TRAP_MEMBER_OF_OP = {
    "ENABLE": "enable", "SEND_RUNTIME_EVENT": "send_runtime_event",
    "SET_EXCEPTIONS_ENABLED": "set_exceptions_enabled", "SET_WAVE_LAUNCH_OVERRIDE": "launch_override",
    "SET_WAVE_LAUNCH_MODE": "launch_mode", "SUSPEND_QUEUES": "suspend_queues", "RESUME_QUEUES": "resume_queues",
    "SET_NODE_ADDRESS_WATCH": "set_node_address_watch", "CLEAR_NODE_ADDRESS_WATCH": "clear_node_address_watch",
    "SET_FLAGS": "set_flags", "QUERY_DEBUG_EVENT": "query_debug_event",
    "QUERY_EXCEPTION_INFO": "query_exception_info", "GET_QUEUE_SNAPSHOT": "queue_snapshot",
    "GET_DEVICE_SNAPSHOT": "device_snapshot",
}


class OsBackend:
    """/dev/kfd and /proc/<pid>/mem of this host."""

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

    def ioctls(self, calls):
        results = []
        for request, arg in calls:
            try:
                results.append(fcntl.ioctl(self.fd, request, arg, True))
            except OSError as e:
                results.append(e)
        return results

    def read_memory(self, pid, addr, length):
        """/proc/<pid>/mem: needs ptrace access to `pid` (we hold it while debugging it)."""
        try:
            fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            data = os.pread(fd, length, addr)
        except (OSError, OverflowError):
            return None
        finally:
            os.close(fd)
        return data if len(data) == length else None

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
    def open(cls, path="/dev/kfd"):
        """The host's KFD device node."""
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

    def read_memory(self, pid, addr, length):
        """`length` bytes of `pid`'s memory at `addr`, or None where they cannot be read."""
        return self.backend.read_memory(pid, addr, length)

    def supports(self, name):
        return self.abi.supports(name)

    def ioctl(self, name, arg, op=None):
        """Perform AMDKFD_IOC_<name> on `arg` (a ctypes struct of this ABI's layout). Returns the
        ioctl's return value (a count for SUSPEND/RESUME_QUEUES). Raises a typed KfdIoctlError."""
        request = self._request(name)
        op_name = _op_name(name, arg)
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

    def ioctls(self, calls):
        """AMDKFD_IOC_<name> on each (name, arg) of `calls`, made back to back as one thread makes
        them in a loop (each returns before the next starts: the kernel serialises such calls on
        its locks anyway), in one round trip where the backend can (a simulated KFD). Returns
        [value or KfdIoctlError] in order: one call's error does not stop the others. A call
        interrupted or told to try again is made again by itself, as `ioctl` would, after the
        others (meant for calls on different targets, whose order does not matter)."""
        requests = [self._request(name) for name, _ in calls]          # all checked before any is made,
        op_names = [_op_name(name, arg) for name, arg in calls]         # an unknown op too
        answers = self.backend.ioctls([(request, arg) for request, (_, arg) in zip(requests, calls)])
        results = []
        for (name, arg), op_name, answer in zip(calls, op_names, answers):
            if isinstance(answer, OSError):
                again = answer.errno == errno.EINTR or (answer.errno == errno.EAGAIN
                                                        and (name, op_name) not in _EAGAIN_IS_ANSWER)
                if not again:
                    answer = ioctl_error(name, answer.errno, op_name)
                else:
                    try:
                        answer = self.ioctl(name, arg)
                    except KfdIoctlError as e:
                        answer = e
            results.append(answer)
        return results

    def _request(self, name):
        """AMDKFD_IOC_<name>'s request number in this ABI; NotSupported where it has none."""
        if not self.abi.supports(name):
            raise NotSupported(name, errno.ENOTTY, f"KFD ABI {self.abi} has no AMDKFD_IOC_{name}")
        return self.abi.request(name)

    def raw_ioctl(self, request, arg, name="UNKNOWN"):
        """An ioctl by request number (probing patched-driver extensions)."""
        try:
            return self.backend.ioctl(request, arg)
        except OSError as e:
            raise ioctl_error(name, e.errno) from None

    def dbg_trap(self, op, pid, member=None, **fields):
        """DBG_TRAP `op` (e.g. "SUSPEND_QUEUES") on `pid`, filling the union member's fields.
        Returns (the ioctl's value, the argument as the kernel left it)."""
        arg = dbg_trap_args(op, pid, member, **fields)
        return self.ioctl("DBG_TRAP", arg), arg


def dbg_trap_args(op, pid, member=None, **fields):
    """The argument of DBG_TRAP `op` on `pid`, the union member's fields filled (for
    `KfdDevice.dbg_trap`, or several calls made back to back with `KfdDevice.ioctls`). A
    misspelt op, member or field is refused before anything reaches the kernel: a field
    silently left zero would change what the ioctl does."""
    arg = s.kfd_ioctl_dbg_trap_args()
    try:
        arg.op = c.kfd_dbg_trap_operations[f"KFD_IOC_DBG_TRAP_{op}"]
    except KeyError:
        raise ValueError(f"DBG_TRAP has no operation {op!r}") from None
    arg.pid = pid
    if member is None:
        if fields:
            raise TypeError(f"DBG_TRAP {op}: fields {', '.join(sorted(fields))} given without a union member")
    else:
        members = [f[0] for f in type(arg._u)._fields_]
        if member not in members:
            raise ValueError(f"DBG_TRAP {op}: the argument union has no member {member!r} "
                             f"(members: {', '.join(members)})")
        if member != DBG_TRAP_MEMBER_OF_OP.get(op):
            # the kernel reads the op's own member: another one's fields would land on it
            expected = DBG_TRAP_MEMBER_OF_OP.get(op)
            raise ValueError(f"DBG_TRAP {op} takes " + (f"the union member {expected!r}" if expected
                             else "no union member") + f", not {member!r}")
        target = getattr(arg, member)
        known = [f[0] for f in target._fields_]
        unknown = sorted(set(fields) - set(known))
        if unknown:
            raise TypeError(f"DBG_TRAP {op}: {type(target).__name__} has no field {unknown[0]!r} "
                            f"(fields: {', '.join(known)})")
        for key, value in fields.items():
            setattr(target, key, value)
    return arg


def _op_name(name, arg):
    """A DBG_TRAP call's operation, as error messages name it (SUSPEND_QUEUES); None for others."""
    if name != "DBG_TRAP":
        return None
    return c.kfd_dbg_trap_operations(arg.op).name.removeprefix("KFD_IOC_DBG_TRAP_")
