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
from contextlib import contextmanager
from pathlib import Path

from kfdtool.pids import alive

from .policy import QueueState

MAGIC = b"XSLV3B03"
SLOTS = 32
HEADER = struct.Struct("<8sIIQ")                # magic, slots, policy, generation
SLOT = struct.Struct("<iiIIddddiII")            # pid, priority, active, owner_tid, ready_since,
#                                                 utilization, deadline_us, laxity_us, crit_prio,
#                                                 device (a key naming one GPU across processes; 0 =
#                                                 unknown), reserved
GENERATION_OFFSET = 16
SLOTS_OFFSET = HEADER.size
SIZE = SLOTS_OFFSET + SLOT.size * SLOTS
NAN = float("nan")


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
                        os.pwrite(fd, HEADER.pack(MAGIC, SLOTS, 0, 0), 0)
            self.mm = mmap.mmap(fd, SIZE)
            if self.mm[:8] != MAGIC:
                self.mm.close()
                raise BoardUnusable(f"{self.path} is not an xsched_lv3 board")
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
                owner = self.read_slot(i)[0]
                if owner == 0 or not alive(owner):
                    SLOT.pack_into(self.mm, SLOTS_OFFSET + i * SLOT.size, pid, priority, 0, tid, NAN,
                                   NAN, NAN, NAN, 0, device, 0)
                    self._changed()
                    return i
        raise RuntimeError(f"no free slot on {self.path} ({SLOTS} clients already)")

    def release(self, slot):
        SLOT.pack_into(self.mm, SLOTS_OFFSET + slot * SLOT.size, 0, 0, 0, 0, NAN, NAN, NAN, NAN, 0, 0, 0)
        self._changed()

    def read_slot(self, slot):
        return SLOT.unpack_from(self.mm, SLOTS_OFFSET + slot * SLOT.size)

    def _changed(self):
        """Announce a write (after it is complete: a reader that sees the new value sees the data)."""
        self.generation[0] = random.getrandbits(64)

    def set_active(self, slot, active):
        off = SLOTS_OFFSET + slot * SLOT.size
        struct.pack_into("<I", self.mm, off + 8, 1 if active else 0)
        struct.pack_into("<d", self.mm, off + 16, time.monotonic() if active else NAN)
        self._changed()

    def set_hint(self, slot, name, value):
        off = SLOTS_OFFSET + slot * SLOT.size
        fields = {"priority": (4, "<i"), "utilization": (24, "<d"), "deadline_us": (32, "<d"),
                  "laxity_us": (40, "<d"), "critical_priority": (48, "<i")}
        where, fmt = fields[name]
        struct.pack_into(fmt, self.mm, off + where, value)
        self._changed()

    def set_device(self, slot, device):
        """The GPU a client's work runs on, once it is known (a key, see SLOT)."""
        struct.pack_into("<I", self.mm, SLOTS_OFFSET + slot * SLOT.size + 52, device)
        self._changed()

    def set_policy(self, name):
        """The policy every gate on this board evaluates (0 = each client's own choice)."""
        from .policy import POLICIES
        index = list(POLICIES).index(name) + 1
        struct.pack_into("<I", self.mm, 12, index)
        self._changed()

    def policy(self):
        from .policy import POLICIES
        index = struct.unpack_from("<I", self.mm, 12)[0]
        return list(POLICIES)[index - 1] if 0 < index <= len(POLICIES) else None

    def states(self):
        """QueueStates of every occupied slot (id = slot index)."""
        out = []
        for i in range(SLOTS):
            pid, prio, active, tid, since, util, ddl, lax, crit, device, _ = self.read_slot(i)
            if pid == 0:
                continue
            hints = {"priority": prio}
            for name, value in (("utilization", util), ("deadline_us", ddl), ("laxity_us", lax)):
                if value == value:                    # not NaN
                    hints[name] = value
            if crit:
                hints["critical_priority"] = crit
            out.append(QueueState(i, device, bool(active), since if since == since else None, hints, pid))
        return out

    def clients(self):
        """[(slot, pid, tid, priority, active, device)] for status displays."""
        out = []
        for i in range(SLOTS):
            pid, prio, active, tid, *_, device, _ = self.read_slot(i)
            if pid:
                out.append((i, pid, tid, prio, bool(active), device))
        return out

    def reap(self):
        """Release slots of processes that died (their queues are gone with them)."""
        dead = []
        for slot, pid, *_ in self.clients():
            if not alive(pid):
                self.release(slot)
                dead.append(pid)
        return dead


@contextmanager
def _flock(fd):
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
