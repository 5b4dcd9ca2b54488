"""The multi-process scheduler daemon: `xsched-lv3 daemon --policy hpf`.

Processes register over a unix socket (no TCP listener); the peer's pid and uid come from
SO_PEERCRED, never from the message. The daemon owns the board's policy, gives each client a slot,
applies hints (only root or the owner of the target process may change its hints), and notices dead
clients through pidfds, releasing their slots so nobody waits on them.
Protocol: one JSON object per line (at most MAX_LINE_BYTES), one reply per request.

Threat model: the daemon is per user, like the board it serves (one board per uid, 0600). Its
socket is created 0600 (by default in a 0700 directory of ours), and a peer that is neither the
daemon's user nor root is refused at accept (SO_PEERCRED), should the socket ever be reachable by
others. Everything a peer sends is untrusted: one thread, one selector, non-blocking sockets and
per-connection buffers, so a client that sends garbage, never reads or disappears mid-reply costs
only its own connection. One daemon per socket (an flock held for the daemon's life), and the only
thing it ever unlinks is the socket it bound itself (or one it recorded binding before a crash).
"""
import errno
import fcntl
import json
import os
import selectors
import signal
import socket
import stat
import struct
import time
import traceback

from kfdtool.pids import ExitWatch, alive
from kfdtool.selectloop import ConnectionLoop
from kfdtool.ratelog import RateLimitedLog

from .board import Board, default_path, kfd_device_key
from .daemon_link import default_socket, wake_path
from .lv3 import ATTACHED_POLL_S, LV1, LV3, Host, Lv3Engine
from .policy import POLICIES, check_hint, make_policy, short_repr

CRED = struct.Struct("3i")
MAX_LINE_BYTES = 64 << 10           # one request; a longer line closes its connection
RECV_BYTES = 64 << 10               # one read from a client socket
MAX_CONNECTIONS = 256               # open client connections (each costs an fd and two buffers)
PID_MAX = 1 << 22                   # PID_MAX_LIMIT on 64-bit Linux (include/linux/threads.h)
SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
SCHEDULE_EVERY_S = 0.05             # re-read the board at least this often (dead, stopped clients)


class DaemonRefused(RuntimeError):
    """The daemon cannot start here; the message says why, in one line."""


def may_change(peer_uid, target_pid):
    """Only root or the owner of the target process may change its hints."""
    if peer_uid == 0:
        return True
    try:
        return os.stat(f"/proc/{target_pid}").st_uid == peer_uid
    except OSError:
        return False


def connection_refusal(peer_uid, daemon_uid, open_connections):
    """Why a new connection is refused, or None: only the daemon's user and root may talk to it
    (its board is that user's), and the daemon's fds are bounded."""
    if peer_uid not in (0, daemon_uid):
        return f"permission denied: this daemon serves uid {daemon_uid} (and root), not uid {peer_uid}"
    if open_connections >= MAX_CONNECTIONS:
        return f"too many connections ({MAX_CONNECTIONS}, the daemon's MAX_CONNECTIONS)"
    return None


