"""The simulated KFD server: one process owns the simulated kernel and the sysfs tree; GPU
processes connect over a unix socket. The process that sends "O" on a connection is its opener,
and lives as a KFD process until the OS process exits (watched with a pidfd), like the kernel's
kfd_process, which outlives close() and dies with the mm — kill -9 included. Who sent each
request is the kernel's word (SCM_CREDENTIALS), never the client's: the ioctl's caller, the
kernel's `current`.

One thread, one selector, non-blocking sockets. Each connection is one thread of a client and
makes one call at a time: its next request is taken only once the previous reply has been handed
to the kernel's socket buffer in full (and no call of it sleeps in the simulated kernel), so a
client that stops reading, or is stopped mid-reply, holds up only itself. Connections take turns:
requests are handled in the order they were made, so a client that posted a batch of doorbells
goes to the back of the line once another's request was made before its next one, and another
process's ioctl (a debugger's SUSPEND_QUEUES) waits for the requests made before it, not for the
batch (on the device, doorbells need no kernel at all). Bytes that break the protocol close that
connection with a reason in server.log; the server keeps serving the rest.

Requests are applied as of the moment their callers made them (clock.py), and the model is never
played back, hence that order: rounds of at most MAX_BATCH_CALLS requests take them as made (what
arrives meanwhile takes its place), and between rounds the model is played for sleepers only up to
the earliest moment a request read and not handled was made (`_horizon_ns`). Otherwise one
process's doorbells read a little late would take effect as late as the others' requests or the
sleepers' checks handled before them had played the model (measured next to three batch jobs under
Lv3: a service's kernels started p50 ~1.9 ms after their doorbells), a simulator artefact charged to
whoever shares the server's thread. A client that lies about when it made its requests can move
them ahead of others' by at most MAX_LATE_NS (clock.applied_at bounds a stamp the same way) and
hold the sleepers' checks back by as much.

The simulated GPUs execute the kernels that processes ring into their queues (execution.py): after
every request the server re-plans which kernels run, and a timerfd wakes it when a kernel someone
waits on completes. A wait sleeps like a blocked ioctl: only its own connection waits.

    python -m kfdtool.sim.server --preset mi308x --dir /tmp/kfdtool-sim-0/mi308x
"""
import argparse
import collections
import errno
import heapq
import itertools
import json
import os
import selectors
import signal
import socket
import struct
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from ..pids import ExitWatch, alive, start_time
from ..selectloop import ConnectionLoop
from ..ratelog import RateLimitedLog
from . import clock
from .errors import Blocked, SimErrno
from .execution import Execution, WakeTimer
from .kernel import SimKfd
from .machine import DEFAULT_PARAMETERS, find_profile, materialize, parse_parameter, parse_setting
from .memory import UserMemory
from .protocol import (IOCTL, LEN, MAX_BATCH_CALLS, MAX_FRAME_BYTES, PROTOCOL, REPLY, ProtocolError, frame,
                       json_frame, pack_items, pack_regions, parse_batch, parse_control, parse_ioctl,
                       parse_json_object, parse_open)
from .state import SimQueue
from .timing import max_waves

CRED = struct.Struct("3i")                 # struct ucred: pid, uid, gid
# Room for SCM_CREDENTIALS only (the kernel puts them first): fds a client sends (SCM_RIGHTS) find
# no room, and the kernel closes them instead of installing them in the server.
ANCILLARY_BYTES = socket.CMSG_SPACE(CRED.size)

# Connection limits: /dev/kfd has none, but every connection costs the server an fd and buffers,
# and the socket is open to every local user. Per uid, so that one user cannot lock others out.
MAX_CONNECTIONS = 4096
MAX_CONNECTIONS_PER_UID = 1024
RECV_BYTES = 256 << 10                # one read from a client socket


class Inbox:
    """Bytes received on a connection and not yet taken as requests, with who sent each run of
    them: (pid, uid) from SCM_CREDENTIALS, which the kernel attaches to every write and never
    glues across writers in one read."""

    def __init__(self):
        self.data = bytearray()
        self.senders = collections.deque()   # [(pid, uid), bytes of the run], in stream order

    def __len__(self):
        return len(self.data)

    def add(self, data, sender):
        self.data += data
        if self.senders and self.senders[-1][0] == sender:
            self.senders[-1][1] += len(data)
        else:
            self.senders.append([sender, len(data)])

    def take(self, n):
        """The first `n` bytes and the set of senders of those bytes."""
        data = bytes(self.data[:n])
        del self.data[:n]
        senders = set()
        while n:
            run = self.senders[0]
            senders.add(run[0])
            used = min(n, run[1])
            run[1] -= used
            n -= used
            if not run[1]:
                self.senders.popleft()
        return data, senders

    def clear(self):
        self.data.clear()
        self.senders.clear()


class Connection:
    """One client socket: a thread of a GPU process, or a control channel."""

    def __init__(self, sock):
        self.sock = sock
        # who connected: for the connection limits and the control channel's owner check
        self.pid, self.uid, _gid = CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, CRED.size))
        self.inbox = Inbox()
        self.outbox = collections.deque()    # [bytes left to send, fds to pass with their first byte]
        self.sleeping = False                # its call sleeps in the simulated kernel (Blocked)
        # its last ioctl returns to its thread then (the modelled cost): its next request is made no
        # earlier, whatever a client that does not wait for it says (`_take_requests`)
        self.returns_at = 0
        self.batch = None                    # a b"B" whose next call the server makes once that one returned
        self.opener = None                   # pid that opened /dev/kfd on it (kfd_open's current)
        self.thread = None                   # (tid, start time) of the opener's thread that makes its calls
        self.closed = False
        self.events = 0                      # what the selector watches it for

    def __repr__(self):
        return f"connection fd {self.sock.fileno()} (pid {self.pid}, uid {self.uid})"

    @property
    def takes_requests(self):
        return not self.outbox and not self.sleeping and not self.closed


