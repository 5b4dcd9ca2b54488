"""The shared board: one small memory-mapped file (/dev/shm) through which scheduled processes and
threads see each other's state, so the hot path is a memory read instead of a round trip.

Each client owns one slot and is its only writer for `active`/`ready_since`; hints are written by
the client, the daemon or `xsched-lv3 hint` (root or the owner). Every write then stores a fresh
random 64-bit generation in the header, so a reader tells whether anything changed by comparing one
integer (`Board.generation[0]`), which a guarded client does on every module call. A random value
rather than a counter: two writers racing on an increment could leave the value a reader last saw,
and the change would go unseen; a fresh value is never the old one (but with odds of 2**-64).
Slot allocation takes an flock. Slots of dead pids are reclaimed.
"""
import errno
import fcntl
import mmap
import os
import random
import stat
import struct
import time
import zlib
from collections import namedtuple
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from kfdtool.pids import alive, start_time, state_and_start, stopped

from . import daemon_link
from .policy import POLICIES, QueueState

MAGIC = b"XSLV3B06"
SLOTS = 32
REGISTER_TIMEOUT_S = 0.5                        # a daemon that does not answer: take a slot from the board
HEADER = struct.Struct("<8sIIQiIQ")             # magic, slots, policy, generation, daemon: pid, -, start time
GENERATION_OFFSET = 16
DAEMON = struct.Struct("<iIQ")                  # the daemon: pid, padding, start time (a reused pid is not it)
DAEMON_OFFSET = 24
# One slot per client. Who writes each field (one writer per field): the client itself (C), or, while
# one runs, the daemon (D); hints also come from `xsched-lv3 hint` through the daemon.
SLOT_FIELDS = (
    ("pid", "i"),                 # D (C without a daemon): the client's process
    ("priority", "i"),            # D/C hint
    ("active", "I"),              # C: a request of it is in progress (lower clients read this)
    ("tid", "I"),                 # C: the thread a `client()` block binds (0: the whole process)
    ("ready_since", "d"),         # C: when it became active (deadline policies)
    ("utilization", "d"),         # D/C hints
    ("deadline_us", "d"),
    ("laxity_us", "d"),
    ("critical_priority", "i"),
    ("device", "I"),              # C: a key naming its GPU across processes (0 = not known yet)
    ("level", "I"),               # D: 3 while the daemon preempts it (KFD queue suspend), else 1 (gate)
    ("suspended", "I"),           # D: its queues are suspended now
    ("suspends", "I"),            # D: how many times they were
    ("held", "I"),                # C: its launching thread is held back by its gate now
    ("held_s", "d"),              # C: seconds held back by its gate, in total
    ("suspended_s", "d"),         # D: seconds suspended, in total
    ("attached", "I"),            # D: registered by `xsched-lv3 attach` (no gate inside: never active)
    ("exposing", "I"),            # C: its requests run beside lower clients now (protection.py's verdict)
    ("started", "Q"),             # D/C: the client process's start time (/proc/PID/stat, 0: not known):
                                  # with the pid, it names that process after the pid is reused
)
SLOT = struct.Struct("<" + "".join(code for _, code in SLOT_FIELDS))
Slot = namedtuple("Slot", [name for name, _ in SLOT_FIELDS])
FIELD_OFFSET = {name: struct.calcsize("<" + "".join(code for _, code in SLOT_FIELDS[:i]))
                for i, (name, _) in enumerate(SLOT_FIELDS)}
POLICY_NAMES = tuple(POLICIES)          # the header's policy field: 1 + an index into these (0: none)
FIELD_STRUCT = {name: struct.Struct("<" + code) for name, code in SLOT_FIELDS}    # compiled once: writes are hot
EMPTY_SLOT = Slot(pid=0, priority=0, active=0, tid=0, ready_since=float("nan"), utilization=float("nan"),
                  deadline_us=float("nan"), laxity_us=float("nan"), critical_priority=0, device=0, level=1,
                  suspended=0, suspends=0, held=0, held_s=0.0, suspended_s=0.0, attached=0, exposing=0, started=0)
