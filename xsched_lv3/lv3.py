"""Lv3 in the daemon: while a higher-priority client on its GPU is active, a client's KFD queues are
suspended (DBG_TRAP SUSPEND_QUEUES: the scheduler preempts them and CWSR saves their waves), and they
are resumed when it goes idle. A client under Lv3 launches with no per-launch gate at all (its gate
only marks its requests active/idle for those below it), so it pays nothing per kernel, and it works
for any framework, HIP graphs included. The high-priority client waits only for the save, not for
the lower clients' in-flight work to drain (what Lv1 must wait for).

The daemon takes the debugger role on a client (DBG_TRAP ENABLE inside a short PTRACE_SEIZE window,
as `kfdtool preempt` does; on kernels before Linux 7.2, which admit only the ptrace parent, every
later call gets such a window too) once a higher-priority client shares its GPU and its GPU is in use (before
that it has no KFD process). Its queues come from GET_QUEUE_SNAPSHOT, which also clears EC_QUEUE_NEW:
taken before the first suspend and again after each resume (off the hot path), so a queue created
later is suspended from the next time on (not while a higher client stays active throughout). Each client's level and the
reason are chosen here and shown by `xsched-lv3 status`; where Lv3 is not possible the client keeps
its Lv1 gate.

HWS reality (kfd_device_queue_manager.c: suspend_queues and resume_queues end in
execute_queues_cpsch): every suspend and every resume unmaps and remaps *all* queues of the device,
the high-priority client's included, so each one stalls everybody for a remap. Hence:
  * one SUSPEND_QUEUES per client, all its queues in one call (the ioctl names one target pid, so
    several clients cannot share a call), and the calls for several clients made back to back,
    before any bookkeeping (`make_back_to_back`): the kernel makes each wait for the one before on
    its DQM lock through the remap, so threads would gain nothing on a real KFD, and on a
    simulated one they cost each call a thread's wake-up (p50 0.4 ms apart for three on a busy
    2-vCPU host) where one round trip carries them all;
  * hysteresis: after the higher-priority client goes idle, a suspended client either is resumed at
    once or stays suspended for as long as its last suspend plus resume took (measured, per client),
    whichever would have cost less over the last GAP_HISTORY idle gaps of the clients above it (see
    `hold_for`): an HP that keeps coming straight back causes no resume/suspend storm, and one whose
    requests are far apart does not cost the lower clients that wait after every request;
  * the grace period (waves allowed to finish before the save) is the shortest the hardware honours:
    see `grace_period_for`.
Nothing stays suspended: a client's queues are resumed when it no longer must yield, when it exits
(pidfd), when the daemon stops (it ignores Ctrl-Z: a stopped daemon would hold them), and, if the
daemon is killed (even by kill -9), by the kernel's
debugger-exit path (kfd_process.c: kfd_process_notifier_release_internal -> kfd_dbg_trap_disable of
every process it debugged), which resumes every queue it suspended.
"""
import errno
import os
import time
from collections import deque
from dataclasses import dataclass, field

from kfdtool.cwsr.debugtrap import ENABLED_BUSY_WHY, DebugTrapSuspend, availability, make_back_to_back
from kfdtool.cwsr.holds import Hold
from kfdtool.cwsr.params import read_parameters
from kfdtool.cwsr.sizing import cwsr_sizes
from kfdtool.errors import (AlreadyDebugged, AttachDenied, Error, KfdIoctlError, NoSuchProcess, PermissionDenied,
                            SimulatorError)
from kfdtool.ioctls.constants import kfd_dbg_runtime_state
from kfdtool.ioctls.structs import kfd_ioctl_get_version_args
from kfdtool.sysfs import SysfsRoot
from kfdtool.topology import read_topology

from .board import excuse, stopped_activations
from .policy import GAP_HISTORY, hold_for, shares_device