def _not_before(made_at, returned_ns):
    """A stamped request's moment, but not before its connection's last call returned (a client
    that did not wait for it); an unstamped one (0: when handled) stays so."""
    return max(made_at, returned_ns) if clock.is_stamp(made_at) else made_at


@dataclass(eq=False)
class Batch:
    """A b"B" being made by the server for its caller's thread: the KFD process its fd belongs to (the
    one it arrived for), the calls not made yet, the replies so far, when the last call made returns
    to the thread, and whether it sleeps in the kernel."""
    caller: tuple
    process: object
    calls: collections.deque
    replies: list = field(default_factory=list)
    returned_at: int = 0
    sleeping: bool = False


@dataclass(eq=False)
class Sleeper:
    """A call that sleeps in the simulated kernel until `blocked.ready()`; then `respond()` finishes
    it and replies. The wake timer fires when the simulated GPU may have completed `waits_for`
    (queue, count); a Blocked ioctl has none and is looked at after every request."""
    conn: Connection
    blocked: Blocked
    respond: Callable[[], None]
    waits_for: tuple | None = None


class SimServer(ConnectionLoop):
    def __init__(self, state_dir, preset, abi="1.23", parameters=None, realtime=True, patched_preempt=False,
                 max_connections=MAX_CONNECTIONS, max_connections_per_uid=MAX_CONNECTIONS_PER_UID,
                 exit_with=None):
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.sysfs_root = self.dir / "sys"
        self.profile = find_profile(abi)
        self.params = {**DEFAULT_PARAMETERS, **(parameters or {})}
        materialize(preset, self.sysfs_root, self.profile, self.params)
        (self.dir / "machine.json").write_text(json.dumps(
            {"preset": preset, "abi": abi, "release": self.profile.release, "pid": os.getpid(), "protocol": PROTOCOL}))
        self.kfd = SimKfd(self.sysfs_root, self.profile, self.params)
        self.kfd.patched_preempt = patched_preempt
        self.kfd.timing.realtime = realtime
        self.kfd.smi.on_close = self._forget
        self.execution = Execution(self.kfd)
        self.kfd.timing.on_stall = self.execution.stall
        self.kfd.timing.catch_up = self.execution.catch_up
        self.wake = WakeTimer()         # fires when a waited-on kernel completes
        self.sel = selectors.DefaultSelector()
        self.exits = ExitWatch(self.sel)   # a KFD process lives until its OS process exits
        self.kfd.watch_exit = self.exits.watch
        self.blocked = []             # Sleeper: calls that sleep
        # connection whose next call (of its batch, or its next request) waits for its last to return -> then
        self.returning = {}
        self.backlog = {}             # connection with a whole request waiting -> (when it was made, stamped?)
        self.dqm_free_ns = 0          # a modelled ioctl cost under way (the DQM lock) ends then
        self.changed_at_ns = 0        # the last request that may have changed what runs was applied then
        self.running = True
        self.opens = 0                # /dev/kfd opens since start (read-only tools must not add any)
        self.socket_path = self.dir / "kfd.sock"
        self.max_connections, self.max_connections_per_uid = max_connections, max_connections_per_uid
        self.connections_of = collections.Counter()     # uid -> open connections
        self.listener = None
        self.accept_paused_until = 0.0                  # out of fds: accept again after a pause
        self.log = RateLimitedLog("kfdtool-sim")
        self.exit_with = exit_with                      # pid whose exit stops this server (tests)

    # --- main loop --------------------------------------------------------------------------------
    def serve(self):
        if self.socket_path.exists():
            self.socket_path.unlink()
        if self.exit_with is not None:
            self._exit_with(self.exit_with)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # before any connection: the kernel then attaches its sender's credentials to every byte
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.listener.bind(str(self.socket_path))
        os.chmod(self.socket_path, 0o666)      # like /dev/kfd: any user may open it
        self.listener.listen(1024)
        self.listener.setblocking(False)
        self.sel.register(self.listener, selectors.EVENT_READ, ("listen", None))
        self.sel.register(self.wake, selectors.EVENT_READ, ("wake", None))
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "running", False))
        (self.dir / "ready").write_text(str(os.getpid()))
        while self.running:
            self._poll(timeout=0 if self.backlog else 0.5)
            self._take_turns()
            # what was sent while the round was handled is read now (or waits in a connection
            # queued for its turn), so that sleepers are looked at no later than it was made
            polled_ns = self._poll(timeout=0)
            with clock.applying_at(self._applied_at(self._horizon_ns(polled_ns), False)):
                self._retry_blocked()
                if not self.backlog:        # with one, we are back at once: sleepers are looked at then
                    self._arm_wake()
            self._register_smi()
            self._resume_accepting()
        for path in (self.dir / "ready", self.socket_path):     # `stop` waits for the socket to go
            path.unlink(missing_ok=True)

    def _poll(self, timeout):
        """Take what the selector has (requests are read into their connections' inboxes, not
        handled); returns the moment it looked: what was sent before then has been read, or waits
        in the socket of a connection queued for its turn."""
        ready = self.sel.select(timeout=timeout)
        polled_ns = time.monotonic_ns()
        for key, events in ready:
            kind, obj = key.data
            if self._handle_event(kind, obj, events):
                continue
            if kind == "smi":
                self.kfd.smi.on_readable(obj)
            elif kind == "owner":
                self.log(f"pid {obj} exited; stopping (KFDTOOL_SIM_EXIT_WITH)")
                self.running = False
            elif kind == "wake":
                self.wake.acknowledge()
        return polled_ns

    def _exit_with(self, pid):
        """Stop when `pid` exits, kill -9 included: a test run that is killed leaves no server."""
        try:
            fd = os.pidfd_open(pid)
        except OSError as e:
            raise SystemExit(f"kfdtool-sim: cannot watch pid {pid} to exit with it: {e.strerror}") from None
        self.sel.register(fd, selectors.EVENT_READ, ("owner", pid))

    def _admit(self, sock):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        conn = Connection(sock)
        refusal = self._over_limit(conn)
        if refusal:
            self.log(f"refused {conn}: {refusal}")
            self._send_last_words(conn, refusal)
            sock.close()
            return None
        self.connections_of[conn.uid] += 1
        return conn

    def _over_limit(self, conn):
        if sum(self.connections_of.values()) >= self.max_connections:
            return f"too many connections ({self.max_connections}, the server's MAX_CONNECTIONS)"
        if self.connections_of[conn.uid] >= self.max_connections_per_uid:
            return (f"too many connections for uid {conn.uid} "
                    f"({self.max_connections_per_uid}, the server's MAX_CONNECTIONS_PER_UID)")
        return None

    def _receive(self, conn):
        try:
            data, ancillary, _flags, _addr = conn.sock.recvmsg(RECV_BYTES, ANCILLARY_BYTES)
        except BlockingIOError:
            return
        except OSError as e:
            self._close(conn, f"receive failed: {e.strerror}")
            return
        sender = (conn.pid, conn.uid)           # replaced by the kernel's word, always attached
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                pid, uid, _gid = CRED.unpack(payload[:CRED.size])
                sender = (pid, uid)
        if not data:
            self._close(conn, None)             # an orderly close: nothing to log
            return
        conn.inbox.add(data, sender)
        # taken only while the previous call is answered; a client that keeps sending meanwhile
        # is not making one call at a time
        if len(conn.inbox) > LEN.size + MAX_FRAME_BYTES + RECV_BYTES:
            self._drop(conn, ProtocolError(f"{len(conn.inbox)} bytes sent while its call was not answered"))

    def _take_requests(self, conn):
        """Queue the connection for its turn if a whole request of it waits and it takes one now:
        requests are handled only in turns (`_take_turns`). One sent before the connection's last
        call has returned (a client that did not wait) waits for that moment (`returning`): a thread
        makes its next call only once the kernel has returned the last, so no client can push the
        device's modelled queue-manager lock ahead of the others faster than the kernel would."""
        if conn.takes_requests and _whole_request(conn.inbox) and conn not in self.backlog:
            now = time.monotonic_ns()
            if conn.returns_at > now:
                self.returning[conn] = conn.returns_at
                return
            self.backlog[conn] = _made_at_of_head(conn.inbox.data, now)

    def _horizon_ns(self, polled_ns):
        """How far the model may be played for sleepers: to the last poll of the sockets, but not
        past a stamped request read and not yet handled (it takes effect as of when it was made),
        nor past a call waiting for its connection's last call to return (`returning`: the next of
        its batch, or its next request)."""
        return min([made for made, stamped in self.backlog.values() if stamped] + list(self.returning.values()) +
                   [polled_ns])

    def _take_turns(self):
        """One round: up to MAX_BATCH_CALLS requests of the connections with one waiting, in the
        order they were made (an unstamped request: when it came to the front of its connection's
        inbox), each connection's one at a time. What is sent meanwhile is read after each request
        and takes its place in that order (a doorbell posted right after another, a connection
        that just connected), so a client that posted a batch of doorbells goes to the back of the
        line once another's request was made before its next one. A connection whose last call has
        returned takes its turn: its batch's next call as made then (`_ioctls`; its turn carries the
        Batch where a request's says whether it was stamped), or its next request. The rest waits for
        the next round: the sleepers are looked at between rounds."""
        turns, order = [], itertools.count()

        def join():
            now = time.monotonic_ns()
            for conn, returns_at in list(self.returning.items()):     # its last call has returned
                if returns_at <= now:
                    del self.returning[conn]
                    if conn.batch is not None:                    # its next call, made then
                        heapq.heappush(turns, (returns_at, next(order), conn, conn.batch))
                    else:
                        self._take_requests(conn)
            for conn, (made, stamped) in self.backlog.items():
                heapq.heappush(turns, (made, next(order), conn, stamped))
            self.backlog.clear()
        join()
        handled = 0
        while turns and handled < MAX_BATCH_CALLS:
            _made, _order, conn, stamped = heapq.heappop(turns)
            if conn.closed:
                continue
            if isinstance(stamped, Batch):                      # its thread is back from the kernel
                conn.batch, conn.sleeping = None, False
                self._ioctls(conn, stamped)
            elif not (conn.takes_requests and _whole_request(conn.inbox)):
                self._watch(conn)
                continue
            elif not self._handle_next(conn):
                continue
            handled += 1
            self._take_requests(conn)
            self._watch(conn)               # read on, unless its next request is here already
            self._poll(timeout=0)           # what was sent meanwhile, and when it was made
            join()
        for made, _order, conn, stamped in turns:       # for the next round
            if conn.closed:
                continue
            if isinstance(stamped, Batch):
                self.returning[conn] = made
            else:
                self.backlog[conn] = (made, stamped)

    def _handle_next(self, conn):
        """Take the whole request at the front of `conn`'s inbox and handle it; False if it broke
        the protocol (the connection is dropped)."""
        (length,) = LEN.unpack_from(conn.inbox.data)
        try:
            if length > MAX_FRAME_BYTES:
                raise ProtocolError(f"a frame of {length} bytes (MAX_FRAME_BYTES is {MAX_FRAME_BYTES})")
            message, senders = conn.inbox.take(LEN.size + length)
            if len(senders) > 1:        # a syscall is made by one process
                raise ProtocolError(f"one request written by several processes "
                                    f"(pids {sorted(pid for pid, _uid in senders)})")
            self._handle(conn, message[LEN.size:], senders.pop())
        except ProtocolError as e:
            self._drop(conn, e)
            return False
        return True

    def _watch(self, conn):
        """As ConnectionLoop's, but nothing more is read from a connection whose next request waits
        for its turn (its buffers stay bounded: the rest stays in its socket)."""
        # (one whose call is still in the kernel, its batch's included, is read on: _receive bounds it)
        waits_turn = conn in self.backlog or (conn in self.returning and not conn.sleeping)
        if waits_turn and not conn.outbox and not conn.closed:
            if conn.events:
                self.sel.unregister(conn.sock)
                conn.events = 0
            return
        super()._watch(conn)

    def _handle(self, conn, payload, sender):
        """One request; `sender` is (pid, uid) of the process that wrote it. An ioctl or a dispatch
        is applied at the moment its caller made it, as far as the model allows (clock.py)."""
        kind, body = payload[:1], payload[1:]
        made_at, changes = 0, True         # `changes`: may change what runs (not a query, not a wait)
        if kind == b"O":
            tid = parse_open(body)

            def act():
                refusal = self._open(conn, *sender, tid=tid)
                self._send(conn, json_frame({"error": refusal} if refusal
                                            else {"ok": True, "pid": conn.opener, "protocol": PROTOCOL}))
        elif kind == b"I":
            request, arg, regions, made_at = parse_ioctl(body)
            act = partial(self._ioctl, conn, sender, request, arg, regions)
        elif kind == b"B":
            opened = self.kfd.processes.get(conn.opener)       # None: not opened (its calls answer so)
            return self._ioctls(conn, Batch(sender, opened, collections.deque(parse_batch(body))))
        elif kind == b"C":
            def act():
                self._send(conn, json_frame(self._control(conn, parse_control(body))))
        elif kind == b"D":
            msg = parse_json_object(body, "doorbell")
            changes = msg.get("op") == "dispatch"
            made_at = msg.get("at", 0)
            act = partial(self._doorbell, conn, sender, msg)
        else:
            raise ProtocolError("an empty message" if not kind else f"unknown message kind {kind!r}")
        with clock.applying_at(self._applied_at(_not_before(made_at, conn.returns_at), changes)) as at:
            act()
            if kind != b"D":              # a doorbell re-plans itself where it changes what runs (Execution.dispatch)
                self.execution.replan(at)     # the request may have changed what runs

    def _applied_at(self, made_at, changes):
        """When a request made at `made_at` takes effect (clock.applied_at): never before a moment any
        device was played to (the model does not go back), nor before a request handled earlier
        that may have changed what runs (a reactivation on MES plays no device), so those are
        applied in the order handled."""
        floor = max(self.changed_at_ns, self.execution.played_ns)
        at = clock.applied_at(made_at, floor, time.monotonic_ns())
        if changes:
            self.changed_at_ns = at
        return at

    # --- replies ------------------------------------------------------------------------------
    def _send(self, conn, data, fds=()):
        """Queue a reply and hand as much of it to the socket as it takes now."""
        conn.outbox.append([memoryview(data), list(fds)])
        self._flush(conn)

    def _flush(self, conn):
        while conn.outbox and not conn.closed:
            entry = conn.outbox[0]
            data, fds = entry
            try:
                if fds:                          # the fds travel with the reply's first byte
                    sent = socket.send_fds(conn.sock, [data[:1]], [f.fileno() for f in fds])
                    for f in fds:
                        f.close()
                    entry[1] = []
                else:
                    sent = conn.sock.send(data)
            except BlockingIOError:
                return                           # the client is not reading: wait for EVENT_WRITE
            except OSError as e:
                self._close(conn, f"client went away mid-reply ({e.strerror})")
                return
            entry[0] = data[sent:]
            if not entry[0]:
                conn.outbox.popleft()

    def _send_last_words(self, conn, reason):
        """One error reply, if the socket takes it now; a connection being closed is never waited for."""
        try:
            conn.sock.send(json_frame({"error": reason}))
        except OSError:
            pass

    def _drop(self, conn, error):
        """Close `conn` for breaking the protocol, telling it why."""
        reason = f"protocol error: {error}"
        if not conn.closed:
            self._send_last_words(conn, reason)
        self._close(conn, reason)

    def _connection_closed(self, conn):
        self.backlog.pop(conn, None)
        for _data, fds in conn.outbox:         # SMI fds of replies it never took
            for f in fds:
                f.close()
        self.blocked = [b for b in self.blocked if b.conn is not conn]
        self.returning.pop(conn, None)
        self.connections_of[conn.uid] -= 1
        if not self.connections_of[conn.uid]:
            del self.connections_of[conn.uid]

    # --- /dev/kfd -------------------------------------------------------------------------------
    def _open(self, conn, pid, uid, tid=None):
        """kfd_chardev.c: kfd_open for `pid`. None, or why the open failed. `tid`, the thread the
        client says opens the connection, is kept as the thread of its calls (the kernel's
        `current`, which DBG_TRAP's ptrace test compares with a tracer thread) once found to be a
        thread of `pid` (`_thread_of`); otherwise the process stands for its thread, as for a
        client that names none.

        The kernel releases a kfd_process when its mm goes (kfd_process_notifier_release); here
        the pidfd is that hook, so a process the server cannot watch would never be released.
        Its open fails instead, as kfd_open does when kfd_create_process fails."""
        if conn.opener is not None:
            return None
        if tid is not None:
            conn.thread = _thread_of(pid, tid)
            if conn.thread is None:
                self.log(f"{conn}: tid {tid} is no thread of pid {pid} that this server can see; "
                         f"its calls are taken as the process's")
        if not self.exits.watch(pid):
            why = "it has exited" if not alive(pid) else "the server is out of file descriptors"
            reason = f"open of the simulated /dev/kfd refused: cannot watch pid {pid} for its exit ({why})"
            self.log(f"{conn}: {reason}")
            return reason
        conn.opener = pid
        self.opens += 1
        self.kfd.open_process(pid, uid)
        return None

    def _on_exit(self, pid):
        self.exits.exited(pid)
        self.kfd.release_process(pid)
        self.kfd.timing.settle()
        self.execution.replan(time.monotonic_ns())

    def _ioctls(self, conn, batch):
        """b"B": the calls as one thread makes them in a loop: each is made when the one before
        returned to it (its "returns at": the DQM lock and the remap it waited for), or at its own
        stamp if that is later, and applied then (`_applied_at`); one b"M" answers them all. A call
        that returns later than now defers the rest (`returning`): the next is made when it returns,
        in its turn among the other connections' requests (`_take_turns`), as the thread would make
        it the moment it is back from the kernel, not a round trip to the caller later. A call that
        sleeps in the kernel ends the batch there: the reply goes when it wakes, and the caller
        makes the rest after it has returned."""
        def answer(ret, out, regions, returns_at):
            for f in self.kfd.smi.pending_fds:          # an "M" carries no fds: SMI_EVENTS belongs in an "I"
                f.close()
            self.kfd.smi.pending_fds = []
            batch.replies.append(_reply_body(ret, out, regions, 0, returns_at))
            batch.returned_at = returns_at or clock.now_ns()
            if batch.sleeping:                          # it woke: the batch ends with it
                self._send(conn, frame(b"M" + pack_items(batch.replies)))

        while batch.calls:
            if batch.returned_at > time.monotonic_ns():
                conn.batch, conn.sleeping = batch, True     # in the kernel until the call returns
                self.returning[conn] = batch.returned_at
                return
            if batch.replies and self.kfd.processes.get(conn.opener) is not batch.process:
                # its process exited while the call before was being made (its pid may be another's
                # by now): a dead thread makes no more calls (and kfd_ioctl would answer another
                # process EBADF on this fd)
                break
            request, arg, regions, made_at = batch.calls.popleft()
            made_at = _not_before(max(made_at, batch.returned_at), conn.returns_at)
            with clock.applying_at(self._applied_at(made_at, True)) as at:
                answered = self._ioctl(conn, batch.caller, request, arg, regions, answer)
                self.execution.replan(at)
            if not answered:
                batch.sleeping = True                   # `answer` sends the reply when it wakes
                return
        self._send(conn, frame(b"M" + pack_items(batch.replies)))

    def _ioctl(self, conn, caller, request, arg, regions, answer=None):
        """kfd_chardev.c: kfd_ioctl on this connection's fd; `caller` (pid, uid) is `current`.
        `answer(ret, out, regions copied to user, returns at)` replies (one b"R" unless given);
        False if the call sleeps in the kernel (answered when it wakes), else True."""
        answer = answer or partial(self._reply, conn)
        # no KFD process behind a connection that never opened: the kernel decides (nr, then EBADF)
        proc = self.kfd.processes.get(conn.opener) if conn.opener is not None else None
        caller_pid, caller_uid = caller
        mem = UserMemory(regions)
        # the calling thread where known: the one the connection was opened with, if the call comes
        # from its process (a forked child writing on an inherited connection is another process)
        thread = conn.thread
        self.kfd.dbg.calling_thread = (caller_pid, *thread) if thread and caller_pid == conn.opener else None
        try:
            ret, out = self.kfd.ioctl(proc, caller_pid, request, arg, mem, caller_uid)
        except Blocked as blocked:
            out = bytes(arg)        # `blocked` is unbound once the except clause ends: bind it now
            self._sleep(conn, blocked, lambda blocked=blocked: self._finish_ioctl(blocked, out, answer))
            return False
        except Exception:                      # a simulator bug must not take the machine down
            self.log(f"{conn}: simulator bug in ioctl {request:#x} of pid {caller_pid}, answered EIO:\n"
                     f"{traceback.format_exc().rstrip()}")
            ret, out = -errno.EIO, b""
        finally:
            self.kfd.dbg.calling_thread = None
        cost = self.kfd.timing.settle(block=False)
        returns_at = 0
        if self.kfd.timing.realtime and cost.total_s > 0:
            # The caller sleeps in the kernel for the modelled time (the DQM lock serialises such
            # calls: one starts when the previous ends); the server does not, so other processes'
            # doorbells go on meanwhile, as user-mode queues do on the real device. The reply goes
            # now and says when the call returns: the caller's side sleeps until then (no wake
            # timer of ours adds its lateness to the modelled time).
            returns_at = max(clock.now_ns(), self.dqm_free_ns) + int(cost.total_s * 1e9)
            self.dqm_free_ns = conn.returns_at = returns_at
        answer(ret, out, mem.copied_to_user, returns_at)
        return True

    def _reply(self, conn, ret, out, regions, returns_at=0):
        fds = self.kfd.smi.pending_fds
        self.kfd.smi.pending_fds = []
        self._send(conn, frame(b"R" + _reply_body(ret, out, regions, len(fds), returns_at)), fds)

    def _sleep(self, conn, blocked, respond, waits_for=None):
        """`conn`'s call sleeps until `blocked.ready()`; then `respond()` answers it."""
        conn.sleeping = True
        self.blocked.append(Sleeper(conn, blocked, respond, waits_for))

    def _finish_ioctl(self, blocked, out, answer):
        try:
            ret = blocked.finish()
        except SimErrno as e:
            ret = -e.errno
        self.kfd.timing.settle()
        self.execution.replan(clock.now_ns())
        answer(ret, out, {}, 0)

    def _retry_blocked(self):
        while True:
            ready = [b for b in self.blocked if b.blocked.ready()]
            if not ready:
                return
            for sleeper in ready:
                self.blocked.remove(sleeper)
                sleeper.conn.sleeping = False
                sleeper.respond()
                self._take_requests(sleeper.conn)
                self._watch(sleeper.conn)

    def _arm_wake(self):
        """The timerfd fires at the earliest moment a sleeping call may be answered, or a call waiting
        for its connection's last to return is made."""
        wake = self.execution.wake_ns([b.waits_for for b in self.blocked if b.waits_for], clock.now_ns())
        self.wake.arm(min([*self.returning.values(), *([] if wake is None else [wake])], default=None))

    # --- doorbells (writing AQL packets needs no ioctl: any process, its own queues) -------------
    def _doorbell(self, conn, sender, msg):
        """dispatch / query / wait on a queue of the connection's KFD process, by that process."""
        caller_pid, _uid = sender
        op, qid = msg.get("op"), msg.get("qid")
        if conn.opener is None:
            return self._send(conn, json_frame({"error": "doorbell on a connection that has not opened the "
                                                         "simulated /dev/kfd"}))
        if caller_pid != conn.opener:       # like the ioctls: the fd's queues are its opener's
            return self._send(conn, json_frame({"error": f"pid {caller_pid} may not ring pid {conn.opener}'s "
                                                         f"doorbells"}))
        proc = self.kfd.processes.get(conn.opener)
        q = proc.queues.get(qid) if proc is not None and isinstance(qid, int) else None
        if q is None:
            return self._send(conn, json_frame({"error": f"pid {conn.opener} has no queue {qid!r:.30}"}))
        now = clock.now_ns()                # a dispatch: when it was rung (_handle)
        if op == "dispatch":
            try:
                dispatched = self.execution.dispatch(proc, q, msg.get("kernels"), now)
            except ValueError as e:
                return self._send(conn, json_frame({"error": f"dispatch to queue {qid}: {e}"}))
            return self._send(conn, json_frame({"ok": True, "dispatched": dispatched}))
        if op == "query":
            return self._send(conn, json_frame({"ok": True, "completed": self.execution.completed(q, now),
                                                "dispatched": q.dispatched}))
        if op == "wait":
            count = msg.get("count")
            if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= q.dispatched:
                return self._send(conn, json_frame({"error": f"wait on queue {qid}: count must be an integer in "
                                                             f"[0, {q.dispatched}] (dispatched so far), "
                                                             f"got {count!r:.30}"}))
            return self._wait(conn, proc, q, count)
        return self._send(conn, json_frame({"error": f"unknown doorbell op {op!r:.30}"}))

    def _wait(self, conn, proc, q, count):
        """Answer when `q` has completed `count` kernels; an error if the queue goes first."""
        def gone():
            return not proc.alive or proc.queues.get(q.qid) is not q

        def ready():
            return gone() or self.execution.completed(q, clock.now_ns()) >= count

        def respond():
            if self.execution.completed(q, clock.now_ns()) >= count:
                # when the work waited for ended on the model's clock: what the device's signal
                # would say, however late this one thread got to answering
                reply = {"ok": True, "completed": q.completed, "completed_at": q.completed_at(count)}
            else:
                reply = {"error": f"queue {q.qid} of pid {proc.pid} was destroyed before completing {count} "
                                  f"kernels ({q.completed} done)"}
            self._send(conn, json_frame(reply))

        if ready():
            return respond()
        self._sleep(conn, Blocked(ready, None), respond, waits_for=(q, count))

    def _forget(self, sock):
        try:
            self.sel.unregister(sock)
        except (KeyError, ValueError):
            pass

    def _register_smi(self):
        for fileno, client in self.kfd.smi.clients.items():
            try:
                self.sel.get_key(fileno)
            except KeyError:
                self.sel.register(client.sock, selectors.EVENT_READ, ("smi", fileno))

    # --- control (simulation-only operations, never part of the KFD ABI) ----------------------
    def _control(self, conn, msg):
        # /dev/kfd is open to every user, the simulation's own levers are not: only the user who
        # started this machine (or root) may adopt, evict, change waves or parameters, or stop it
        if conn.uid not in (0, os.getuid()):
            return {"error": f"permission denied: simulated {self.dir.name} belongs to uid {os.getuid()}; "
                             f"its control channel is the owner's (or root's)"}
        op = msg.get("op")
        handler = getattr(self, f"ctl_{op}", None) if isinstance(op, str) else None
        if handler is None:
            return {"error": f"unknown control op {op!r}"}
        try:
            return {"ok": True, **(handler(conn, msg) or {})}
        except KeyError as e:
            return {"error": f"control op {op!r}: missing field {e.args[0]!r}"}
        except (ValueError, TypeError, AttributeError, OverflowError) as e:     # a field of the wrong kind
            return {"error": f"control op {op!r}: {e}"}
        except SimErrno as e:
            return {"error": f"control op {op!r}: {e or type(e).__name__}"}
        except Exception:                      # a simulator bug must not take the machine down
            self.log(f"{conn}: simulator bug in control op {op!r}:\n{traceback.format_exc().rstrip()}")
            return {"error": f"control op {op!r}: internal simulator error (see server.log)"}

    def _proc(self, msg):
        proc = self.kfd.processes.get(int(msg["pid"]))
        if proc is None:
            raise ValueError(f"pid {msg['pid']} is not a simulated KFD process")
        return proc

    def ctl_status(self, conn, msg):
        return {"preset": json.loads((self.dir / "machine.json").read_text())["preset"],
                "abi": str(self.kfd.abi), "release": self.profile.release, "sysfs_root": str(self.sysfs_root),
                "gpus": list(self.kfd.devices), "processes": sorted(self.kfd.processes),
                "queues": sum(len(p.queues) for p in self.kfd.processes.values()), "opens": self.opens,
                "remaps": {str(gpu): dev.remaps for gpu, dev in self.kfd.devices.items()}}

    def ctl_adopt(self, conn, msg):
        """Make an existing OS process a KFD process with queues, without it speaking the
        protocol (cheap bulk workloads for benchmarks); it is released when it exits."""
        pid = int(msg["pid"])
        uid = int(msg.get("uid", conn.uid))
        vram = {int(gpu): _count(size, "vram") for gpu, size in msg.get("vram", {}).items()}   # before any change
        if conn.uid != 0:                          # a user adopts only its own processes, as itself
            try:
                owner = os.stat(f"/proc/{pid}").st_uid
            except OSError:
                raise ValueError(f"pid {pid} does not exist") from None
            if uid != conn.uid or owner != conn.uid:
                raise ValueError(f"permission denied: uid {conn.uid} may adopt only its own processes, as itself")
        if not self.exits.watch(pid):
            raise ValueError(f"pid {pid} does not exist")
        proc = self.kfd.open_process(pid, uid)
        proc.runtime_state = 1
        for spec in msg.get("queues", []):
            gpu = int(spec["gpu_id"])
            self.kfd.device(gpu)
            qid = proc.lowest_free_qid()
            if qid is None:                        # the kernel's per-process qid bitmap is full
                raise ValueError(f"pid {pid} already has {len(proc.queues)} queues, the most a process may have")
            q = SimQueue(qid, gpu, int(spec.get("type", 2)), 0x7F00_0000_0000 + qid * 0x10_0000,
                         int(spec.get("ring_size", 1 << 20)), 0, 0, 0, 0, 0, 100, int(spec.get("priority", 7)))
            q.exception_status = 0
            proc.queues = {qid: q, **proc.queues}
            self.kfd.sysfs.add_queue(pid, qid, q.ring_size, self.kfd._sysfs_type(q.queue_type), gpu)
        for gpu, size in vram.items():
            proc.vram[gpu] = size
            self.kfd.sysfs.set(pid, f"vram_{gpu}", size)
        return {"queues": len(proc.queues)}

    def ctl_set_waves(self, conn, msg):
        waves = _count(msg["waves"], "waves")
        proc = self._proc(msg)
        for q in proc.queues.values():
            if msg.get("qid") is None or q.qid == int(msg["qid"]):
                q.sync_progress()
                q.resident_waves = min(waves, max_waves(self.kfd.devices[q.gpu_id].node))
                q.sync_progress()
        self._refresh_occupancy(proc)
        return {}

    def _refresh_occupancy(self, proc):
        """cu_occupancy = ceil(waves in flight / wave slots per CU), at most the CU count."""
        for gpu in {q.gpu_id for q in proc.queues.values()}:
            node = self.kfd.devices[gpu].node
            per_cu = node.props.get("max_waves_per_simd", 8) * node.props.get("simd_per_cu", 4)
            waves = sum(q.resident_waves for q in proc.queues_on(gpu) if q.is_active)
            self.kfd.sysfs.set(proc.pid, f"stats_{gpu}/cu_occupancy", min(node.cu_count, -(-waves // per_cu)))

    def ctl_queues(self, conn, msg):
        proc = self._proc(msg)
        out = []
        now = clock.now_ns()
        for q in proc.queues.values():
            self.execution.completed(q, now)
            q.sync_progress()
            out.append({"qid": q.qid, "gpu_id": q.gpu_id, "active": q.is_active, "suspended": q.is_suspended,
                        "evicted": q.is_evicted, "percent": q.percent, "progress_ns": q.progress_ns,
                        "resident_waves": q.resident_waves, "saved_wave_bytes": q.saved_wave_bytes,
                        "dispatched": q.dispatched, "completed": q.completed,
                        "head_remaining_us": self.execution.head_remaining_us(q, now),
                        "ring_base": q.ring_base, "ring_size": q.ring_size,
                        "debugger": proc.debugger.pid if proc.debugger else None})
        return {"queues": out}

    def ctl_read_memory(self, conn, msg):
        """Stand-in for /proc/<pid>/mem on GPU-visible buffers: what the kernel wrote there, and a
        queue's AQL dispatch ids: at its write pointer the packets the process has written (as
        dispatched through its doorbell), at its read pointer those the CP has retired (the
        simulated GPU's completions, caught up to now), each a little-endian u64 as in HSA's
        amd_queue_t."""
        proc = self._proc(msg)
        addr, length = int(msg["addr"]), int(msg["length"])
        for q in proc.queues.values():
            if addr in (q.wptr, q.rptr) and q.wptr != q.rptr and length <= 8:
                value = q.dispatched if addr == q.wptr else self.execution.completed(q, clock.now_ns())
                return {"data": value.to_bytes(8, "little")[:length].hex()}
        for bo in proc.bos.values():
            if bo.contains(addr):
                data = bo.contents.get(addr - bo.va)
                return {"data": data[:length].hex() if data and len(data) >= length else None}
        raise ValueError(f"{addr:#x} is not mapped in pid {proc.pid}")

    def ctl_evict(self, conn, msg):
        self.kfd.evict_process(self._proc(msg), int(msg.get("trigger", 2)))
        self.kfd.timing.settle()
        return {}

    def ctl_restore(self, conn, msg):
        self.kfd.restore_process(self._proc(msg))
        self.kfd.timing.settle()
        return {}

    def ctl_last_cost(self, conn, msg):
        cost = self.kfd.timing.last
        return {"remap_s": cost.remap_s, "grace_s": cost.grace_s, "save_s": cost.save_s,
                "restore_s": cost.restore_s, "saved_bytes": cost.saved_bytes}

    def ctl_set_param(self, conn, msg):
        name, value = parse_parameter(msg["name"], msg["value"])
        self.params[name] = value
        (self.sysfs_root / "module" / "amdgpu" / "parameters" / name).write_text(f"{value}\n")
        return {}

    def ctl_shutdown(self, conn, msg):
        self.running = False
        return {}


def _count(value, what):
    """A control message's count (waves, bytes): a whole number >= 0, or ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be a whole number >= 0, got {value!r}")
    return value


def _thread_of(pid, tid):
    """(`tid`, its start time) if it names a thread of process `pid` and `pid` lives in the pid
    namespace of this server's /proc (its NSpid has one entry), so that the client's gettid() names
    the same thread here; else None. The start time tells that thread from a later one given its id
    (DbgTrap._is_current)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:") and len(line.split()) != 2:
                    return None                  # a nested namespace: its tids are not ours
    except (OSError, ValueError):
        return None
    started = start_time(pid, tid)
    return None if started is None else (tid, started)


def _reply_body(ret, out, regions, n_fds, returns_at):
    """An ioctl's answer after its kind byte (b"R", or an item of b"M"): see protocol.py."""
    return REPLY.pack(ret, len(out), len(regions), n_fds, returns_at) + out + pack_regions(regions.items())


def _made_at_of_head(data, read_ns):
    """(When the first request in `data`, a whole frame, was made, True) for a stamped one: an ioctl,
    a batch (its first call) or a doorbell, as clock.applied_at would apply it when read (a stamp
    from the future is now; one more than MAX_LATE_NS old, that long ago). (`read_ns`, False) for
    any other, or one that is malformed (refused when its turn comes)."""
    payload = bytes(data[LEN.size:LEN.size + LEN.unpack_from(data)[0]])
    kind, made = payload[:1], 0
    try:
        if kind == b"I":
            made = IOCTL.unpack_from(payload, 1)[3]
        elif kind == b"B":
            made = IOCTL.unpack_from(payload, 1 + 2 * LEN.size)[3]
        elif kind == b"D":
            made = json.loads(payload[1:]).get("at", 0)
    except (struct.error, ValueError, RecursionError, AttributeError):
        made = 0
    return (clock.applied_at(made, 0, read_ns), True) if clock.is_stamp(made) else (read_ns, False)


def _whole_request(inbox):
    """A whole frame waits in `inbox` (or a length no frame may have, which is refused when taken)."""
    if len(inbox) < LEN.size:
        return False
    (length,) = LEN.unpack_from(inbox.data)
    return length > MAX_FRAME_BYTES or len(inbox) >= LEN.size + length


PID_MAX = 1 << 22                 # the kernel's PID_MAX_LIMIT on 64-bit


def _positive(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"wants a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _pid(text):
    value = _positive(text)
    if value > PID_MAX:
        raise argparse.ArgumentTypeError(f"no pid is above {PID_MAX}, got {value}")
    return value


def _param(text):
    try:
        return parse_setting(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m kfdtool.sim.server", description=__doc__.splitlines()[0])
    parser.add_argument("--preset", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--abi", default="1.23")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", type=_param)
    parser.add_argument("--no-realtime", action="store_true", help="do not sleep for modelled latencies")
    parser.add_argument("--patched-preempt", action="store_true",
                        help="emulate a patched kernel with the non-upstream PREEMPT_QUEUE/RESUME_QUEUE 0x87/0x88")
    parser.add_argument("--max-connections", type=_positive, default=MAX_CONNECTIONS, metavar="N",
                        help=f"client connections at once, all users (default {MAX_CONNECTIONS})")
    parser.add_argument("--max-connections-per-uid", type=_positive, default=MAX_CONNECTIONS_PER_UID, metavar="N",
                        help=f"client connections at once, per user (default {MAX_CONNECTIONS_PER_UID})")
    parser.add_argument("--exit-with", type=_pid, metavar="PID", default=os.environ.get("KFDTOOL_SIM_EXIT_WITH"),
                        help="stop when process PID exits (default: $KFDTOOL_SIM_EXIT_WITH; the test suite "
                             "sets it so that a killed run leaves no simulator behind)")
    args = parser.parse_args(argv)
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)    # one pidfd per simulated process
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    params = dict(args.param)
    try:
        server = SimServer(args.dir, args.preset, args.abi, params, realtime=not args.no_realtime,
                           patched_preempt=args.patched_preempt, max_connections=args.max_connections,
                           max_connections_per_uid=args.max_connections_per_uid, exit_with=args.exit_with)
    except KeyError as e:
        print(f"kfdtool-sim: {e.args[0]}", file=sys.stderr)
        return 2
    except OSError as e:                   # --dir: a file, unwritable, ...
        print(f"kfdtool-sim: cannot use {args.dir}: {e.strerror or e}", file=sys.stderr)
        return 1
    server.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