SLOTS_OFFSET = HEADER.size
_PID = struct.Struct("<i")                      # a slot's first field
SIZE = SLOTS_OFFSET + SLOT.size * SLOTS
NAN = float("nan")


def kfd_device_key(gpu_id):
    """The board's key for the GPU a KFD gpu_id names (what the simulated runtime's clients and
    `xsched-lv3 attach --device` use)."""
    return zlib.crc32(f"kfd-gpu-{gpu_id}".encode()) or 1


def default_path():
    base = "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"
    # the layout version is in the name, so a board left by an older release is never misread
    return os.environ.get("XSCHED_LV3_BOARD") or f"{base}/xsched-lv3-{os.getuid()}.{MAGIC[-3:].decode()}.board"


class BoardUnusable(ValueError):
    """The board's path names something we must not use as our board."""


def _open_private(path):
    """Open (creating it if absent) a board file only its owner can write, refusing anything
    another user could have placed at this predictable name in a shared directory (/dev/shm is
    world-writable): a symlink (never followed), a file of another owner or writable by others
    (forged slots would hold our clients back), a hard link (a name for some other file)."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        try:
            fd = os.open(path, flags)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise BoardUnusable(f"{path} is a symbolic link: refusing it as a board") from None
            raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BoardUnusable(f"{path} is not a regular file: refusing it as a board")
        if st.st_uid != os.geteuid():
            raise BoardUnusable(f"{path} belongs to uid {st.st_uid}, not to us: refusing it as a board "
                                "(set XSCHED_LV3_BOARD to a path of your own)")
        if st.st_mode & 0o022:
            raise BoardUnusable(f"{path} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}): "
                                "refusing it as a board")
        if st.st_nlink != 1:
            raise BoardUnusable(f"{path} has {st.st_nlink} links: refusing it as a board")
    except BaseException:
        os.close(fd)
        raise
    return fd


class Board:
    def __init__(self, path=None):
        self.path = Path(path or default_path())
        fd = _open_private(self.path)
        try:
            if os.fstat(fd).st_size < SIZE:
                with _flock(fd):
                    size = os.fstat(fd).st_size
                    if size and os.pread(fd, len(MAGIC), 0) != MAGIC:
                        raise BoardUnusable(f"{self.path} is not an xsched_lv3 board")   # never overwrite it
                    if size < SIZE:
                        os.ftruncate(fd, SIZE)
                        os.pwrite(fd, HEADER.pack(MAGIC, SLOTS, 0, 0, 0, 0, 0), 0)
            self.mm = mmap.mmap(fd, SIZE)
            if self.mm[:8] != MAGIC:
                self.mm.close()
                raise BoardUnusable(f"{self.path} is not an xsched_lv3 board")
        except OSError as e:
            os.close(fd)
            if e.filename is not None:
                raise
            # a regular file of ours that cannot serve (procfs: no seeking, no mapping): say which
            raise OSError(e.errno, e.strerror, str(self.path)) from None
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        # the hot path's read: one native int, no bytes object built (see the module's docstring)
        self.generation = memoryview(self.mm)[GENERATION_OFFSET:GENERATION_OFFSET + 8].cast("Q")

    def close(self):
        self.generation.release()
        self.mm.close()
        os.close(self.fd)

    # --- slots ----------------------------------------------------------------------------------
    def allocate(self, pid, priority=0, tid=0, device=0):
        with _flock(self.fd):
            for i in range(SLOTS):
                owner = self.read_slot(i)
                if owner.pid == 0 or not _lives(owner):
                    SLOT.pack_into(self.mm, SLOTS_OFFSET + i * SLOT.size,
                                   *EMPTY_SLOT._replace(pid=pid, priority=priority, tid=tid, device=device,
                                                        started=start_time(pid) or 0))
                    self._changed()
                    return i
        raise RuntimeError(f"no free slot on {self.path} ({SLOTS} clients already)")

    def release(self, slot, pid=None):
        """Empty `slot`; with `pid`, only while that process still owns it (under the allocation
        lock: a slot freed and taken by a new client meanwhile is left to it)."""
        with _flock(self.fd):
            if pid is not None and _PID.unpack_from(self.mm, SLOTS_OFFSET + slot * SLOT.size)[0] != pid:
                return False
            SLOT.pack_into(self.mm, SLOTS_OFFSET + slot * SLOT.size, *EMPTY_SLOT)
        self._changed()
        return True

    def read_slot(self, slot):
        return Slot._make(SLOT.unpack_from(self.mm, SLOTS_OFFSET + slot * SLOT.size))

    def _changed(self, expect=None):
        """Announce a write (after it is complete: a reader that sees the new value sees the data).
        Returns the new generation if the one it replaced was `expect` (no other write announced
        since the caller last read the board, but for one landing in the few instructions between
        this read and this write), else None."""
        replaced = self.generation[0]
        new = self.generation[0] = random.getrandbits(64)
        return new if replaced == expect else None

    def write(self, slot, announce=True, expect=None, **fields):
        """Write fields of one slot. `announce=False` for what no scheduling decision reads
        (counters, times): then no client re-reads the board for it. Returns what `_changed`
        returns for `expect` (None when not announced)."""
        base = SLOTS_OFFSET + slot * SLOT.size
        for name, value in fields.items():
            FIELD_STRUCT[name].pack_into(self.mm, base + FIELD_OFFSET[name], value)
        return self._changed(expect) if announce else None

    def set_active(self, slot, active, expect=None):
        return self.write(slot, active=1 if active else 0, ready_since=time.monotonic() if active else NAN,
                          expect=expect)

    def set_hint(self, slot, name, value):
        if name not in ("priority", "utilization", "deadline_us", "laxity_us", "critical_priority"):
            raise ValueError(f"{name} is not a hint")
        self.write(slot, **{name: value})

    def set_device(self, slot, device):
        """The GPU a client's work runs on, once it is known (a key, see SLOT_FIELDS)."""
        self.write(slot, device=device)

    def set_policy(self, name):
        """The policy every gate on this board evaluates (0 = each client's own choice)."""
        index = POLICY_NAMES.index(name) + 1
        struct.pack_into("<I", self.mm, 12, index)
        self._changed()

    def policy(self):
        index = struct.unpack_from("<I", self.mm, 12)[0]
        return POLICY_NAMES[index - 1] if 0 < index <= len(POLICY_NAMES) else None

    # --- the daemon ------------------------------------------------------------------------------
    def set_daemon(self, pid):
        """The daemon serving this board (0: none). Clients read it to know whether Lv3 can be
        offered and where to send wake-ups; a daemon that died, or is stopped, is seen as none."""
        DAEMON.pack_into(self.mm, DAEMON_OFFSET, pid, 0, (start_time(pid) or 0) if pid else 0)
        self._changed()

    def clear_daemon(self, pid):
        """A daemon leaving: forget it, unless another has taken its place meanwhile."""
        if DAEMON.unpack_from(self.mm, DAEMON_OFFSET)[0] == pid:
            self.set_daemon(0)

    def daemon_pid(self):
        """The pid of the daemon serving this board if it lives and runs (not stopped), else 0."""
        pid, _, started = DAEMON.unpack_from(self.mm, DAEMON_OFFSET)
        state, start = state_and_start(pid) if pid > 0 else (None, None)
        if start != started or state in ("T", "t", "Z", "X", None):
            return 0
        return pid

    # --- readers ---------------------------------------------------------------------------------
    def slots(self):
        """[(index, Slot)] of every occupied slot (an empty one costs one integer read)."""
        mm, size = self.mm, SLOT.size
        return [(i, Slot._make(SLOT.unpack_from(mm, SLOTS_OFFSET + i * size)))
                for i in range(SLOTS) if _PID.unpack_from(mm, SLOTS_OFFSET + i * size)[0]]

    def states(self, slots=None):
        """QueueStates of every occupied slot (id = slot index), or of `slots` read before."""
        out = []
        for i, s in (self.slots() if slots is None else slots):
            hints = {"priority": s.priority}
            for name in ("utilization", "deadline_us", "laxity_us"):
                value = getattr(s, name)
                if value == value:                    # not NaN
                    hints[name] = value
            if s.critical_priority:
                hints["critical_priority"] = s.critical_priority
            ready_since = s.ready_since if s.ready_since == s.ready_since else None
            out.append(QueueState(i, s.device, bool(s.active), ready_since, hints, s.pid))
        return out

    @staticmethod
    def client_status(index, s):
        """What `xsched-lv3 status` shows of a slot from the board alone (the daemon adds the
        level, why, and its suspend counts)."""
        return {"slot": index, "pid": s.pid, "tid": s.tid, "priority": s.priority, "device": s.device,
                "active": bool(s.active), "held": bool(s.held), "held_s": s.held_s, "attached": bool(s.attached),
                "exposing": bool(s.exposing)}

    def reap(self):
        """Release slots of processes that died (their queues are gone with them), a process that
        got a dead client's pid since included."""
        dead = []
        for slot, s in self.slots():
            if not _lives(s) and self.release(slot, s.pid):
                dead.append(s.pid)
        return dead