LV1, LV3 = 1, 3
RUNTIME_ON = kfd_dbg_runtime_state.DEBUG_RUNTIME_STATE_ENABLED
RUNTIME_BUSY = kfd_dbg_runtime_state.DEBUG_RUNTIME_STATE_ENABLED_BUSY
# A stopped process's activation is excused (it holds nobody) at most this long after it stopped
# (plus one sync): each look reads /proc/<pid>/stat of every active client.
STOPPED_CHECK_S = 0.05
RETRY_ATTACH_S = 0.5           # a client whose GPU is not yet a KFD process: ask again this often
# An attached process has no gate to say when it is busy: the daemon reads its queues' read and
# write pointers this often, while it has a lower-priority client to preempt. The detection delay is
# up to this plus the reads (scripts/bench_attach_detect.py measures both, and the CPU it costs).
ATTACHED_POLL_S = 1e-3
SNAPSHOT_EVERY_S = 1.0         # ... and takes its queue list again this often (queues created later)
# A client that turns its GPU runtime off (hsa_shut_down, at exit) or on sleeps in the kernel until
# its debugger answers (DebugTrapSuspend.answer_runtime_event): asked of every Lv3 client this
# often, the longest such a program waits for the daemon (one ioctl a client each time).
RUNTIME_POLL_S = 0.1
# A mean wave life under which waiting (the grace period) would beat saving: ML kernels' waves live
# tens of µs to ms. ESTIMATE, used only to pick the grace period (see grace_period_for).
WAVE_LIFE_S = 1e-3
MIN_GRACE = 1                  # 1K GPU clocks: 0 asks for the driver's default, which it forces to 1


def grace_period_for(node):
    """(grace period in 1K GPU clocks, why). The HP waits for grace + save; a grace period only
    shortens the save by the waves that finish meanwhile. Saving a full device takes
    wg_data_size x XCCs / HBM bandwidth (CWSR sizes from the kernel's formula or sysfs, bandwidth
    from the node's memory banks: width x clock x 2, DDR), microseconds on a data-centre GPU, far
    below a wave's life, so the shortest grace period the hardware honours is best."""
    sizes = cwsr_sizes(node.props) if node is not None else None
    bandwidth = _memory_bandwidth(node)
    if sizes is None or not bandwidth:
        return MIN_GRACE, "shortest grace period (no CWSR sizes or memory bandwidth to weigh)"
    save_s = sizes.max_save_bytes / bandwidth
    if save_s < WAVE_LIFE_S:
        return MIN_GRACE, (f"shortest grace period: saving every wave takes ~{save_s * 1e6:.0f} µs, "
                           f"less than waiting for waves to finish")
    clock_hz = (node.props.get("max_engine_clk_fcompute") or 1500) * 1e6
    return min(255, max(MIN_GRACE, int(WAVE_LIFE_S * clock_hz / 1024))), \
        f"saving every wave takes ~{save_s * 1e3:.1f} ms: waves get a grace period to finish"


def _memory_bandwidth(node):
    if node is None:
        return 0.0
    total = 0.0
    for bank in getattr(node, "mem_banks", ()):
        props = getattr(bank, "props", {}) or {}
        width, clock_mhz = props.get("width", 0), props.get("mem_clk_max", 0)
        total += width / 8 * clock_mhz * 1e6 * 2
    return total


@dataclass
class Call:
    """One KFD call made for the engine: when it started, how long it took, and what it returned
    or raised."""
    started: float
    took_s: float
    result: object = None
    error: Exception | None = None


