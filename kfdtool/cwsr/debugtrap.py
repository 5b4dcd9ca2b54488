"""Queue suspend/resume through the KFD debugger API (DBG_TRAP, KFD ABI >= 1.13), on the calling
process itself or on another process (attached with PTRACE_SEIZE for ENABLE, and, on kernels
before Linux 7.2, which admit only the ptrace parent, for every op: see DebugTrapSuspend._op).

Semantics (kfd-abi.md §2b-§2c): SUSPEND_QUEUES preempts the whole device once under HWS (waves
are CWSR-saved after the grace period), returns how many queues it suspended and per-queue status
words (bit 31 invalid: unknown or still-new queue; bit 30 error). New queues carry EC_QUEUE_NEW
and cannot be suspended until a GET_QUEUE_SNAPSHOT clears it. DISABLE resumes everything, and the
kernel runs DISABLE for us if this process dies, kill -9 included.
"""
import ctypes
import errno
import os
import threading
import weakref
from functools import partial

from ..device import dbg_trap_args
from ..errors import (AlreadyDebugged, AttachDenied, Error, KfdIoctlError, NoSuchProcess, NotSupported,
                      PermissionDenied, ioctl_error)
from ..ioctls import constants as c
from ..ioctls import structs as s
from ..pids import process_state
from . import ptrace
from .holds import debugger_of
from .mechanisms import Availability, Mechanism, MechanismResult, QueueOutcome

NEW_MASK = c.KFD_EC_MASK(c.EC_QUEUE_NEW)
# The one exception a preempting debugger must answer: a target turning its GPU runtime on or off
# (hsa_init, hsa_shut_down) sleeps in RUNTIME_ENABLE until its debugger sends it back
# (kfd_chardev.c: runtime_enable / runtime_disable, down_interruptible(&p->runtime_enable_sema)).
RUNTIME_MASK = c.KFD_EC_MASK(c.EC_PROCESS_RUNTIME)
ENTRY = ctypes.sizeof(s.kfd_queue_snapshot_entry)
WAVE_STATE = s.kfd_context_save_area_header_wave_state      # the 16 bytes get_wave_state writes
MAX_GRACE = 0xFF           # CP_IQ_WAIT_TIME2.SCH_WAVE is 8 bits wide
DEVICE_ENTRIES = 64        # MAX_GPU_INSTANCE: no process has more devices
FIRST_MES_GFX = 110000     # gfx11+: queues are scheduled by MES firmware, not HWS runlists
MES_IGNORES_GRACE = "the MES scheduler (gfx11+) ignores the grace period"
# why the kernel refused to activate a debug session (runtime_state ENABLED_BUSY, kfd_debug.c:
# kfd_dbg_trap_activate): its queues cannot be suspended until the session ends
ENABLED_BUSY_WHY = ("its GPU lets the debugger take one process at a time (no per-VMID debugging before GC "
                    "9.4.2) and another has it, or a queue of it has a CU mask (ENABLED_BUSY)")
SNAPSHOT_SPARE = 8         # GET_QUEUE_SNAPSHOT: room for this many queues created since the last one


def check_grace_period(grace_period):
    """The grace period in 1K-GPU-clock units that the hardware honours: 1..255 under HWS
    (0 is forced to 1 by the driver, wider values are masked to 8 bits; a multiple of 256 would
    mean 'infinite'). Returns the value to pass (0, the driver's default, for None)."""
    if grace_period is None:
        return 0
    if not isinstance(grace_period, int) or grace_period < 0:
        raise ValueError(f"grace period must be an integer >= 0 (units of 1K GPU clocks), got {grace_period!r}")
    if grace_period > MAX_GRACE:
        raise ValueError(f"grace period {grace_period} does not fit the 8-bit SCH_WAVE field (max {MAX_GRACE}); "
                         f"the driver would use {grace_period & 0xFF}")
    return grace_period