def _lives(s):
    """Whether the process that took slot `s` lives: its pid alive and, where the slot recorded it,
    started when that process did. Without that, a service killed mid-request whose pid another
    process got held every lower client until that one exited. One read of /proc/PID/stat."""
    state, started = state_and_start(s.pid)
    if state is None:                     # /proc does not show it (another pid namespace): kill(0) says
        return alive(s.pid)
    return state not in ("Z", "X") and (not s.started or started == s.started)


def stopped_activations(states):
    """(id, ready_since) of the activations in `states` whose process is stopped (SIGSTOP, a
    debugger): keyed by the activation, so that the same client's next request counts again."""
    return {(q.id, q.ready_since) for q in states if q.ready and stopped(q.pid)}


def excuse(states, excused):
    """`states` with the activations in `excused` (stopped_activations) not ready: a stopped
    higher-priority process holds nobody, or it would hold every lower one for as long as it stays
    stopped."""
    if not excused:
        return states
    return [replace(q, ready=False) if (q.id, q.ready_since) in excused else q for q in states]


def _ask_serving_daemon(board, msg):
    """The reply of the daemon serving this board to `msg`, or {} where none does or it does not
    answer within REGISTER_TIMEOUT_S (the caller then writes the board itself)."""
    if not board.daemon_pid():
        return {}
    try:
        return daemon_link.request(msg, timeout=REGISTER_TIMEOUT_S)
    except ConnectionError:
        return {}


def register_client(board, priority, tid, hints, device=0):
    """A client's slot: from the daemon when one serves this board (it is then the one writer of the
    slot's identity and hints, and may preempt the process at Lv3), else straight from the board."""
    reply = _ask_serving_daemon(board, {"op": "register", "priority": priority, "tid": tid, "hints": hints})
    slot = reply["slot"] if isinstance(reply.get("slot"), int) else None
    if slot is None:
        slot = board.allocate(os.getpid(), priority, tid, device)
        for key, value in hints.items():
            board.set_hint(slot, key, value)
    elif device:
        board.set_device(slot, device)
    return slot


def set_client_hint(board, slot, name, value):
    """A hint of this process's client in `slot`: through the daemon when one serves this board (it is
    then the hints' one writer, as for `xsched-lv3 hint`), else straight to the board."""
    if not _ask_serving_daemon(board, {"op": "hint", "pid": os.getpid(), "slot": slot, "name": name,
                                       "value": value}).get("ok"):
        board.set_hint(slot, name, value)


@contextmanager
def _flock(fd):
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