class Host:
    """What Lv3 needs to know about this machine: its KFD (opened once), amdgpu's parameters and
    the GPUs' topology, or why there is no KFD. `open_kfd` returns a kfdtool KfdDevice."""

    def __init__(self, open_kfd, sysfs_root=None, max_level=LV3):
        self.kfd, self.no_kfd = None, None
        self.max_level = max_level
        self.kfd_procs = SysfsRoot(sysfs_root).proc     # /sys/class/kfd/kfd/proc: one entry per KFD process
        self.pids_match = False
        self.grace_period, self.grace_why = MIN_GRACE, ""
        self.lost = False                               # the KFD went away (a stopped simulator) and is not back
        self.generation = 0                             # connections replaced by reopen()
        self._open_kfd, self._sysfs_root = open_kfd, sysfs_root
        if max_level < LV3:
            self.no_kfd = "Lv1: Lv3 turned off (xsched-lv3 daemon --max-level 1)"
            return
        try:
            self._open()
        except (Error, OSError) as e:
            self.no_kfd = f"Lv1: no KFD ({e})"

    def _open(self):
        self.kfd = self._open_kfd()
        # sysfs names KFD processes by their pid in the host's namespace: where ours is not there
        # (a container's pid namespace), another process's pid says nothing there either
        self.pids_match = (self.kfd_procs / str(os.getpid())).is_dir()
        self.params = read_parameters(self._sysfs_root)
        try:
            self.gpus = list(read_topology(self._sysfs_root).for_each_gpu())
        except Error:
            self.gpus = []
        self.grace_period, self.grace_why = grace_period_for(self.gpus[0] if self.gpus else None)

    def reopen(self):
        """After a call failed with SimulatorError: only a simulated KFD's connection can go (its server
        was stopped, perhaps started again). Open it again if it is gone (the first failing client
        does; the others find it answering). True if a KFD answers now; while none does, every
        client is at Lv1 with the reason and asked again later."""
        if self.kfd is not None and not self.lost:
            try:
                self.kfd.ioctl("GET_VERSION", kfd_ioctl_get_version_args())
                return True
            except SimulatorError:
                pass
        if self.kfd is not None:
            self.kfd.close()
            self.kfd = None
            self.generation += 1
        try:
            self._open()
        except (Error, OSError) as e:
            self.lost, self.no_kfd = True, f"Lv1: the simulated KFD went away ({e})"
            return False
        self.lost, self.no_kfd = False, None
        return True

    def is_kfd_process(self, pid):
        """Whether `pid` has a KFD process (opened /dev/kfd): the kernel lists each in sysfs. Asked
        before ENABLE, because ENABLE by a ptrace parent creates one where there is none
        (kfd_chardev.c: kfd_ioctl_set_debug_trap calls kfd_create_process): a process that never
        touched the GPU would become a KFD process behind its back. Where sysfs pids are not ours (a
        pid namespace) this cannot be told: True, and ENABLE decides (as before this check)."""
        return not self.pids_match or (self.kfd_procs / str(pid)).is_dir()

    def level_for(self, pid):
        """(LV3, why) if the daemon may preempt `pid` through KFD here, else (LV1, why)."""
        if self.kfd is None:
            return LV1, self.no_kfd
        abi = self.kfd.abi
        verdict = availability(abi.minor, self.params.get("sched_policy"),
                               [g.gfx_target_version for g in self.gpus], pid)
        if not verdict.available:
            return LV1, f"Lv1: {verdict.why}"
        if not self.kfd.supports("DBG_TRAP"):
            return LV1, f"Lv1: KFD ABI {abi} has no debugger API (needs 1.13)"
        notes = "; ".join(n for n in verdict.notes if "MES" in n)
        return LV3, "Lv3: KFD DBG_TRAP queue suspend (CWSR)" + (f"; {notes}" if notes else "")

    def close(self):
        if self.kfd is not None:
            self.kfd.close()


@dataclass
class Client:
    """One board slot as the engine sees it."""
    slot: int
    pid: int
    level: int = LV1
    why: str = "Lv1: waiting for its GPU to be in use"
    mech: DebugTrapSuspend | None = None
    retry_at: float = 0.0
    suspended_at: float | None = None      # its queues are suspended since
    release_at: float | None = None        # resume then, unless it must yield again before
    switch_s: float = 0.0                  # last suspend + resume, wall time (the hysteresis)
    free_since: float | None = None        # the clients above it went idle then (after it yielded)
    gaps: deque = field(default_factory=lambda: deque(maxlen=GAP_HISTORY))   # their idle gaps, seconds
    suspends: int = 0
    suspended_s: float = 0.0
    hold: Hold | None = None               # the record `kfdtool queues` reads
    queues: tuple = ()
    snapshot_at: float = float("-inf")     # an attached process's queue list was read then