def check_pid(value):
    """A pid from a message: a JSON integer naming a possible process, or ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= PID_MAX:
        raise ValueError(f"pid must be a process id (an integer from 1 to {PID_MAX}), got {short_repr(value)}")
    return value


class Connection:
    def __init__(self, sock):
        self.sock = sock
        self.pid, self.uid, _gid = CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, CRED.size))
        self.inbox = bytearray()        # received bytes not yet taken as requests
        self.scanned = 0                # inbox[:scanned] holds no newline (each byte is searched once)
        self.outbox = bytearray()       # reply bytes the socket has not taken yet
        self.events = 0                 # what the selector watches it for
        self.closed = False

    def __repr__(self):
        return f"connection (pid {self.pid}, uid {self.uid})"


class SingleInstance:
    """An flock on `path` (`<socket>.lock`, `<board>.lock`), held for the daemon's life: a second
    daemon on the same socket, or on the same board through another socket, is refused instead of
    taking it over. The socket's file also records the socket we bound (st_dev, st_ino), so that only
    that socket is ever unlinked, by us or, after a crash, by our successor (a killed daemon's lock
    file stays, with that record). A daemon that lets go of it (a clean shutdown, or a start that was
    refused) removes the lock file while still holding it; whoever opened that name meanwhile finds,
    once it holds the lock, that the name no longer leads to its file, and opens it again: two
    processes never hold locks on two different files of one name."""

    def __init__(self, path, serves):
        self.path = path
        while True:
            fd = self._open()
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                    raise DaemonRefused(f"{self.path} is not a regular file of ours: refusing it as the lock file")
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = self._read(fd).get("pid", "?")
                    raise DaemonRefused(f"another xsched-lv3 daemon (pid {holder}) already serves {serves}") from None
                if self._names(fd):
                    break
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)                   # removed by the daemon that held it: the name's new file
        self.fd = fd
        self.previous_socket = self._read(fd).get("socket")    # [st_dev, st_ino] a crashed daemon bound
        self.record(self.previous_socket)  # kept until we bind: a start refused later leaves it to the next

    def _open(self):
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as e:
            reason = "it is a symbolic link" if e.errno == errno.ELOOP else e.strerror
            raise DaemonRefused(f"cannot open the lock file {self.path}: {reason}") from None

    def _names(self, fd):
        """Whether our path still leads to the file `fd` is open on."""
        try:
            return _identity(os.lstat(self.path)) == _identity(os.fstat(fd))
        except FileNotFoundError:
            return False

    @staticmethod
    def _read(fd):
        try:
            record = json.loads(os.pread(fd, 4096, 0) or b"{}")
            return record if isinstance(record, dict) else {}
        except ValueError:
            return {}

    def record(self, bound):
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, json.dumps({"pid": os.getpid(), "socket": bound}).encode(), 0)

    def release(self):
        """Let go, removing the lock file first where it records no socket left to recover (ours is
        gone; a crashed daemon's, which a start that was refused never got to replace, stays
        recorded for the next one)."""
        if self._names(self.fd) and self._read(self.fd).get("socket") is None:
            os.unlink(self.path)
        os.close(self.fd)                  # drops the flock


def _identity(st):
    return [st.st_dev, st.st_ino]


class Daemon(ConnectionLoop):
    def __init__(self, policy="hpf", socket_path=None, board_path=None, host=None, trace=None,
                 attached_poll_s=ATTACHED_POLL_S):
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
        self.socket_path = socket_path or default_socket()
        if not socket_path and not os.environ.get("XSCHED_LV3_SOCKET"):
            _private_directory(os.path.dirname(self.socket_path))
        self.lock = SingleInstance(f"{self.socket_path}.lock", self.socket_path)   # before anything is changed
        self.board = self.board_lock = None
        try:
            self.board = Board(board_path or default_path())
            # one daemon per board too: a second one on another socket took over the board's daemon
            # record and released the first one's attached clients, and new clients then found no
            # daemon (a hostile-input sweep found it)
            self.board_lock = SingleInstance(f"{self.board.path}.lock", f"the board {self.board.path}")
        except BaseException:
            if self.board is not None:
                self.board.close()
            self.lock.release()
            raise
        self.board.set_policy(policy)
        # Lv3: without a host (tests of the protocol alone) every client keeps its Lv1 gate
        self.host = host or Host(_no_kfd, max_level=LV1)
        self.log = RateLimitedLog("xsched-lv3 daemon")
        self.engine = Lv3Engine(self.board, self.host, make_policy(policy), log=self.log, trace=trace,
                                attached_poll_s=attached_poll_s)
        self.wake = None                   # datagram socket clients poke when their activity changes
        self.wake_bound = None             # (st_dev, st_ino) of it
        self.wake_at = None                # the engine wants to run again then (a pending resume)
        self.sel = selectors.DefaultSelector()
        self.exits = ExitWatch(self.sel)
        self.connections = set()
        self.listener = None
        self.bound = None                  # (st_dev, st_ino) of the socket we bound
        self.accept_paused_until = 0.0
        self.running = True
        self.stopped_by = None                 # the signal that ended serve()

    # --- life -----------------------------------------------------------------------------------
    def serve(self, ready=None):
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.sel.register(wake_r, selectors.EVENT_READ, ("signal", None))
        signal.set_wakeup_fd(wake_w)           # a signal wakes select() at once
        for signum in SHUTDOWN_SIGNALS:        # from here on, a signal ends the loop and cleans up
            signal.signal(signum, self._stop)
        for signum in (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU):
            signal.signal(signum, signal.SIG_IGN)   # Ctrl-Z would stop us holding queues suspended
        try:
            self._bind()
            self._release_stale_attachments()
            for _, s in self.board.slots():
                self._watch_pid(s.pid)
            self.board.set_daemon(os.getpid())
            self._schedule()
            if ready:
                ready()
            while self.running:
                events_now = self.sel.select(timeout=self._timeout())
                self.engine.woken_at = time.monotonic()
                for key, events in events_now:
                    kind, obj = key.data
                    if self._handle_event(kind, obj, events):
                        continue
                    if kind == "signal":
                        _drain(wake_r)
                    elif kind == "poke":
                        _drain_datagrams(self.wake)
                self._schedule()
                self._resume_accepting()
        finally:
            self._shut_down()

    def _release_stale_attachments(self):
        """Slots of processes attached to a daemon that died without releasing them (kill -9):
        nothing inside those processes keeps them, and `attach` was asked of that daemon, not of
        this one, so they are released, not adopted (a new `attach` takes them again). We hold the
        single-instance lock: no other daemon owns them."""
        for slot, s in self.board.slots():
            if s.attached and self.board.release(slot, s.pid):
                self.log(f"pid {s.pid}: attached to a daemon that is gone; released (attach it again to schedule it)")

    def _timeout(self):
        """Sleep until a client pokes us, or a pending resume is due, or SCHEDULE_EVERY_S (dead and
        stopped clients are noticed without a poke)."""
        if self.wake_at is None:
            return SCHEDULE_EVERY_S
        return max(0.0, min(SCHEDULE_EVERY_S, self.wake_at - time.monotonic()))

    def _schedule(self):
        for _, s in self.board.slots():    # clients that took a slot without registering (no daemon then)
            if s.pid not in self.exits:
                self._watch_pid(s.pid)
        try:
            self.wake_at = self.engine.sync()
        except Exception:                  # a daemon bug must not leave queues suspended: stop Lv3
            self.log(f"internal error in the Lv3 engine; resuming every client:\n{traceback.format_exc()}")
            self.engine.close()
            self.engine.host = Host(_no_kfd, max_level=LV1)
            self.engine.host.no_kfd = "Lv1: Lv3 stopped after an internal error in the daemon (see its log)"
            self.wake_at = None

    def _stop(self, signum, _frame):
        # no logging here: a print interrupted by a signal handler's print raises "reentrant call"
        self.stopped_by = signal.Signals(signum).name
        self.running = False

    def _bind(self):
        path = self.socket_path
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise DaemonRefused(f"cannot use {path}: {e.strerror}") from None
        else:
            if not (stat.S_ISSOCK(st.st_mode) and _identity(st) == self.lock.previous_socket):
                raise DaemonRefused(f"{path} exists and is not a socket an earlier xsched-lv3 daemon left: "
                                    "not removing it (remove it yourself, or choose another --socket)")
            os.unlink(path)                # ours, left by a daemon that did not shut down cleanly
        listener = _bind_private(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM), path)
        self.bound = _identity(os.lstat(path))
        self.lock.record(self.bound)
        listener.listen(64)
        listener.setblocking(False)
        self.listener = listener
        self.sel.register(listener, selectors.EVENT_READ, ("listen", None))
        self.wake = _bind_wake(wake_path(path))
        self.wake_bound = _identity(os.lstat(wake_path(path)))
        self.sel.register(self.wake, selectors.EVENT_READ, ("poke", None))

    def _shut_down(self):
        if self.stopped_by:
            self.log(f"{self.stopped_by}: shutting down")
        self.engine.close()                # every suspended queue resumed, every target released
        for slot, s in self.board.slots():
            if s.attached:                 # nothing inside an attached process would ever release it
                self.board.release(slot, s.pid)
        self.host.close()
        self.board.clear_daemon(os.getpid())
        if self.wake is not None:
            self.wake.close()
            _unlink_if_ours(wake_path(self.socket_path), self.wake_bound)
        for conn in list(self.connections):
            self._close(conn, None)
        if self.listener:
            self.listener.close()
        _unlink_if_ours(self.socket_path, self.bound)
        if self.bound is not None:         # ours was bound, and is gone now: nothing to recover
            self.lock.record(None)
        self.lock.release()
        self.board_lock.release()

    # --- connections ----------------------------------------------------------------------------
    def _admit(self, sock):
        conn = Connection(sock)
        refusal = connection_refusal(conn.uid, os.geteuid(), len(self.connections))
        if refusal:
            self.log(f"refused {conn}: {refusal}")
            _last_words(sock, refusal)
            sock.close()
            return None
        self.connections.add(conn)
        return conn

    def _receive(self, conn):
        try:
            data = conn.sock.recv(RECV_BYTES)
        except BlockingIOError:
            return
        except OSError as e:
            self._close(conn, f"receive failed: {e.strerror}")
            return
        if not data:
            self._close(conn, None)            # an orderly close: nothing to log
            return
        conn.inbox += data

    def _take_requests(self, conn):
        """Answer each whole line in the inbox, one at a time, while the client takes its replies."""
        while not conn.closed and not conn.outbox:
            end = conn.inbox.find(b"\n", conn.scanned)
            if end < 0:
                conn.scanned = len(conn.inbox)
                if len(conn.inbox) > MAX_LINE_BYTES:
                    self._drop(conn, f"a request line longer than {MAX_LINE_BYTES} bytes (MAX_LINE_BYTES)")
                return
            if end > MAX_LINE_BYTES:
                self._drop(conn, f"a request line of {end} bytes (MAX_LINE_BYTES is {MAX_LINE_BYTES})")
                return
            line = bytes(conn.inbox[:end])
            del conn.inbox[:end + 1]
            conn.scanned = 0
            conn.outbox += json.dumps(self.answer(line, conn.pid, conn.uid)).encode() + b"\n"
            self._flush(conn)

    def _flush(self, conn):
        try:
            sent = conn.sock.send(conn.outbox)
        except BlockingIOError:
            return                             # the client is not reading: wait for EVENT_WRITE
        except OSError as e:
            self._close(conn, f"client went away before its reply ({e.strerror})")
            return
        del conn.outbox[:sent]

    def _drop(self, conn, reason):
        """Close `conn` for breaking the protocol, telling it why."""
        _last_words(conn.sock, f"protocol error: {reason}; closing the connection")
        self._close(conn, f"protocol error: {reason}")

    def _connection_closed(self, conn):
        self.connections.discard(conn)

    # --- requests -------------------------------------------------------------------------------
    def answer(self, line, peer_pid, peer_uid):
        """The reply to one request line: never raises, whatever the line holds."""
        try:
            msg = json.loads(line.decode("utf-8"))
        except RecursionError:
            return {"error": "not a request: JSON nested too deeply"}
        except ValueError as e:                # not UTF-8, not JSON, an integer of too many digits
            return {"error": f"not a request: {short_repr(str(e), 120)}"}
        if not isinstance(msg, dict):
            return {"error": 'a request is one JSON object per line, e.g. {"op": "status"}'}
        try:
            return self.handle(msg, peer_pid, peer_uid)
        except ValueError as e:
            return {"error": str(e)}
        except Exception:                      # a daemon bug must not take every client's scheduling down
            self.log(f"internal error on {short_repr(msg, 200)}:\n{traceback.format_exc()}")
            return {"error": "internal error in the daemon (see its log)"}

    def handle(self, msg, peer_pid, peer_uid):
        op = msg.get("op")
        if op == "register":
            if peer_pid <= 0:
                return {"error": "your process is in another pid namespace: the daemon cannot see its pid"}
            priority = check_hint("priority", msg.get("priority", 0))
            hints = msg.get("hints", {})
            if not isinstance(hints, dict):
                raise ValueError("hints must be an object, e.g. {\"utilization\": 25}")
            hints = {name: check_hint(name, value) for name, value in hints.items()}
            if "priority" in hints:
                raise ValueError('give the priority as "priority", not among the hints')
            tid = msg.get("tid", 0)
            if isinstance(tid, bool) or not isinstance(tid, int) or not 0 <= tid <= PID_MAX:
                raise ValueError(f"tid must be a thread id or 0 (the whole process), got {short_repr(tid)}")
            try:
                slot = self.board.allocate(peer_pid, priority, tid)      # the peer's own pid, never the message's
            except RuntimeError as e:          # the board is full
                return {"error": str(e)}
            for name, value in hints.items():
                self.board.set_hint(slot, name, value)
            self._watch_pid(peer_pid)
            return {"ok": True, "slot": slot}
        if op == "attach":
            return self._attach_process(msg, peer_uid)
        if op == "detach":
            target = check_pid(msg.get("pid"))
            if not may_change(peer_uid, target):
                return {"error": f"permission denied: only root or the owner of pid {target} may detach it"}
            slots = [i for i, s in self.board.slots() if s.pid == target and s.attached]
            if not slots:
                return {"error": f"pid {target} is not attached (a process under `xsched-lv3 run` leaves when it exits)"}
            for slot in slots:
                self.board.release(slot, target)
            self._schedule()                   # forgets it: whatever is suspended is resumed, the debugger leaves
            return {"ok": True}
        if op == "status":
            return {"ok": True, "pid": os.getpid(), "policy": self.board.policy(), "clients": [
                {**self.board.client_status(i, s), "suspended": bool(s.suspended), **self.engine.describe(i)}
                for i, s in self.board.slots()]}
        if op == "hint":
            target = check_pid(msg.get("pid"))
            name = msg.get("name")
            value = check_hint(name, msg.get("value"))
            if not may_change(peer_uid, target):
                return {"error": f"permission denied: only root or the owner of pid {target} may change its hints"}
            slots = [i for i, s in self.board.slots() if s.pid == target]
            if not slots:
                return {"error": f"pid {target} is not scheduled"}
            one = msg.get("slot")               # one client of the process (a LocalScheduler's queue), else all
            if one is not None:
                if isinstance(one, bool) or not isinstance(one, int) or one not in slots:
                    return {"error": f"slot {short_repr(one)} is not a client of pid {target}"}
                slots = [one]
            for s in slots:
                self.board.set_hint(s, name, value)
            return {"ok": True, "slots": slots}
        if op == "policy":
            if peer_uid not in (0, os.geteuid()):
                return {"error": "permission denied: only root or the daemon's user may change the policy"}
            name = msg.get("name")
            if not isinstance(name, str) or name not in POLICIES:
                return {"error": f"unknown policy {short_repr(name)}; choose one of {', '.join(POLICIES)}"}
            self.board.set_policy(name)
            self.engine.policy = make_policy(name)
            return {"ok": True}
        return {"error": f"unknown op {short_repr(op)}; one of register, attach, detach, status, hint, policy"}

    def _attach_process(self, msg, peer_uid):
        """`xsched-lv3 attach`: schedule a running process that has no gate (LibTorch, HIP C++, any
        framework). Only Lv3 reaches it, so it is refused wherever Lv3 is not available for it."""
        target = check_pid(msg.get("pid"))
        priority = check_hint("priority", msg.get("priority", 0))
        gpu = msg.get("device")
        if gpu is not None and (isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 < gpu < 1 << 32):
            raise ValueError(f"device must be a KFD gpu_id (a positive integer, see `kfdtool topology`), "
                             f"got {short_repr(gpu)}")
        known = [g.gpu_id for g in getattr(self.engine.host, "gpus", ())]
        if gpu is not None and known and gpu not in known:
            return {"error": f"device {gpu} is not a gpu_id of this host ({', '.join(map(str, known[:8]))}"
                             f"{', ...' if len(known) > 8 else ''}; see `kfdtool topology`)"}
        if not may_change(peer_uid, target):
            return {"error": f"permission denied: only root or the owner of pid {target} may attach it"}
        if not alive(target):
            return {"error": f"pid {target} does not exist"}
        if any(s.pid == target for _, s in self.board.slots()):
            return {"error": f"pid {target} is already scheduled"}
        try:
            slot = self.board.allocate(target, priority, 0, kfd_device_key(gpu) if gpu else 0)
        except RuntimeError as e:          # the board is full
            return {"error": str(e)}
        self.board.write(slot, attached=1)
        level, why = self.engine.attach_now(slot, target)
        if level < LV3:
            self.engine.forget(slot)
            self.board.release(slot, target)
            return {"error": f"cannot attach pid {target}: {why.removeprefix('Lv1: ')}; a process without "
                             f"`xsched-lv3 run` can only be preempted at Lv3"}
        self._watch_pid(target)
        self._schedule()
        return {"ok": True, "slot": slot, "why": why}

    # --- client processes -----------------------------------------------------------------------
    def _watch_pid(self, pid):
        if not self.exits.watch(pid):
            self.board.reap()                  # already gone: release its slots now

    def _on_exit(self, pid):
        self.exits.exited(pid)
        for slot, s in self.board.slots():
            if s.pid == pid:
                self.board.release(slot, pid)


def _private_directory(path):
    """Create `path` 0700 if absent; refuse it unless it is a real directory of ours that no one
    else may write or enter (it holds the socket and the lock file at predictable names)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise DaemonRefused(f"cannot create {path}: {e.strerror}") from None
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise DaemonRefused(f"{path} is not a directory of ours with mode 0700 "
                            f"(mode {stat.S_IMODE(st.st_mode):o}, uid {st.st_uid}): refusing to put the socket there")


