"""Client side of the simulated KFD: `SimBackend` is a /dev/kfd stand-in for kfdtool.device
(`SimControl`, the simulation-only control messages, lives in .control).

Pointer arguments are the one thing a socket cannot pass: for each ioctl (and DBG_TRAP op) the
table below names the pointer fields and how many bytes they point at; those bytes travel with
the request and the kernel's writes come back, as copy_from_user/copy_to_user would see them.
"""
import ctypes
import errno
import json
import os
import struct
import threading
import time

import ioctl_opt

from ..errors import SimulatorError
from ..ioctls import constants as c
from ..ioctls import structs as s
from ..ioctls.requests import BY_NR
from .control import Channel, SimControl
from .protocol import (IOCTL, MAX_BATCH_CALLS, PROTOCOL, REPLY, ProtocolError, frame, pack_items, pack_regions,
                       recv_frame, unpack_items, unpack_regions)

OPS = c.kfd_dbg_trap_operations
EVENT_DATA = ctypes.sizeof(s.kfd_event_data)
APERTURE = ctypes.sizeof(s.kfd_process_device_apertures)

# (ioctl name, DBG_TRAP op or None) -> [(path to the pointer field, bytes it points at)]
POINTERS = {
    ("DBG_TRAP", OPS.KFD_IOC_DBG_TRAP_ENABLE): [("enable.rinfo_ptr", lambda a: a.enable.rinfo_size)],
    ("DBG_TRAP", OPS.KFD_IOC_DBG_TRAP_SUSPEND_QUEUES): [
        ("suspend_queues.queue_array_ptr", lambda a: 4 * a.suspend_queues.num_queues)],
    ("DBG_TRAP", OPS.KFD_IOC_DBG_TRAP_RESUME_QUEUES): [
        ("resume_queues.queue_array_ptr", lambda a: 4 * a.resume_queues.num_queues)],
    ("DBG_TRAP", OPS.KFD_IOC_DBG_TRAP_GET_QUEUE_SNAPSHOT): [
        ("queue_snapshot.snapshot_buf_ptr", lambda a: a.queue_snapshot.num_queues * a.queue_snapshot.entry_size)],
    ("DBG_TRAP", OPS.KFD_IOC_DBG_TRAP_GET_DEVICE_SNAPSHOT): [
        ("device_snapshot.snapshot_buf_ptr", lambda a: a.device_snapshot.num_devices * a.device_snapshot.entry_size)],
    ("SET_CU_MASK", None): [("cu_mask_ptr", lambda a: min(a.num_cu_mask, 1024) // 8)],
    ("MAP_MEMORY_TO_GPU", None): [("device_ids_array_ptr", lambda a: 4 * a.n_devices)],
    ("UNMAP_MEMORY_FROM_GPU", None): [("device_ids_array_ptr", lambda a: 4 * a.n_devices)],
    ("WAIT_EVENTS", None): [("events_ptr", lambda a: EVENT_DATA * a.num_events)],
    ("GET_PROCESS_APERTURES_NEW", None): [("kfd_process_device_apertures_ptr", lambda a: APERTURE * a.num_of_nodes)],
    # the ABI gives no size: the kernel writes up to the queue's ctl_stack_size (per XCC), so the
    # caller's writable memory there is shipped, up to WAVE_STATE_WINDOW bytes
    ("GET_QUEUE_WAVE_STATE", None): [("ctl_stack_address", lambda a: _writable_extent(a.ctl_stack_address))],
}
WAVE_STATE_WINDOW = 1 << 20
# The longest a reply may say a call sleeps in the simulated kernel: modelled costs are µs to ms
# (a drain without CWSR, ESTIMATE 1 ms, is the longest), queued behind at most every other caller.
MAX_CALL_NS = 10 * 10**9


# (pid, fd of /proc/self/mem) of the process that opened it: the fd a forked child inherits reads
# its parent's memory, so a child opens its own
_self_mem = None


def _peek(addr, length):
    """Read our own memory without risking a segfault on a bad pointer (EFAULT semantics)."""
    global _self_mem
    if _self_mem is None or _self_mem[0] != os.getpid():
        if _self_mem is not None:
            os.close(_self_mem[1])
        _self_mem = (os.getpid(), os.open("/proc/self/mem", os.O_RDONLY | os.O_CLOEXEC))
    try:
        data = os.pread(_self_mem[1], length, addr)
    except (OSError, OverflowError):
        return None
    return data if len(data) == length else None


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.process_vm_writev.restype = ctypes.c_ssize_t
_libc.process_vm_writev.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong,
                                    ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.c_ulong]


def _poke(addr, data):
    """Write into our own memory as copy_to_user would: False (nothing written) where the pages
    are not writable, instead of a segfault. process_vm_writev honours page protections, where
    /proc/self/mem would not."""
    source = ctypes.create_string_buffer(data, len(data))
    local, remote = _IoVec(ctypes.addressof(source), len(data)), _IoVec(addr, len(data))
    done = _libc.process_vm_writev(os.getpid(), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    if done == len(data):
        return True
    if done < 0 and ctypes.get_errno() in (errno.ENOSYS, errno.EPERM):     # syscall filtered out
        if _writable_extent(addr, len(data)) < len(data):
            return False
        ctypes.memmove(addr, data, len(data))
        return True
    return False


def _writable_extent(addr, limit=WAVE_STATE_WINDOW):
    """How many bytes from `addr` on (at most `limit`) lie in writable mappings of this process:
    what copy_to_user could fill there without faulting."""
    end = addr
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                span, perms = line.split(maxsplit=2)[:2]
                low, high = (int(x, 16) for x in span.split("-"))
                if high <= end:
                    continue
                if low > end or "w" not in perms or end - addr >= limit:
                    break
                end = high
    except OSError:
        return 0
    return min(end - addr, limit)


def _sleep_until(deadline_ns, spin_ns=200_000):
    """Return at CLOCK_MONOTONIC `deadline_ns`. The last `spin_ns` are spun: a sleep overshoots by
    tens to hundreds of µs on a busy host, as much as the modelled costs themselves. A deadline
    more than MAX_CALL_NS away is a simulator bug, raised instead of slept."""
    left = deadline_ns - time.monotonic_ns()
    if left > MAX_CALL_NS:
        raise SimulatorError(f"simulated KFD server said the call returns in {left / 1e9:.3g} s; a simulator bug")
    while left > 0:
        if left > spin_ns:
            time.sleep((left - spin_ns) / 1e9)
        left = deadline_ns - time.monotonic_ns()


def _get(obj, path):
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


class SimBackend:
    """A simulated /dev/kfd fd. Opening it (the "O" message) makes this process a KFD process.

    The kernel binds the fd to its opener (kfd_chardev.c: kfd_ioctl, `process->lead_thread !=
    current->group_leader` -> EBADF). Here a connection stands for the fd, one per thread of the
    opener (same pid, so the same KFD process), so that a call that sleeps in the kernel
    (DESTROY_QUEUE of a suspended queue) blocks only its own thread. A forked child that uses the
    inherited object gets connections of its own, on any thread, that never send "O": the
    server sees a process that is not the opener and answers as the kernel does (EBADF, or
    ENOTTY for an unknown nr), and the child's replies never mix with the parent's. Each "O" names
    the thread that sends it, whose calls the connection then carries: DBG_TRAP's ptrace test
    compares the target's tracer with the calling thread (kfd_chardev.c: kfd_ioctl_set_debug_trap,
    ptrace_parent(target->lead_thread) != current)."""

    def __init__(self, socket_path):
        self.socket_path = socket_path
        self.opener_pid = os.getpid()
        self._local = threading.local()
        self._channels = []
        self.fd = self.sock.fileno()      # what user space would pass as dbg_fd

    @property
    def sock(self):
        return self._channel().sock

    def _channel(self):
        """This thread's connection (opened as this KFD process's fd by its opener)."""
        pid = os.getpid()
        channel = getattr(self._local, "channel", None)
        if channel is None or self._local.pid != pid:      # a new thread, or a forked child
            channel = Channel(self.socket_path)
            if pid == self.opener_pid:
                # the thread that opens it makes its calls: the kernel's `current` for them
                opening = b"O" + json.dumps({"tid": threading.get_native_id()}).encode()
                spoken = channel.call_json(opening).get("protocol")
                if spoken != PROTOCOL:
                    channel.close()
                    raise SimulatorError(f"the simulated KFD at {self.socket_path} speaks protocol {spoken or 1}, "
                                         f"this kfdtool {PROTOCOL}: restart it (`kfdtool sim stop NAME`)")
            self._local.channel, self._local.pid = channel, pid
            self._channels.append(channel)
        return channel

    def _control(self):
        """This thread's control channel, kept open (a debugger reads memory often: polling)."""
        control = getattr(self._local, "control", None)
        if control is None or self._local.control_pid != os.getpid():     # none yet, or a forked child
            control = self._local.control = SimControl(self.socket_path)
            self._local.control_pid = os.getpid()
            self._channels.append(control)
        return control

    def close(self):
        for channel in self._channels:
            channel.close()
        self._channels.clear()
        self._local = threading.local()

    def ioctl(self, request, arg):
        """Like fcntl.ioctl(fd, request, arg, True): fills `arg` in place, returns the ioctl's
        return value, raises OSError with the kernel's errno."""
        raw, regions = _outgoing(request, arg)
        self._channel().collect()             # posted doorbells first: their replies come before ours
        try:
            # a server that stopped: no errno of a real ioctl says that (EPIPE would pass for the kernel's)
            made_at = made_at_ns()                # the syscall: the server applies the call as of then
            self.sock.sendall(frame(b"I" + _ioctl_body(request, raw, regions, made_at)))
            reply, fds = recv_frame(self.sock, with_fds=True)
        except OSError as e:
            raise SimulatorError(f"simulated KFD server went away: {e}") from None
        ret, returns_at = _incoming(request, arg, _body_of(reply, b"R"), fds)
        if returns_at:                        # the modelled time the call sleeps in the kernel
            _sleep_until(returns_at)
        if ret < 0:
            raise OSError(-ret, os.strerror(-ret))
        return ret

    def ioctls(self, calls):
        """Several ioctls [(request, arg)] made back to back, as a loop in this thread makes them:
        the server makes each when the one before returned, in one round trip instead of one each
        (a round trip to this Python server costs far more than a system call). [ret or OSError]
        in order; one call's error does not stop the rest."""
        results, batch = [], []
        for request, arg in calls:
            if _returns_fds(request):           # an fd travels only with a b"R": made by itself, in order
                results += self._batch(batch) if batch else []
                batch = []
                try:
                    results.append(self.ioctl(request, arg))
                except OSError as e:
                    results.append(e)
            else:
                batch.append((request, arg))
        return results + (self._batch(batch) if batch else [])

    def _batch(self, calls):
        if len(calls) > MAX_BATCH_CALLS:
            return self._batch(calls[:MAX_BATCH_CALLS]) + self._batch(calls[MAX_BATCH_CALLS:])
        outgoing = [_outgoing(request, arg) for request, arg in calls]
        self._channel().collect()
        try:
            made_at = made_at_ns()
            self.sock.sendall(frame(b"B" + pack_items([_ioctl_body(request, raw, regions, made_at)
                                                       for (request, _), (raw, regions) in zip(calls, outgoing)])))
            reply, _ = recv_frame(self.sock)
        except OSError as e:
            raise SimulatorError(f"simulated KFD server went away: {e}") from None
        results, returns_at = [], 0
        try:
            answers = unpack_items(_body_of(reply, b"M"), "batch reply", len(calls))
            for (request, arg), answer in zip(calls, answers):
                ret, returns = _incoming(request, arg, answer)
                returns_at = max(returns_at, returns)
                results.append(OSError(-ret, os.strerror(-ret)) if ret < 0 else ret)
        except (ProtocolError, struct.error) as e:
            raise SimulatorError(f"simulated KFD server answered a batch of ioctls wrongly: {e}") from None
        if returns_at:
            _sleep_until(returns_at)
        # the batch ended early (its last call slept in the kernel): the rest are made now that it
        # has returned
        return results + (self._batch(calls[len(answers):]) if len(answers) < len(calls) else [])

    def doorbell(self, op, **fields):
        """Write AQL packets / read or wait on a completion signal of one of our queues (no ioctl
        on a real GPU: the ring, doorbell and signal are mapped memory). On this thread's own
        connection, so a `wait` blocks only this thread (the GIL is released while it does).
        Returns the server's JSON reply; SimulatorError with its one-line reason on refusal."""
        return self._channel().call_json(_doorbell_message(op, fields))

    def post_doorbell(self, op, **fields):
        """`doorbell` without waiting for the reply, as a doorbell write does not wait: a refusal
        (a full ring) is raised by this thread's next call to the simulator."""
        self._channel().post_json(_doorbell_message(op, fields))

    def flush(self):
        """Wait until the server has taken this thread's posted doorbells (and raise a refusal)."""
        self._channel().collect()

    def read_memory(self, pid, addr, length):
        """/proc/<pid>/mem's stand-in (kfdtool.device's backend interface): what the simulated
        kernel wrote into `pid`'s GPU buffers, e.g. the CWSR header after a suspend; None where
        nothing readable is there."""
        try:
            data = self._control()("read_memory", pid=pid, addr=addr, length=length)["data"]
        except SimulatorError:
            self._local.control = None        # a broken channel: a new one next time
            return None
        return bytes.fromhex(data) if data else None


def _outgoing(request, arg):
    """What one ioctl sends: its argument's bytes and the caller's memory behind its pointers, as
    copy_from_user would read them (an unreadable region is not shipped: the kernel says EFAULT)."""
    entry = BY_NR.get(ioctl_opt.IOC_NR(request))
    op = getattr(arg, "op", None) if entry and entry.name == "DBG_TRAP" else None
    key = (entry.name if entry else None, op)
    regions = []
    for path, size in POINTERS.get(key, ()):
        addr, length = _get(arg, path), size(arg)
        data = _peek(addr, length) if addr and length else None
        if data is not None:
            regions.append((addr, data))
    return bytes(arg)[:ioctl_opt.IOC_SIZE(request)], regions


def _ioctl_body(request, raw, regions, made_at):
    return IOCTL.pack(request, len(raw), len(regions), made_at) + raw + pack_regions(regions)


def _returns_fds(request):
    """SMI_EVENTS answers with an fd (SCM_RIGHTS with a b"R" reply)."""
    entry = BY_NR.get(ioctl_opt.IOC_NR(request))
    return entry is not None and entry.name == "SMI_EVENTS"


def _body_of(reply, kind):
    """A reply's body after its kind byte; an error reply (JSON) or another kind raises SimulatorError."""
    if reply[:1] != kind:
        try:
            why = json.loads(reply[1:]).get("error") if reply[:1] == b"J" else None
        except (ValueError, AttributeError):
            why = None
        raise SimulatorError(f"simulated KFD server: {why or f'a reply of kind {reply[:1]!r} to an ioctl'}")
    return reply[1:]


def _incoming(request, arg, body, fds=()):
    """Take one ioctl's reply: `arg` filled in and the kernel's writes put into the caller's memory,
    as copy_to_user would. Returns (ret, returns at)."""
    ret, out_len, n_regions, _n_fds, returns_at = REPLY.unpack_from(body)
    offset = REPLY.size
    out = body[offset:offset + out_len]
    ctypes.memmove(ctypes.addressof(arg), out, min(len(out), ctypes.sizeof(arg)))
    written, _ = unpack_regions(body, offset + out_len, n_regions)
    for addr, data in written.items():
        if not _poke(addr, bytes(data)):
            ret = ret if ret < 0 else -errno.EFAULT     # copy_to_user into read-only memory
    if fds and _returns_fds(request):
        arg.anon_fd = fds[0]
    return ret, returns_at


def made_at_ns():
    """The moment a call or doorbell write is made (CLOCK_MONOTONIC, the server's clock): the
    server applies it as of then (kfdtool/sim/clock.py)."""
    return time.monotonic_ns()


def _doorbell_message(op, fields):
    """A doorbell request, saying when it was made (stamped as the channel writes it, after any wait
    for earlier replies): the server applies a dispatch as of then, and answers a query or a wait
    as of then (the signal read then), not as of when its one thread got to it."""
    return lambda: b"D" + json.dumps({"op": op, **fields, "at": made_at_ns()}).encode()