class Lv3Engine:
    def __init__(self, board, host, policy, log=print, trace=None, attached_poll_s=ATTACHED_POLL_S):
        self.board, self.host, self.policy, self.log = board, host, policy, log
        self.attached_poll_s = attached_poll_s
        self.trace = trace                 # a file: one line per suspend/resume (`daemon --trace`)
        self.woken_at = None               # when the daemon's loop last woke (the trace splits a suspend's lag)
        self.clients = {}                  # slot -> Client
        self.excused = set()               # (slot, ready_since) of activations whose process is stopped
        self.last_check = 0.0
        self.runtime_poll_at = 0.0         # when to ask the Lv3 clients for runtime events next

    # --- the one entry point: read the board, act ------------------------------------------------
    def sync(self, now=None):
        """Bring every client's queues in line with the policy. Returns when to be called again
        at the latest (a pending resume), or None."""
        now = time.monotonic() if now is None else now
        board = self.board
        snapshot = board.slots()           # one read: the states below are of these same slots
        slots = dict(snapshot)
        for slot in [s for s in self.clients if s not in slots or slots[s].pid != self.clients[s].pid]:
            self.forget(slot)
        poll_at = self._poll_attached(slots, now)
        if poll_at is not None:            # activity of attached processes may have changed the board
            snapshot = board.slots()
            slots = dict(snapshot)
        per_pid = {}
        for slot, s in slots.items():
            per_pid[s.pid] = per_pid.get(s.pid, 0) + 1
            if slot not in self.clients:
                self.clients[slot] = Client(slot, s.pid)
                board.write(slot, level=LV1, suspended=0, suspends=0, suspended_s=0.0, announce=False)
        unexcused = board.states(snapshot)
        states = excuse(unexcused, self.excused)
        run = self.policy.decide(states, now).run
        wake_at = None
        to_suspend, to_resume = [], []
        for q in states:
            c = self.clients[q.id]
            if c.mech is not None and per_pid[q.pid] > 1:
                # another client appeared in its process: its queues are theirs too (one of them may
                # be a higher-priority thread), so the process goes back to its gates
                self._lost(c, f"one of {per_pid[q.pid]} clients in pid {q.pid} (KFD queues belong to the process)")
            must_yield = q.id not in run
            above = any(o.hints.get("priority", 0) > q.hints.get("priority", 0) and shares_device(o.device, q.device)
                        for o in states if o.id != q.id) or not self.policy.strict_priority
            if c.mech is None and (above or must_yield):
                self._attach(c, None if slots[q.id].attached else q, per_pid[q.pid], now)
            elif c.mech is None and c.retry_at != float("inf"):
                c.why = "never preempted: nobody above it on its GPU"
            if c.mech is None:
                continue
            if must_yield:
                if c.free_since is not None:
                    c.gaps.append(now - c.free_since)
                    c.free_since = None
                c.release_at = None
                if c.suspended_at is None:
                    to_suspend.append(c)
                continue
            if c.free_since is None and c.suspends:
                c.free_since = now
            if c.suspended_at is not None:
                if c.release_at is None:
                    c.release_at = now + hold_for(c.switch_s, c.gaps)
                if now >= c.release_at:
                    to_resume.append(c)
                else:
                    wake_at = c.release_at if wake_at is None else min(wake_at, c.release_at)
        if poll_at is not None:
            wake_at = poll_at if wake_at is None else min(wake_at, poll_at)
        # Suspends first, all at once: a higher-priority client is waiting on them. Everything
        # nobody waits on (records, the queue list's refresh) comes after.
        woken_by = ({c.slot: _latest_activation(states, run, slots[c.slot].device) for c in to_suspend}
                    if self.trace is not None else {})     # for the trace only
        suspends = self._back_to_back(to_suspend, lambda c: c.mech.suspend_call(c.mech.known_queues() or None,
                                                                              self.host.grace_period))
        resumes = self._back_to_back(to_resume, lambda c: c.mech.resume_call())
        suspended = [c for c, call in zip(to_suspend, suspends)
                     if self._suspend_took(c, call, now, woken_by.get(c.slot))]
        resumed = [c for c, call in zip(to_resume, resumes) if self._resume_took(c, call)]
        for c in suspended:
            self._record_suspended(c)
        for c in resumed:
            self._resumed(c)
            try:
                c.mech.queues()             # queues created since: suspendable next time (EC_QUEUE_NEW cleared)
            except Error as e:
                self._lost(c, f"queue snapshot failed ({e})")
        self._answer_runtime_events(now)
        if self._look_for_stopped(unexcused, now):
            wake_at = now                   # a stopped HP (SIGSTOP, a debugger) holds nobody: again at once
        return wake_at

    def _look_for_stopped(self, states, now):
        """Every STOPPED_CHECK_S, which activations belong to a stopped process (one /proc read each);
        True if that changed. Looked at after the calls, not before: an activation that woke us is
        new, so it cannot be stopped-and-excused yet (the set is keyed by activation), and the read
        would only delay its suspends."""
        if now - self.last_check <= STOPPED_CHECK_S:
            return False
        self.last_check = now
        excused, self.excused = self.excused, stopped_activations(states)
        return excused != self.excused

    def _answer_runtime_events(self, now):
        """Answer every Lv3 client that turned its GPU runtime off or on (it sleeps in the kernel
        until we do) and give it back to its gate: its queues were resumed by the kernel and cannot
        be suspended while its runtime is off; a runtime turned on again has new queues, and is
        attached afresh after RETRY_ATTACH_S. At most every RUNTIME_POLL_S; the daemon syncs at
        least every SCHEDULE_EVERY_S, less, so no wake-up is asked for it."""
        if now < self.runtime_poll_at:
            return
        self.runtime_poll_at = now + RUNTIME_POLL_S
        for c in list(self.clients.values()):
            if c.mech is None:
                continue                    # not attached, or forgotten meanwhile (its simulated KFD went away)
            try:
                answered = c.mech.answer_runtime_event()
            except SimulatorError as e:
                self._kfd_gone(c, e, now)
                continue
            except Error as e:
                self._lost(c, f"runtime event query failed ({e})")
                continue
            if answered:
                self._lost(c, "its GPU runtime was turned off or on (hsa_shut_down / hsa_init)")

    def _poll_attached(self, slots, now):
        """Mark each attached process that could preempt someone active or idle from its queues'
        pointers (the daemon writes `active` for attached slots: nothing inside them does). Returns
        when to look again, or None when no attached process is above anyone."""
        poll_at = None
        for slot, s in slots.items():
            c = self.clients.get(slot)
            if not s.attached or c is None or c.mech is None or c.pid != s.pid:
                continue
            if not any(o.priority < s.priority and shares_device(o.device, s.device)
                       for i, o in slots.items() if i != slot):
                continue
            try:
                if now - c.snapshot_at > SNAPSHOT_EVERY_S:
                    c.mech.queues()        # its queues (new ones too) and their pointers' addresses
                    c.snapshot_at = now
                busy = bool(c.mech.has_work())
            except Error:
                busy = False
            if busy != bool(s.active):
                self.board.set_active(slot, busy)
            poll_at = now + self.attached_poll_s
        return poll_at

    # --- attach -------------------------------------------------------------------------------------
    def attach_now(self, slot, pid, now=None):
        """`xsched-lv3 attach`: take the debugger role on an uninstrumented process at once (it has
        no gate to fall back on). Returns (level, why)."""
        now = time.monotonic() if now is None else now
        c = self.clients.setdefault(slot, Client(slot, pid))
        self._attach(c, None, 1, now)
        return c.level, c.why

    def _attach(self, c, q, clients_in_process, now):
        """`q`: the client's state on the board; None for an attached process (its GPU is in use)."""
        if now < c.retry_at:                # inf: decided for good
            return
        if self.host.lost and not self.host.reopen():
            return self._stay_lv1(c, self.host.no_kfd, final=False, now=now)
        if clients_in_process > 1:
            return self._stay_lv1(c, f"Lv1: one of {clients_in_process} clients in pid {c.pid} "
                                     "(KFD queues belong to the process, not to a thread)", final=False, now=now)
        if q is not None and not q.device:
            c.why = "Lv1: waiting for its GPU to be in use"
            return
        if os.geteuid() != 0 and _owner(c.pid) != os.geteuid():
            return self._stay_lv1(c, f"Lv1: pid {c.pid} is not ours")
        level, why = self.host.level_for(c.pid)
        if level < LV3:
            return self._stay_lv1(c, why)
        if not self.host.is_kfd_process(c.pid):
            return self._stay_lv1(c, _not_kfd_process(q), final=False, now=now)
        try:
            c.mech = DebugTrapSuspend(self.host.kfd, c.pid, read_wave_state=False)
        except SimulatorError as e:
            return self._kfd_gone(c, e, now)
        except AttachDenied as e:
            return self._stay_lv1(c, f"Lv1: ptrace refused ({e})")
        except AlreadyDebugged:
            return self._stay_lv1(c, f"Lv1: another debugger (rocgdb?) is attached to pid {c.pid}")
        except NoSuchProcess:
            return self._stay_lv1(c, f"Lv1: pid {c.pid} is gone", final=False, now=now)
        except KfdIoctlError as e:
            if e.errno == errno.ESRCH:      # it became no KFD process meanwhile, or the check could not tell
                return self._stay_lv1(c, _not_kfd_process(q), final=False, now=now)
            if e.errno == errno.ENODEV:
                return self._stay_lv1(c, "Lv1: a GPU older than gfx9 has no debugger support")
            return self._stay_lv1(c, f"Lv1: DBG_TRAP ENABLE failed ({e})")
        state = c.mech.runtime_state
        if state == RUNTIME_BUSY:
            # kfd_debug.c: kfd_dbg_trap_activate could not take the GPU for the debugger: on a GPU
            # without per-VMID debugging (GC 9 before 9.4.2: one debug VMID a device,
            # reserve_debug_trap_vmid's -EBUSY) another process is being debugged, or (GC 11.0.0-11.0.3)
            # one of its queues has a CU mask the debugger's workaround cannot take. Asked again later:
            # the other session may end
            self._release(c)
            return self._stay_lv1(c, f"Lv1: {ENABLED_BUSY_WHY}", final=False, now=now)
        if state != RUNTIME_ON:
            # its GPU runtime is off (shutting down, or not up yet) or failed to take the debugger:
            # SUSPEND_QUEUES would be EPERM, so its gate keeps gating until it is on
            self._release(c)
            state = state.name.removeprefix("DEBUG_RUNTIME_STATE_").lower()
            return self._stay_lv1(c, f"Lv1: its GPU runtime is not on ({state})", final=False, now=now)
        try:
            # its queue list now, not on the first suspend's path; and where the kernel lets only the
            # target's ptrace parent make an op (before Linux 7.2, whose kfd_ioctl_set_debug_trap also
            # admits target->debugger_process), the mechanism learns it here and makes every op in a
            # ptrace window of its own from then on
            c.mech.queues()
        except SimulatorError as e:
            return self._kfd_gone(c, e, now)
        except PermissionDenied:
            self._release(c)
            return self._stay_lv1(c, "Lv1: the kernel refused the debugger API to the daemon even as the "
                                     "process's ptrace parent")
        except Error as e:
            self._release(c)
            return self._stay_lv1(c, f"Lv1: queue snapshot failed ({e})", final=False, now=now)
        if c.mech.ptrace_each_call:
            why += "; this kernel admits only the ptrace parent, so each call is made as it"
        c.level, c.why = LV3, why
        if self.board.read_slot(c.slot).pid == c.pid:
            self.board.write(c.slot, level=LV3)      # announced: its gate stops gating
        self.log(f"pid {c.pid}: {why}")

    def _kfd_gone(self, c, error, now):
        """The simulated KFD's server went away under a call to it (SimulatorError: no real ioctl
        says that). Its processes went with it, so every attachment made through the old
        connection is forgotten without a call (a closed connection would reach the next server),
        and the connection is opened again: where a KFD answers, `c` is attached at the next sync
        (its process may be one of the new server's); until one does, every client is at Lv1 with
        the reason and asked again every RETRY_ATTACH_S."""
        generation = self.host.generation
        answering = self.host.reopen()
        why = f"Lv1: the simulated KFD went away ({error})"
        replaced = self.host.generation != generation or not answering
        for other in self.clients.values():
            if other.mech is not None and (replaced or other is c):
                other.mech.abandon()
                other.mech = None
                self._released(other)
                self._stay_lv1(other, why, final=False, now=now)
        self._stay_lv1(c, why, final=False, now=now)
        if answering:
            c.retry_at = now

    def _stay_lv1(self, c, why, final=True, now=0.0):
        if why != c.why:
            self.log(f"pid {c.pid}: {why}")
        c.level, c.why = LV1, why
        c.retry_at = float("inf") if final else now + RETRY_ATTACH_S

    # --- suspend / resume ----------------------------------------------------------------------------
    def _back_to_back(self, clients, prepare):
        """One call for each client, `prepare(c)` a PreparedCall of its mechanism, all made back to
        back (`make_back_to_back`). [Call] in order; each took the time of them all (its queues
        are suspended, or running again, by the end of it: the hysteresis counts that)."""
        if not clients:
            return []
        started = time.monotonic()
        prepared, failed = [], {}
        for c in clients:
            try:
                prepared.append(prepare(c))
            except Exception as e:          # handed to `_call_failed`, which decides (a bug stops Lv3)
                failed[c.slot] = e
        made = iter(make_back_to_back(self.host.kfd, prepared))
        took = time.monotonic() - started
        calls = []
        for c in clients:
            answer = failed[c.slot] if c.slot in failed else next(made)
            calls.append(Call(started, took, error=answer) if isinstance(answer, Exception)
                         else Call(started, took, result=answer))
        return calls

    def _suspend_took(self, c, call, now, woken_by=None):
        """True if the suspend took."""
        if call.error is not None:
            self._call_failed(c, "suspend", call.error)
            return False
        c.switch_s = call.took_s
        c.queues = tuple(o.qid for o in call.result.outcomes if o.ok)
        self._trace("suspend", c, call, c.queues, woken_by)
        c.suspended_at = now
        c.suspends += 1
        return True

    def _record_suspended(self, c):
        self.board.write(c.slot, suspended=1, suspends=c.suspends, announce=False)
        try:
            if c.hold is None:             # (Hold checks the records' directory first)
                c.hold = Hold(c.pid, c.queues, "xsched-lv3 daemon").__enter__()
            else:
                c.hold.update(c.queues)
        except (OSError, Error) as e:       # (Error: a records directory we may not trust)
            c.hold = None                   # `kfdtool queues` will not name us; the queues are fine
            self.log(f"pid {c.pid}: its hold is not recorded for `kfdtool queues` ({e})")

    def _resume_took(self, c, call):
        if call.error is not None:
            self._call_failed(c, "resume", call.error)
            return False
        c.switch_s += call.took_s
        self._trace("resume", c, call)
        return True

    def _call_failed(self, c, what, error):
        if not isinstance(error, Error):
            raise error                     # a bug, not the kernel's answer: the daemon stops Lv3
        if isinstance(error, SimulatorError):
            return self._kfd_gone(c, error, time.monotonic())
        self._lost(c, f"{what} failed ({error})")

    def _resumed(self, c):
        if c.suspended_at is not None:
            c.suspended_s += time.monotonic() - c.suspended_at
        c.suspended_at = c.release_at = None
        if c.hold is not None:
            c.hold.update(())
        if self.board.read_slot(c.slot).pid == c.pid:
            self.board.write(c.slot, suspended=0, suspended_s=c.suspended_s, announce=False)

    def _lost(self, c, why):
        """The target went away or the kernel refused: drop the debugger role (DISABLE resumes
        whatever is left) and let its gate take over again."""
        self.log(f"pid {c.pid}: {why}; back to Lv1")
        self._release(c)
        c.level, c.why, c.retry_at = LV1, f"Lv1: {why}", time.monotonic() + RETRY_ATTACH_S

    def _release(self, c):
        mech, c.mech = c.mech, None
        if mech is not None:
            try:
                mech.close()                # resume + DISABLE; ESRCH (target gone) is fine
            except PermissionDenied as e:   # another debugger took the role and still traces it
                self.log(f"pid {c.pid}: releasing failed ({e}); another debugger holds it now, and its queues "
                         "resume when that one releases it")
            except Error as e:
                self.log(f"pid {c.pid}: releasing failed ({e}); the kernel resumes its queues when we exit")
        self._released(c)

    def _released(self, c):
        """Our bookkeeping of a client we no longer debug: not suspended, no hold record, its gate
        announced to gate again."""
        self._resumed(c)
        if c.hold is not None:
            c.hold.__exit__(None, None, None)
            c.hold = None
        if self.board.read_slot(c.slot).pid == c.pid:
            self.board.write(c.slot, level=LV1)      # announced: its gate gates again

    def _trace(self, what, c, call, queues=(), woken_by=None):
        """`woken_by`: when the activation a suspend serves began (the line then says the lag)."""
        if self.trace is not None:
            try:
                lag = f" {(call.started - woken_by) * 1e6:.0f} us after the activation" if woken_by else ""
                if woken_by and self.woken_at is not None and self.woken_at >= woken_by:
                    lag += f" (woken after {(self.woken_at - woken_by) * 1e6:.0f} us)"
                self.trace.write(f"{call.started:.6f} {what} pid {c.pid} took {call.took_s * 1e6:.0f} us{lag}"
                                 + (f" queues {list(queues)}" if queues else "") + "\n")
                self.trace.flush()
            except OSError as e:            # a full disk must not stop the scheduling: stop tracing
                self.log(f"--trace: {e.strerror or e}; tracing stopped")
                self.trace = None

    def forget(self, slot):
        c = self.clients.pop(slot, None)
        if c is not None:
            self._release(c)

    def close(self):
        for slot in list(self.clients):
            self.forget(slot)

    # --- status --------------------------------------------------------------------------------------
    def describe(self, slot):
        c = self.clients.get(slot)
        if c is None:
            return {"level": LV1, "why": "Lv1: not seen by the daemon yet"}
        out = {"level": c.level, "why": c.why, "suspends": c.suspends,
               "suspended_s": c.suspended_s + (time.monotonic() - c.suspended_at if c.suspended_at else 0.0)}
        if c.suspended_at is not None:
            out["queues"] = list(c.queues)
        return out


def _latest_activation(states, run, device):
    """When the latest of the running clients that share `device` became active (None: none known)."""
    return max((q.ready_since for q in states
                if q.ready and q.id in run and q.ready_since and shares_device(q.device, device)),
               default=None)


def _not_kfd_process(q):
    """Why a client is not at Lv3 while it has no KFD process: a `run` client (`q`, on the board)
    whose runtime has not opened /dev/kfd yet, or an attached process that never did."""
    return "Lv1: not a KFD process yet" if q is not None else "Lv1: not a KFD process (it has not opened /dev/kfd)"


def _owner(pid):
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None