def _bind_wake(path):
    """Bind the wake socket 0600. A socket of ours at that name that nobody is bound to is one a
    daemon left when it died; anything else stays, a live socket of ours included (another daemon's
    whose --socket is this very name: our instance lock covers our socket's name, not this one)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid():
            raise DaemonRefused(f"{path} exists and is not a wake socket of ours: not removing it")
        if _in_use(path):
            raise DaemonRefused(f"{path} is a socket in use (another daemon's --socket?): not removing it")
        os.unlink(path)
    return _bind_private(socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC),
                         path)


def _bind_private(sock, path):
    """Bind `sock` at `path` created 0600: there is no moment at which others may connect."""
    old_umask = os.umask(0o177)
    try:
        sock.bind(path)
    except OSError as e:
        sock.close()
        why = e.strerror or str(e)                 # "AF_UNIX path too long" has no errno
        raise DaemonRefused(f"cannot create the socket {path}: {why}") from None
    finally:
        os.umask(old_umask)
    return sock


def _unlink_if_ours(path, bound):
    """Remove the socket we bound at `path` ((st_dev, st_ino) `bound`); anything else at that name stays."""
    try:
        if bound and _identity(os.lstat(path)) == bound:
            os.unlink(path)
    except OSError:
        pass


def _in_use(path):
    """Whether a live socket is bound at `path`: a stream one accepts a connection (which its server
    then sees close at once), a datagram one takes a connect; a socket file nobody is bound to refuses
    both (ECONNREFUSED)."""
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        with socket.socket(socket.AF_UNIX, kind | socket.SOCK_CLOEXEC) as probe:
            probe.settimeout(1.0)
            try:
                probe.connect(path)
                return True
            except OSError as e:
                if e.errno != errno.EPROTOTYPE:     # the other kind of socket: try that one
                    return e.errno != errno.ECONNREFUSED
    return True


def _drain_datagrams(sock, most=64):
    """Take the pokes waiting (at most `most`: a flood of them must not keep us from scheduling)."""
    try:
        for _ in range(most):
            sock.recv(64)
    except OSError:                    # BlockingIOError: all read
        pass


def _no_kfd():
    raise OSError("Lv3 is off")


def _last_words(sock, reason):
    """One error reply, if the socket takes it now; a connection being closed is never waited for."""
    try:
        sock.send(json.dumps({"error": reason}).encode() + b"\n")
    except OSError:
        pass


def _drain(fd):
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass
