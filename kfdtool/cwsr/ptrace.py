"""PTRACE_SEIZE / detach without stopping the target: the KFD debugger API lets a process debug
another only if it is the target's ptrace parent when it calls DBG_TRAP ENABLE (kfd_chardev.c:
kfd_ioctl_set_debug_trap). On Linux 7.2 the process that did ENABLE may make every later op
without it, and detaches; before 7.2 every op but DISABLE needs the ptrace parent again, so the
debugger seizes the target around each op (cwsr.debugtrap.DebugTrapSuspend._op)."""
import ctypes
import errno
import os

PTRACE_DETACH = 17
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
PTRACE_EVENT_STOP = 128                # in waitpid's status >> 16: a stop of PTRACE_INTERRUPT (or a group stop)
_WALL = 0x40000000

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.restype = ctypes.c_long
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]


class PtraceError(OSError):
    pass


def tracer_of(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("TracerPid:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def ptrace_scope():
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None                    # no Yama LSM: classic rules (same uid or CAP_SYS_PTRACE)


def why_denied(pid):
    """What would be needed to attach to `pid`, in words."""
    scope = ptrace_scope()
    tracer = tracer_of(pid)
    if tracer and tracer != os.getpid():
        try:
            with open(f"/proc/{tracer}/comm") as f:
                who = f.read().strip()
        except OSError:
            who = "a debugger"
        return f"pid {pid} is already traced by pid {tracer} ({who})"
    if scope == 3:
        return "kernel.yama.ptrace_scope=3 forbids ptrace attach for everyone"
    if scope in (1, 2):
        return (f"kernel.yama.ptrace_scope={scope}: attaching to a non-child needs CAP_SYS_PTRACE "
                f"(run as root) or ptrace_scope=0")
    return "attaching to another user's process needs root or CAP_SYS_PTRACE"


def _call(request, pid, data=0):
    if _libc.ptrace(request, pid, None, data) == -1:
        err = ctypes.get_errno()
        raise PtraceError(err, os.strerror(err))


def seize(pid):
    try:
        _call(PTRACE_SEIZE, pid)
    except PtraceError as e:
        if e.errno == errno.ESRCH:
            raise
        raise PtraceError(e.errno, why_denied(pid)) from None


def detach(pid):
    """Stop the seized tracee briefly (PTRACE_INTERRUPT), wait for a stop, detach. A signal sent to
    it while it was seized stops it on the way in (a signal-delivery stop, reported before the
    interrupt's); detaching with no signal would drop it, so it is handed back with the detach and
    the process receives it as if it had never been traced (SIGTERM ends it, SIGSTOP stops it)."""
    try:
        _call(PTRACE_INTERRUPT, pid)
        _, status = os.waitpid(pid, _WALL)
        if not os.WIFSTOPPED(status):
            return                      # it exited meanwhile: nothing to detach from
        handed_back = 0 if status >> 16 == PTRACE_EVENT_STOP else os.WSTOPSIG(status)
        _call(PTRACE_DETACH, pid, handed_back)
    except (PtraceError, ChildProcessError):
        pass                            # target gone, or already detached