def _queue_array(qids):
    """The ioctl's queue array (u32 ids, which the kernel writes each queue's status into). The
    kernel gives a process ids below KFD_MAX_NUM_OF_QUEUES_PER_PROCESS, and reads an id with its
    status bits masked off (bit 31 set names queue 0): a larger id would name another queue, so it
    is refused."""
    bad = [q for q in qids if not isinstance(q, int) or not 0 <= q < c.KFD_MAX_NUM_OF_QUEUES_PER_PROCESS]
    if bad:
        raise ValueError(f"queue ids must be integers in 0..{c.KFD_MAX_NUM_OF_QUEUES_PER_PROCESS - 1}, "
                         f"got {bad[0]!r}")
    return (ctypes.c_uint32 * len(qids))(*qids)


class PreparedCall:
    """One SUSPEND_QUEUES or RESUME_QUEUES of a target, prepared and not yet made, so that those of
    several targets can be made back to back (`make_back_to_back`). `arg` is None where there is
    nothing to call. `done()` reads what the kernel wrote and returns the MechanismResult (it may
    make a call of its own: a retry); it holds what the argument points into, so that stays alive.
    `mech`: the DebugTrapSuspend it is for, which knows whether the kernel wants its debugger to be
    the target's ptrace parent for the call."""

    def __init__(self, arg, done, mech=None):
        self.arg, self.done, self.mech = arg, done, mech

    @classmethod
    def nothing(cls, result):
        return cls(None, lambda: result)

    @property
    def alone(self):
        """Made by itself, inside a ptrace window (see DebugTrapSuspend._op), not in a batch."""
        return self.arg is not None and self.mech is not None and self.mech.ptrace_each_call

    def make(self, kfd):
        """Made by itself: its MechanismResult, or the call's error raised."""
        if self.arg is not None:
            call = partial(kfd.ioctl, "DBG_TRAP", self.arg)
            if self.mech is not None:
                self.mech._op(call)
            else:
                call()
        return self.done()


def make_back_to_back(kfd, calls):
    """Make `calls` (PreparedCalls of mechanisms on `kfd`, one per target) one after another, as a
    loop does: the kernel makes each SUSPEND/RESUME_QUEUES wait for the one before anyway (it holds
    the device queue manager's lock through the remap), and a simulated KFD takes them all in one
    round trip. A call whose kernel wants the caller to be the target's ptrace parent is made alone
    (its window cannot ride in a batch), and so is one that learns it here (EPERM answered to the
    batch). Returns [MechanismResult or Error] in order: one target's error does not stop the
    others, and an error of the device itself (a simulated KFD that went away) is every call's
    answer."""
    made = [call.arg for call in calls if call.arg is not None and not call.alone]
    try:
        answers = iter(kfd.ioctls([("DBG_TRAP", arg) for arg in made]) if made else [])
    except Error as e:
        answers = iter([e] * len(made))
    results = []
    for call in calls:
        try:
            if call.alone:
                results.append(call.make(kfd))
                continue
            answer = next(answers) if call.arg is not None else None
            if isinstance(answer, PermissionDenied) and call.mech is not None:
                call.mech._op_attached(partial(kfd.ioctl, "DBG_TRAP", call.arg), answer)   # raises if still refused
                answer = None
            results.append(answer if isinstance(answer, Error) else call.done())
        except Error as e:
            results.append(e)
    return results


class DebugTrapSuspend(Mechanism):
    name = "debug-trap"

    def __init__(self, kfd, pid, enable=True, read_wave_state=True):
        super().__init__()
        self.kfd, self.pid = kfd, pid
        # Kernels before 7.2 admit only the target's ptrace parent for every op but DISABLE, whoever
        # did ENABLE (kfd_chardev.c: kfd_ioctl_set_debug_trap, "not PTRACED"); 7.2 also admits the
        # process that did. Learned from the kernel's first EPERM that a ptrace window cures (_op).
        self.ptrace_each_call = False
        self.read_wave_state = read_wave_state
        self._entries = {}                 # last snapshot: qid -> kfd_queue_snapshot_entry
        self._mes_gpus = None              # gpu_ids whose scheduler is MES, asked of the kernel once
        self.runtime_state = None
        self._enabled = False
        self._events = None                # (read, write) ends of the pipe the kernel signals events on
        if not kfd.supports("DBG_TRAP"):
            raise NotSupported("DBG_TRAP", errno.ENOTTY, f"KFD ABI {kfd.abi} predates the debugger API (1.13)")
        if enable:
            self._enable()

    # --- every op on the target -------------------------------------------------------------------
    def _op(self, call):
        """Make one DBG_TRAP op on the target (`call()`), inside a ptrace window where the kernel
        wants one. One that answers EPERM is made again as the target's ptrace parent (PTRACE_SEIZE,
        the op, detach: the target's main thread stops for the detach alone); if that is admitted,
        every later op goes that way. EPERM for another reason (the target's runtime is off, for a
        queue op) is EPERM again, and raised."""
        if self.ptrace_each_call:
            return self._in_window(call)
        try:
            return call()
        except PermissionDenied as refused:
            if self.pid == os.getpid():
                raise
            return self._op_attached(call, refused)

    def _op_attached(self, call, refused):
        """`call()` as the target's ptrace parent, after the kernel `refused` it to us without; if
        that is admitted, every later op goes that way."""
        answer = self._in_window(call, refused)
        self.ptrace_each_call = True
        return answer

    def _in_window(self, call, refused=None):
        """`call()` inside a ptrace window. Where there can be none, the caller gets what the kernel
        answers a caller that is not the ptrace parent: EPERM (`refused`, where it said so already)
        if another tracer holds the target (a debugger that took over), ESRCH if it is gone."""
        try:
            with _attached(self.pid):
                return call()
        except AttachDenied:
            if process_state(self.pid) in (None, "Z", "X"):     # exiting: no ptrace, and no kfd_process
                raise ioctl_error("DBG_TRAP", errno.ESRCH) from None
            raise (refused or ioctl_error("DBG_TRAP", errno.EPERM)) from None
        except NoSuchProcess:
            raise ioctl_error("DBG_TRAP", errno.ESRCH) from None

    def _dbg(self, op, *args, **fields):
        return self._op(partial(self.kfd.dbg_trap, op, self.pid, *args, **fields))

    # --- attach ---------------------------------------------------------------------------------
    def _enable(self):
        """ENABLE, subscribed to EC_PROCESS_RUNTIME (see `answer_runtime_event`). The kernel writes
        a byte to the fd passed as dbg_fd when a subscribed exception is raised (kfd_debug.c:
        kfd_dbg_ev_raise): a pipe of ours, non-blocking so the kernel's write never waits."""
        info = s.kfd_runtime_info()
        events = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            with _attached(self.pid):
                try:
                    if self.pid != os.getpid() and _debug_enabled(self.kfd, self.pid):
                        # not ENABLE: a refused ENABLE still takes the debugger role from its holder
                        raise ioctl_error("DBG_TRAP", errno.EALREADY, "ENABLE")
                    self.kfd.dbg_trap("ENABLE", self.pid, "enable", dbg_fd=events[1], exception_mask=RUNTIME_MASK,
                                      rinfo_ptr=ctypes.addressof(info), rinfo_size=ctypes.sizeof(info))
                except AlreadyDebugged as e:
                    holder = debugger_of(self.pid)
                    if holder:                         # another kfdtool, not rocgdb: say which
                        raise AlreadyDebugged("DBG_TRAP", e.errno, f"kfdtool pid {holder} already preempts pid "
                                              f"{self.pid}; wait for it or `kfdtool resume --pid {self.pid} --all`",
                                              op="ENABLE") from None
                    raise
        except BaseException:
            for fd in events:
                os.close(fd)
            raise
        self._events = events
        # closed by close(); also if this object is dropped without it (a caller's error path)
        self._close_events = weakref.finalize(self, _close_fds, events)
        self._enabled = True
        self.runtime_state = c.kfd_dbg_runtime_state(info.runtime_state)

    def answer_runtime_event(self):
        """True if the target turned its GPU runtime on or off and was answered. Such a target
        sleeps in RUNTIME_ENABLE until its debugger sends EC_PROCESS_RUNTIME back with
        SEND_RUNTIME_EVENT (kfd_chardev.c: runtime_enable / runtime_disable; kfd_debug.c:
        kfd_dbg_send_exception_to_runtime ups runtime_enable_sema), and DISABLE does not wake it: a
        debugger that never answers leaves a program asleep in hsa_shut_down at exit. Turning the
        runtime off has already resumed every queue (kfd_dbg_trap_deactivate), and no queue can be
        suspended until it is on again (SUSPEND_QUEUES is EPERM meanwhile). One ioctl when nothing
        is pending: cheap enough to call a few times a second."""
        if not self._enabled:
            return False
        try:
            while os.read(self._events[0], 4096):      # the kernel's wake-up bytes
                pass
        except BlockingIOError:
            pass
        try:
            _, args = self._dbg("QUERY_DEBUG_EVENT", "query_debug_event", exception_mask=RUNTIME_MASK)
        except KfdIoctlError as e:
            if e.errno == errno.EAGAIN:                # nothing pending
                return False
            raise
        if not args.query_debug_event.exception_mask & RUNTIME_MASK:
            return False
        self._dbg("SEND_RUNTIME_EVENT", "send_runtime_event", exception_mask=RUNTIME_MASK)
        return True

    # --- queues ---------------------------------------------------------------------------------
    def queues(self, clear_new=True):
        """The target's queues (newest first). Clearing EC_QUEUE_NEW makes new queues suspendable.
        One ioctl where the target has at most SNAPSHOT_SPARE queues more than last time: the kernel
        writes at most num_queues entries, clears the mask only on those, and answers the total
        (pqm_get_queue_snapshot), so a bigger total means asking again with room for all. A daemon
        refreshes this after every resume; a count-only call first would double that."""
        mask = NEW_MASK if clear_new else 0
        count = len(self._entries) + SNAPSHOT_SPARE
        while True:
            buf = (s.kfd_queue_snapshot_entry * count)()
            _, args = self._dbg("GET_QUEUE_SNAPSHOT", "queue_snapshot", exception_mask=mask,
                                snapshot_buf_ptr=ctypes.addressof(buf), num_queues=count, entry_size=ENTRY)
            if args.queue_snapshot.num_queues <= count:      # every queue fitted
                entries = list(buf[:args.queue_snapshot.num_queues])
                self._entries = {e.queue_id: e for e in entries}
                return entries
            count = args.queue_snapshot.num_queues + SNAPSHOT_SPARE

    def known_queues(self):
        """Queue ids of the last snapshot (empty before the first): suspending these needs no new
        snapshot on the hot path."""
        return list(self._entries)

    def has_work(self):
        """True if a compute queue of the last snapshot has AQL packets written and not yet retired
        (its write and read dispatch ids differ), read from the target's memory as its debugger
        may; None where no pointer could be read. How the activity of a process with no scheduler
        inside is seen from outside."""
        seen = None
        for entry in self._entries.values():
            if entry.queue_type not in (c.KFD_IOC_QUEUE_TYPE_COMPUTE, c.KFD_IOC_QUEUE_TYPE_COMPUTE_AQL):
                continue
            written = self.kfd.read_memory(self.pid, entry.write_pointer_address, 8)
            retired = self.kfd.read_memory(self.pid, entry.read_pointer_address, 8)
            if written is None or retired is None:
                continue
            if written != retired:
                return True
            seen = False
        return seen

    def mes_gpus(self):
        """gpu_ids of the target's devices that MES schedules, from the kernel's device snapshot
        (gfx_target_version per device)."""
        if self._mes_gpus is None:
            layout = self.kfd.abi.layout("kfd_dbg_device_info_entry")
            buf = (layout * DEVICE_ENTRIES)()
            _, args = self._dbg("GET_DEVICE_SNAPSHOT", "device_snapshot", exception_mask=0,
                                snapshot_buf_ptr=ctypes.addressof(buf), num_devices=DEVICE_ENTRIES,
                                entry_size=ctypes.sizeof(layout))
            count = min(args.device_snapshot.num_devices, DEVICE_ENTRIES)
            self._mes_gpus = {d.gpu_id for d in buf[:count] if d.gfx_target_version >= FIRST_MES_GFX}
        return self._mes_gpus

    def suspend(self, qids=None, grace_period=None):
        """One SUSPEND_QUEUES ioctl on the hot path. The snapshot (which also clears EC_QUEUE_NEW)
        is refreshed only when a queue is unknown to it, or the kernel calls one still new."""
        return self.suspend_call(qids, grace_period).make(self.kfd)

    def suspend_call(self, qids=None, grace_period=None):
        """`suspend` prepared, not made (see `make_back_to_back`); a snapshot it needs is taken now."""
        grace = check_grace_period(grace_period)
        if self.runtime_state == c.kfd_dbg_runtime_state.DEBUG_RUNTIME_STATE_ENABLED_BUSY:
            # the kernel would answer EPERM (kfd_ioctl_set_debug_trap: runtime_state not ENABLED), and
            # no later call changes that: the activation at ENABLE was refused (kfd_debug.c:
            # kfd_dbg_trap_activate) until this session ends
            raise PermissionDenied("DBG_TRAP", errno.EPERM, f"{ENABLED_BUSY_WHY}; its queues cannot be suspended "
                                   "while this debug session lasts", op="SUSPEND_QUEUES")
        if qids is None or not self._entries or any(q not in self._entries for q in qids):
            self.queues()
        entries = self._entries
        qids = list(entries) if qids is None else list(qids)
        if not qids:
            return PreparedCall.nothing(MechanismResult())
        notes = []
        if grace_period is not None and self.mes_gpus() & {entries[q].gpu_id for q in qids if q in entries}:
            notes.append(MES_IGNORES_GRACE)
        before = set(self._held)
        arr, arg = self._suspend_args(qids, grace)
        return PreparedCall(arg, lambda: self._suspended(qids, list(arr), entries, before, notes, grace), self)

    def _suspended(self, qids, arr, entries, before, notes, grace):
        if any(st & c.KFD_DBG_QUEUE_INVALID_MASK and q in entries for q, st in zip(qids, arr)):
            self.queues()                     # clear EC_QUEUE_NEW on queues created since, retry
            entries = self._entries
            retry = [q for q, st in zip(qids, arr) if st & c.KFD_DBG_QUEUE_INVALID_MASK and q in entries]
            again, arg = self._suspend_args(retry, grace)
            self._op(partial(self.kfd.ioctl, "DBG_TRAP", arg))
            for q, st in zip(retry, again):
                arr[qids.index(q)] = st
        outcomes = []
        for qid, status in zip(qids, arr):
            entry = entries.get(qid)
            gpu = entry.gpu_id if entry else None
            if status & c.KFD_DBG_QUEUE_ERROR_MASK:
                outcomes.append(QueueOutcome(qid, "error", gpu, detail="the device failed to preempt"))
            elif status & c.KFD_DBG_QUEUE_INVALID_MASK:
                if entry is None:
                    outcomes.append(QueueOutcome(qid, "not-found", None, detail="no such queue in the target"))
                else:
                    outcomes.append(QueueOutcome(qid, "new-queue", gpu,
                                                 detail="created since the snapshot or being destroyed"))
            else:
                self._held.add(qid)
                outcome = QueueOutcome(qid, "already" if qid in before else "suspended", gpu)
                if self.read_wave_state and entry is not None and entry.queue_type in (
                        c.KFD_IOC_QUEUE_TYPE_COMPUTE, c.KFD_IOC_QUEUE_TYPE_COMPUTE_AQL):
                    outcome.ctl_stack_bytes, outcome.save_area_bytes = self._wave_state(entry)
                outcomes.append(outcome)
        return MechanismResult(outcomes, notes)

    def _suspend_args(self, qids, grace):
        """(the queue array the kernel writes each queue's status into, the ioctl's argument)."""
        arr = _queue_array(qids)
        return arr, dbg_trap_args("SUSPEND_QUEUES", self.pid, "suspend_queues", exception_mask=NEW_MASK,
                                  queue_array_ptr=ctypes.addressof(arr), num_queues=len(qids), grace_period=grace)

    def _wave_state(self, entry):
        """The header the kernel wrote at the CWSR area on suspend: bytes of control stack and
        of saved wave state (XCC 0's, as GET_QUEUE_WAVE_STATE reports)."""
        if not entry.ctx_save_restore_address:
            return None, None
        raw = self.kfd.read_memory(self.pid, entry.ctx_save_restore_address, ctypes.sizeof(WAVE_STATE))
        if raw is None:
            return None, None
        header = WAVE_STATE.from_buffer_copy(raw)
        return header.control_stack_size, header.wave_state_size

    def resume(self, qids=None):
        return self.resume_call(qids).make(self.kfd)

    def resume_call(self, qids=None):
        """`resume` prepared, not made (see `make_back_to_back`)."""
        qids = sorted(self._held) if qids is None else list(qids)
        if not qids:
            return PreparedCall.nothing(MechanismResult())
        arr = _queue_array(qids)
        arg = dbg_trap_args("RESUME_QUEUES", self.pid, "resume_queues", queue_array_ptr=ctypes.addressof(arr),
                            num_queues=len(qids))
        return PreparedCall(arg, lambda: self._resumed(qids, arr), self)

    def _resumed(self, qids, arr):
        outcomes = []
        for qid, status in zip(qids, arr):
            if status & c.KFD_DBG_QUEUE_ERROR_MASK:
                outcomes.append(QueueOutcome(qid, "error", detail="the device failed to remap the queue"))
            elif status & c.KFD_DBG_QUEUE_INVALID_MASK:
                self._held.discard(qid)
                outcomes.append(QueueOutcome(qid, "not-found", detail="the queue no longer exists"))
            else:
                self._held.discard(qid)
                outcomes.append(QueueOutcome(qid, "resumed"))
        return MechanismResult(outcomes)

    def resume_all(self):
        """RESUME_QUEUES with a NULL array: every queue of the target. Returns the count."""
        ret, _ = self._dbg("RESUME_QUEUES", "resume_queues", queue_array_ptr=0, num_queues=0)
        self._held.clear()
        return ret

    def close(self):
        if not self._enabled:
            return
        try:
            self.answer_runtime_event()                   # DISABLE would leave a sleeping target asleep
            if self._held:
                self.resume()
        except KfdIoctlError as e:
            # the target exited (ESRCH), or turned its runtime off, which resumed its queues (EPERM)
            if e.errno not in (errno.ESRCH, errno.EPERM):
                raise
        finally:
            self._enabled = False
            try:
                self._disable()
            finally:
                self.abandon()

    def abandon(self):
        """Forget the target without a call: the connection it was debugged through is gone (a
        simulated KFD whose server stopped took its processes with it). Only our own pipe is closed."""
        self._enabled = False
        self._held.clear()
        if self._events is not None:
            self._close_events()
            self._events = None

    def _disable(self):
        """DISABLE: resumes anything left and drops us as debugger. EPERM means another process took
        the role from us (any ENABLE on the target names its caller debugger_process before it is
        refused, kfd_chardev.c: kfd_ioctl_set_debug_trap), and the kernel no longer disables it for
        us when we exit either: so become its ptrace parent for the call, which the kernel admits.
        If another tracer holds it (a debugger that did take over), the error is raised."""
        try:
            self._disable_call()
        except KfdIoctlError as e:
            if e.errno != errno.EPERM or self.pid == os.getpid():
                raise
            with _attached(self.pid):
                self._disable_call()

    def _disable_call(self):
        try:
            self.kfd.dbg_trap("DISABLE", self.pid)
        except KfdIoctlError as e:
            if e.errno != errno.ESRCH:                    # the target exited: nothing left to resume
                raise


def _debug_enabled(kfd, pid):
    """Whether `pid` is debug-enabled (by anyone), asked as its ptrace parent without ENABLE:
    GET_QUEUE_SNAPSHOT for no entries and no exception bits (it changes nothing) is EINVAL on a
    target that is not (kfd_ioctl_set_debug_trap), and answers the queue count on one that is."""
    try:
        kfd.dbg_trap("GET_QUEUE_SNAPSHOT", pid, "queue_snapshot", exception_mask=0, snapshot_buf_ptr=0,
                     num_queues=0, entry_size=ENTRY)
    except KfdIoctlError as e:
        if e.errno == errno.EINVAL:
            return False
        raise
    return True


def _close_fds(fds):
    for fd in fds:
        os.close(fd)


class _attached:
    """PTRACE_SEIZE around ENABLE when the target is another process."""

    def __init__(self, pid):
        self.pid = pid
        self.seized = False

    def __enter__(self):
        # the tracer is a thread: the kernel admits the one that seized (ptrace_parent is a task)
        if self.pid != os.getpid() and ptrace.tracer_of(self.pid) != threading.get_native_id():
            try:
                ptrace.seize(self.pid)
            except ptrace.PtraceError as e:
                if e.errno == errno.ESRCH:
                    raise NoSuchProcess(self.pid, "does not exist") from None
                raise AttachDenied(f"cannot attach to pid {self.pid} with ptrace: {e.strerror}") from None
            self.seized = True
        return self

    def __exit__(self, *exc):
        if self.seized:
            ptrace.detach(self.pid)


def recover(kfd, pid, qids=None):
    """`kfdtool resume --all`: resume queues of `pid` whoever suspended them. We become its ptrace
    parent, which the kernel accepts for every DBG_TRAP op. Where a live debugger holds it we resume
    as ptrace parent without ENABLE, which would take the debugger role from it even though refused
    (see DebugTrapSuspend._disable), and leave that debugger in place."""
    with _attached(pid):
        own = not _debug_enabled(kfd, pid)
        if own:
            kfd.dbg_trap("ENABLE", pid, "enable", dbg_fd=kfd.fd, exception_mask=0)
        try:
            mech = DebugTrapSuspend(kfd, pid, enable=False)
            if qids is None:
                count = mech.resume_all()
                outcomes = None
            else:
                outcomes = mech.resume(qids).outcomes
                count = sum(o.ok for o in outcomes)
        finally:
            if own:
                kfd.dbg_trap("DISABLE", pid)
    return count, outcomes, own


def availability(kfd_abi_minor, sched_policy, gfx_versions, target_pid=None):
    notes = []
    if kfd_abi_minor is not None and kfd_abi_minor < 13:
        return Availability("debug-trap", False, f"KFD ABI 1.{kfd_abi_minor} has no debugger API (needs 1.13)")
    if sched_policy == 2:
        return Availability("debug-trap", False, "amdgpu sched_policy=2 (no HWS): the kernel refuses debugger ops")
    if gfx_versions and min(gfx_versions) < 90000:
        return Availability("debug-trap", False, "a GPU older than gfx9 has no debugger support (ENODEV)")
    if any(v >= 110000 for v in gfx_versions):
        notes.append("MES GPUs (gfx11+) ignore the grace period")
    if any(v < 110000 for v in gfx_versions):
        notes.append("HWS: every suspend/resume unmaps and remaps all queues of the device")
    why = "available"
    if target_pid is not None and target_pid != os.getpid():
        tracer = ptrace.tracer_of(target_pid)
        if tracer and tracer != os.getpid():
            return Availability("debug-trap", False, f"pid {target_pid} is traced by pid {tracer} (rocgdb?): "
                                                     f"ENABLE would fail with EALREADY-like conflicts", notes)
        if os.geteuid() != 0 and _owner(target_pid) != os.geteuid():
            return Availability("debug-trap", False, ptrace.why_denied(target_pid), notes)
        why = ("available: attaches with PTRACE_SEIZE for ENABLE, and for every op on kernels before Linux 7.2 "
               "(they admit only the ptrace parent); the target must have runtime-enabled: ROCr does")
    return Availability("debug-trap", True, why, notes)


def _owner(pid):
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
