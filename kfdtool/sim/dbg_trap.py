"""RUNTIME_ENABLE and DBG_TRAP (kfd_chardev.c:2937-3196, kfd_debug.c, kfd_device_queue_manager.c
:3438-3791), as kfd-abi.md §2b-§2c describe them. Permission order, status bits, snapshot size
negotiation and "debugger exit resumes everything" are the parts preemption relies on."""
import ctypes
import errno
import os

from ..ioctls import constants as c
from ..ioctls import structs as s
from ..pids import start_time
from .errors import Blocked, SimErrno

OPS = c.kfd_dbg_trap_operations
SNAPSHOT_ENTRY = ctypes.sizeof(s.kfd_queue_snapshot_entry)

# include/uapi/linux/kfd_sysfs.h: the topology node's capability / capability2 bits that say which
# DBG_TRAP SET_FLAGS flags the device supports
HSA_CAP_TRAP_DEBUG_PRECISE_MEMORY_OPERATIONS_SUPPORTED = 0x00040000
HSA_CAP_TRAP_DEBUG_PRECISE_ALU_OPERATIONS_SUPPORTED = 0x40000000
HSA_CAP2_TRAP_DEBUG_LDS_OUT_OF_ADDR_RANGE_SUPPORTED = 0x00000002



class DbgTrap:
    def __init__(self, kfd):
        self.kfd = kfd
        # The kernel's `current` for the call being made: the calling thread's id where the server
        # knows it (the tid the caller's connection was opened with, checked to be a thread of the
        # calling process), else None and the calling process stands for its thread. ptrace
        # attaches a thread to a thread: ptrace_parent(task) is the task (thread) that attached.
        self.calling_thread = None       # (pid, tid, start time) or None: see `_is_current`

    # --- RUNTIME_ENABLE ---------------------------------------------------------------------------
    def runtime_enable(self, proc, a, mem, uid):
        """kfd_chardev.c: runtime_enable / runtime_disable. A process being debugged tells its
        debugger: the call raises EC_PROCESS_RUNTIME and sleeps on runtime_enable_sema until the
        debugger answers with SEND_RUNTIME_EVENT (down_interruptible: only a signal ends it
        otherwise, which the simulator does not deliver, so the kernel's retry after one is not
        modelled either). Turning the runtime off first deactivates
        the debug session (kfd_dbg_trap_deactivate: every suspended queue is resumed)."""
        if a.mode_mask & c.KFD_RUNTIME_ENABLE_MODE_ENABLE_MASK:
            if proc.runtime_state != c.DEBUG_RUNTIME_STATE_DISABLED:
                raise SimErrno(errno.EBUSY)
            if proc.queues:
                raise SimErrno(errno.EEXIST)
            proc.runtime_state = c.DEBUG_RUNTIME_STATE_ENABLED
            proc.r_debug = a.r_debug
            proc.ttmp_setup = int(bool(a.mode_mask & c.KFD_RUNTIME_ENABLE_MODE_TTMP_SAVE_MASK))
            if proc.debug_trap_enabled:
                self._activate(proc)                         # kfd_dbg_trap_activate
        else:
            was_enabled = proc.runtime_state == c.DEBUG_RUNTIME_STATE_ENABLED
            proc.runtime_state, proc.r_debug, proc.ttmp_setup = c.DEBUG_RUNTIME_STATE_DISABLED, 0, 0
            if proc.debug_trap_enabled and was_enabled:
                self._deactivate(proc)
        if not proc.debug_trap_enabled:
            return 0
        proc.exception_status |= c.KFD_EC_MASK(c.EC_PROCESS_RUNTIME)    # kfd_dbg_ev_raise
        return self._wait_for_debugger(proc)

    @staticmethod
    def _wait_for_debugger(proc):
        """down_interruptible(&p->runtime_enable_sema): sleeps until SEND_RUNTIME_EVENT ups it, or
        the process exits."""
        def take():
            if proc.runtime_sema:
                proc.runtime_sema -= 1
            return 0
        if proc.runtime_sema:
            return take()
        raise Blocked(ready=lambda: proc.runtime_sema > 0 or not proc.alive, finish=take)

    # --- DBG_TRAP ---------------------------------------------------------------------------------
    def dbg_trap(self, caller, a, mem, uid):
        kfd = self.kfd
        if kfd.params.get("sched_policy", 0) == 2:
            raise SimErrno(errno.EINVAL, "no HWS")
        # kfd_chardev.c: kfd_ioctl_set_debug_trap. `current` is the calling thread: ptrace_parent(task)
        # is the thread that attached (kernel/ptrace.c: ptrace_attach links the tracee to `current`),
        # which /proc/<tid>/status prints as TracerPid. Where the server does not know the calling
        # thread, its process stands for it (right when the caller is its process's main thread)
        current = self._current(caller.pid)
        target = self._lookup(a.pid)
        # ENABLE: `thread` is the task args->pid names (any thread of a process, in the kernel's
        # get_pid_task); when it is not `current` and its tracer is `current`, kfd_create_process
        # makes the kfd_process of its thread group
        if (target is None and a.op == OPS.KFD_IOC_DBG_TRAP_ENABLE and a.pid != current
                and self._is_current(ptrace_parent(a.pid), current)):
            target = kfd.create_process(_thread_group(a.pid) or a.pid)
        if target is None:
            raise SimErrno(errno.ESRCH)
        # self (target != p: the fd's process), the ptrace parent of the target's main thread
        # (ptrace_parent(target->lead_thread) != current: the calling thread, not its process), or
        # (7.2) the debugger that did ENABLE; before 7.2 any process may DISABLE, and every other op
        # needs the ptrace parent ("not PTRACED"). The pure tests go first: the one that reads /proc
        # (~0.1 ms here) would cost a debugger's every SUSPEND/RESUME otherwise
        if kfd.profile.debugger_keeps_the_role:
            allowed = target is caller or target.debugger is caller
        else:
            allowed = target is caller or a.op == OPS.KFD_IOC_DBG_TRAP_DISABLE
        if not (allowed or self._is_current(ptrace_parent(target.pid), current)):
            raise SimErrno(errno.EPERM)
        op = a.op
        if op != OPS.KFD_IOC_DBG_TRAP_ENABLE and not target.debug_trap_enabled:
            raise SimErrno(errno.EINVAL)
        if op in c.DBG_HW_OPS and target.runtime_state != c.DEBUG_RUNTIME_STATE_ENABLED:
            raise SimErrno(errno.EPERM)
        handler = {
            OPS.KFD_IOC_DBG_TRAP_ENABLE: self.enable, OPS.KFD_IOC_DBG_TRAP_DISABLE: self.op_disable,
            OPS.KFD_IOC_DBG_TRAP_SET_EXCEPTIONS_ENABLED: self.set_exceptions_enabled,
            OPS.KFD_IOC_DBG_TRAP_SEND_RUNTIME_EVENT: self.send_runtime_event,
            OPS.KFD_IOC_DBG_TRAP_SUSPEND_QUEUES: self.suspend_queues,
            OPS.KFD_IOC_DBG_TRAP_RESUME_QUEUES: self.resume_queues,
            OPS.KFD_IOC_DBG_TRAP_SET_FLAGS: self.set_flags,
            OPS.KFD_IOC_DBG_TRAP_QUERY_DEBUG_EVENT: self.query_debug_event,
            OPS.KFD_IOC_DBG_TRAP_GET_QUEUE_SNAPSHOT: self.queue_snapshot,
            OPS.KFD_IOC_DBG_TRAP_GET_DEVICE_SNAPSHOT: self.device_snapshot,
        }.get(op)
        if handler is None:             # not simulated: wave launch, watches, exception info
            raise SimErrno(errno.EINVAL if op > OPS.KFD_IOC_DBG_TRAP_GET_DEVICE_SNAPSHOT else errno.EOPNOTSUPP)
        return handler(caller, target, a, mem)

    def _current(self, pid):
        """The calling thread's id: the one its connection was opened with, where the call comes from
        that thread's process, else the process's own id (its main thread)."""
        thread = self.calling_thread
        return thread[1] if thread is not None and thread[0] == pid else pid

    def _is_current(self, tracer, current):
        """`tracer` (a TracerPid just read) is the calling thread: the same id and, where the server
        knows the thread from its connection's open, still that same thread, checked after the read.
        A thread id is reused once its thread exits: a connection opened by a thread that exited since
        must not pass for whichever thread got its id next (a review made another process of the same
        user take it, trace a victim, and then ENABLE on the victim through the old connection)."""
        if not tracer or tracer != current:
            return False
        thread = self.calling_thread
        if thread is None or thread[1] != current:
            return True                  # the calling process's own id: the kernel vouched for it
        pid, tid, started = thread
        return start_time(pid, tid) == started

    def _lookup(self, pid):
        """kfd_process.c: kfd_lookup_process_by_pid: the task `pid` names, which may be any thread of
        a process, finds its kfd_process by mm. A pid that is no KFD process's is looked up as a
        thread only then (a /proc read): every call naming a KFD process by its pid costs nothing."""
        target = self.kfd.processes.get(pid)
        if target is None:
            tgid = _thread_group(pid)
            if tgid is not None and tgid != pid:
                target = self.kfd.processes.get(tgid)
        return target

    def enable(self, caller, target, a, mem):
        # kfd_ioctl_set_debug_trap names the caller the target's debugger_process *before*
        # kfd_dbg_trap_enable runs its checks: a refused ENABLE (EALREADY from a second debugger,
        # ENODEV, EBADF, EFAULT) still takes the role, and with it the admission of the debugger that did
        # ENABLE, which gets EPERM from then on (and is no longer the one whose exit disables it)
        if target is not caller:
            target.debugger = caller
        if target.debug_trap_enabled:
            raise SimErrno(errno.EALREADY)
        for gpu in target.gpu_ids:         # KFD_IS_SOC15: GC 9.0.1 (gfx900) and later
            if self.kfd.devices[gpu].gfx_target_version < 90000:
                raise SimErrno(errno.ENODEV)
        if not _fd_is_open(caller.pid, a.enable.dbg_fd):
            raise SimErrno(errno.EBADF)
        if target.runtime_state == c.DEBUG_RUNTIME_STATE_ENABLED:   # else deferred to RUNTIME_ENABLE
            self._activate(target)                # kfd_dbg_trap_activate (its result is ignored)
        target.debug_trap_enabled = True
        if target.debugger is not None:           # kfd_dbg_trap_enable: the debugger_process's count
            target.debugger.debugged_count += 1
        info = s.kfd_runtime_info(target.r_debug, target.runtime_state, target.ttmp_setup)
        copy = min(a.enable.rinfo_size, ctypes.sizeof(info))
        a.enable.rinfo_size = ctypes.sizeof(info)   # `*runtime_size = ...`: written back either way
        try:
            mem.write(a.enable.rinfo_ptr, bytes(info)[:copy])
        except SimErrno:
            # kfd_debug.c: kfd_dbg_trap_enable (as in 6.12.117, a stable backport to 6.12.y): a
            # runtime_info copy that faults undoes the enable and answers -EFAULT:
            # kfd_dbg_trap_deactivate(target, false, 0), run whether or not the activation was
            # deferred, with its queue resumes and runlist refreshes; the debugger's count taken back;
            # debug_trap_enabled false again (a later op is -EINVAL "not debug enabled", a later
            # ENABLE no -EALREADY). runtime_state is not touched (an ENABLED_BUSY from the CU
            # workaround stays), nor is debugger_process: kfd_ioctl_set_debug_trap set it before the
            # call and nothing clears it, so the caller keeps the role (as after EALREADY above)
            self._deactivate(target)
            if target.debugger is not None:
                target.debugger.debugged_count -= 1
            target.debug_trap_enabled = False
            raise
        target.exception_mask = a.enable.exception_mask   # kfd_ioctl_set_debug_trap: only `if (!r)`
        return 0

    def _activate(self, target):
        """kfd_debug.c: kfd_dbg_trap_activate (6.12.117), from ENABLE of a runtime-enabled target
        and from RUNTIME_ENABLE of a debug-enabled one. First the CU workaround
        (kfd_dbg_set_workaround(target, true)): where it fails the activation returns at once,
        nothing reserved or refreshed on any device. Then per device of the target: one without
        per-VMID debugging reserves the debug VMID (reserve_debug_trap_vmid: an unmap, SET_RESOURCES
        and a map: one remap), its debug_refresh_runlist returning before unmapping anything
        (debug_lock_and_unmap); a per-VMID HWS device has its runlist refreshed
        (debug_refresh_runlist: one remap); a per-VMID MES device (GC 11+) takes a
        set_shader_debugger call (kfd_dbg_set_mes_debug_mode), which unmaps nothing.
        reserve_debug_trap_vmid answers -EBUSY, touching nothing, where the device's debug VMID is
        already reserved (dqm->trap_debug_vmid != 0: another process is being debugged there):
        runtime_state becomes ENABLED_BUSY and the devices before it are unwound
        (kfd_dbg_trap_deactivate(target, true, i)). Both callers ignore the error: ENABLE succeeds
        and copies out ENABLED_BUSY, and the hardware ops are -EPERM until a DISABLE sets the state
        back to ENABLED."""
        if not self._activate_cu_workaround(target):
            return
        devices = [self.kfd.devices[gpu] for gpu in target.gpu_ids]
        for i, dev in enumerate(devices):
            if not _is_per_vmid_supported(dev):
                if dev.trap_debug_vmid_reserved:          # "Trap debug id already reserved"
                    target.runtime_state = c.DEBUG_RUNTIME_STATE_ENABLED_BUSY
                    self._unwind_devices(target, devices[:i])
                    for q in target.queues.values():      # kfd_dbg_set_workaround(target, false)
                        q.is_dbg_wa = False
                    return
                dev.trap_debug_vmid_reserved = True
                self.kfd.execute_queues(dev)
            else:
                self._refresh_runlist(dev)

    def _refresh_runlist(self, dev):
        """kfd_device_queue_manager.c: debug_refresh_runlist, as the debugger's calls make it on a
        per-VMID device: an unmap and map of the whole device under HWS; on MES a set_shader_debugger
        call instead (kfd_dbg_set_mes_debug_mode), which unmaps nothing. On a device without per-VMID
        debugging it returns before unmapping anything (debug_lock_and_unmap)."""
        if _is_per_vmid_supported(dev) and not dev.uses_mes:
            self.kfd.execute_queues(dev)

    def _activate_cu_workaround(self, target):
        """kfd_debug.c: kfd_dbg_set_workaround(target, true): on GC 11.0.0-11.0.3 the debugger
        masks CUs of every queue; a queue with a user CU mask makes it -EBUSY, unwinds every
        queue and leaves runtime_state ENABLED_BUSY. False where it failed."""
        on_wa_device = [q for q in target.queues.values() if self.kfd.devices[q.gpu_id].has_cwsr_workaround]
        if any(q.is_user_cu_masked for q in on_wa_device):
            target.runtime_state = c.DEBUG_RUNTIME_STATE_ENABLED_BUSY
            return False
        for q in on_wa_device:
            q.is_dbg_wa = True
        return True

    def op_disable(self, caller, target, a, mem):
        self.disable(target)
        return 0

    def _deactivate(self, target):
        """kfd_debug.c: kfd_dbg_trap_deactivate(target, false, 0), in its order: every suspended
        queue is resumed (resume_queues(target, 0, NULL)); the wave launch mode is set back to normal
        (kfd_dbg_trap_set_wave_launch_mode(target, 0)) and the SET_FLAGS flags to 0
        (kfd_dbg_trap_set_flags(target, &flags) with flags 0), each of which refreshes the runlist of
        every per-VMID HWS device of the target, whatever the flags were (0 passes every capability
        check, and neither compares old with new); then per device, the debug VMID is released on
        one without per-VMID debugging where one is reserved (release_debug_trap_vmid: an unmap,
        SET_RESOURCES and a map; -EINVAL and nothing unmapped where none is, see _unwind_devices)
        and a per-VMID HWS device's runlist is refreshed again (debug_refresh_runlist, which returns
        before unmapping anything on the others). On MES each of those is a set_shader_debugger
        call that unmaps nothing (kfd_dbg_set_mes_debug_mode). Last the CU workaround goes
        (kfd_dbg_set_workaround(target, false))."""
        self._resume(target, None)
        devices = [self.kfd.devices[gpu] for gpu in target.gpu_ids]
        for dev in devices:                       # kfd_dbg_trap_set_wave_launch_mode(target, 0)
            self._refresh_runlist(dev)
        target.dbg_flags = 0                      # kfd_dbg_trap_set_flags(target, 0)
        for dev in devices:
            self._refresh_runlist(dev)
        self._unwind_devices(target, devices)
        for q in target.queues.values():
            q.is_dbg_wa = False

    def _unwind_devices(self, target, devices):
        """kfd_debug.c: kfd_dbg_trap_deactivate's per-device loop: on a device without per-VMID
        debugging release_debug_trap_vmid (kfd_device_queue_manager.c), which frees the device's
        debug VMID whoever reserved it (an unmap, SET_RESOURCES and a map: one remap) and, where none
        is reserved (an activation deferred to a RUNTIME_ENABLE that never came, or refused with
        -EBUSY), answers -EINVAL before unmapping anything; its debug_refresh_runlist returns before
        unmapping. A per-VMID HWS device has its runlist refreshed (one remap); a MES device takes a
        set_shader_debugger call that unmaps nothing."""
        for dev in devices:
            if not _is_per_vmid_supported(dev):
                if dev.trap_debug_vmid_reserved:
                    dev.trap_debug_vmid_reserved = False
                    self.kfd.execute_queues(dev)
            else:
                self._refresh_runlist(dev)

    def disable(self, target):
        """kfd_dbg_trap_disable: resume every suspended queue, drop the debugger. A running
        target is deactivated (kfd_dbg_trap_deactivate: the CU workaround goes); one whose
        activation failed is set back to ENABLED for the next debugger. Every pending exception
        is cleared (kfd_dbg_clean_exception_status: process, device and queue bits, EC_QUEUE_NEW
        and EC_PROCESS_RUNTIME included), so a target sleeping in RUNTIME_ENABLE stays asleep with
        nothing left for a next debugger to see: only SEND_RUNTIME_EVENT wakes it. Only a target
        whose runtime is on is deactivated (its queues resumed: one whose runtime is off had them
        resumed when it went off), with its runlist refreshes (_deactivate)."""
        if target.runtime_state == c.DEBUG_RUNTIME_STATE_ENABLED:
            self._deactivate(target)
        elif target.runtime_state != c.DEBUG_RUNTIME_STATE_DISABLED:
            target.runtime_state = c.DEBUG_RUNTIME_STATE_ENABLED
        target.exception_status = 0
        target.device_exceptions.clear()
        for q in target.queues.values():
            q.exception_status = 0
        debugger = target.debugger
        if debugger is not None and debugger is not target:
            # whoever holds the role now, as kfd_dbg_trap_disable's atomic_dec does: one that took it
            # with a refused ENABLE was never counted and goes below zero (its exit then disables
            # nothing: kfd_process_notifier_release_internal scans only while the count is > 0)
            debugger.debugged_count -= 1
        target.debug_trap_enabled, target.debugger, target.dbg_flags = False, None, 0

    def set_exceptions_enabled(self, caller, target, a, mem):
        """kfd_debug.c: kfd_dbg_set_enabled_debug_exception_mask: the mask replaces the last one
        (later queries report only what it enables). The kernel also writes to the debugger's
        event fd when an enabled exception is already pending; the simulator cannot reach that
        fd in the debugger's process."""
        target.exception_mask = a.set_exceptions_enabled.exception_mask
        return 0

    def send_runtime_event(self, caller, target, a, mem):
        """kfd_debug.c: kfd_dbg_send_exception_to_runtime: EC_PROCESS_RUNTIME ups
        runtime_enable_sema (a RUNTIME_ENABLE sleeping on it returns). The exceptions it forwards
        to the runtime (memory violations, queue errors) are not simulated."""
        mask = a.send_runtime_event.exception_mask
        runtime = c.KFD_EC_MASK(c.EC_PROCESS_RUNTIME)
        if mask & ~runtime:
            raise SimErrno(errno.EOPNOTSUPP, "only EC_PROCESS_RUNTIME is simulated")
        if mask & runtime:
            target.runtime_sema += 1
        return 0

    def set_flags(self, caller, target, a, mem):
        """kfd_debug.c: kfd_dbg_trap_set_flags (6.12 and 7.2): a flag is refused with -EACCES when
        any device of the target lacks its capability in the topology (node_props.capability and
        capability2, what sysfs prints); bits the kernel has no capability for are taken as given.
        The previous flags are written back either way (kfd_ioctl copies them out with the error
        too). Then every per-VMID device takes the new flags: HWS refreshes its runlist
        (debug_refresh_runlist, a device-wide unmap and map), MES gets them in a set_shader_debugger
        call that unmaps nothing (kfd_dbg_set_mes_debug_mode). Neither can fail here, so the
        kernel's rewind on failure is never needed."""
        args = a.set_flags
        previous = target.dbg_flags
        devices = [self.kfd.devices[gpu] for gpu in target.gpu_ids]
        if any(args.flags & self._refused_flags(dev) for dev in devices):
            args.flags = previous
            raise SimErrno(errno.EACCES)
        target.dbg_flags, args.flags = args.flags, previous
        for dev in devices:
            self._refresh_runlist(dev)
        return 0

    def _refused_flags(self, dev):
        """The SET_FLAGS flags `dev` refuses (kfd_dbg_trap_set_flags): SINGLE_MEM_OP and
        SINGLE_ALU_OP without their capability bit; LDS_OUT_OF_ADDR_RANGE without its capability2
        bit, checked only since KFD 1.21 ("Debugger support to subscribe to LDS out-of-address
        exceptions" added the flag and the check; 6.12 stores the bit unchecked)."""
        caps, caps2 = dev.node.props.get("capability", 0), dev.node.props.get("capability2", 0)
        refused = 0
        if not caps & HSA_CAP_TRAP_DEBUG_PRECISE_MEMORY_OPERATIONS_SUPPORTED:
            refused |= c.KFD_DBG_TRAP_FLAG_SINGLE_MEM_OP
        if not caps & HSA_CAP_TRAP_DEBUG_PRECISE_ALU_OPERATIONS_SUPPORTED:
            refused |= c.KFD_DBG_TRAP_FLAG_SINGLE_ALU_OP
        if self.kfd.abi.minor >= 21 and not caps2 & HSA_CAP2_TRAP_DEBUG_LDS_OUT_OF_ADDR_RANGE_SUPPORTED:
            refused |= c.KFD_DBG_TRAP_FLAG_LDS_OUT_OF_ADDR_RANGE
        return refused

    def query_debug_event(self, caller, target, a, mem):
        """kfd_debug.c: kfd_dbg_ev_query_debug_event: the first queue, in the process's queue list
        (newest first), with an exception the mask enables reports its whole status, its id and
        GPU, and loses the bits asked to clear; then the first device of the process with one
        (EC_DEVICE_QUEUE_DELETE: its gpu_id, queue_id 0), then the process's own (EC_PROCESS_RUNTIME);
        nothing pending is -EAGAIN."""
        args = a.query_debug_event
        clear = args.exception_mask
        args.gpu_id = args.queue_id = 0
        args.exception_mask = 0
        for q in target.queues.values():                      # newest first, as pqm->queues
            if target.exception_mask & q.exception_status:
                args.gpu_id, args.queue_id = q.gpu_id, q.qid
                args.exception_mask, q.exception_status = q.exception_status, q.exception_status & ~clear
                return 0
        for gpu in target.gpu_ids:                            # the process's devices (pdds), in order
            status = target.device_exceptions.get(gpu, 0)
            if target.exception_mask & status:
                args.gpu_id, args.exception_mask = gpu, status
                target.device_exceptions[gpu] = status & ~clear
                return 0
        if target.exception_mask & target.exception_status:
            args.exception_mask, target.exception_status = target.exception_status, target.exception_status & ~clear
            return 0
        raise SimErrno(errno.EAGAIN)

    # --- suspend / resume -------------------------------------------------------------------------
    def _read_ids(self, ptr, count, mem):
        if count > c.KFD_MAX_NUM_OF_QUEUES_PER_PROCESS or (not ptr and count):
            raise SimErrno(errno.EINVAL)
        raw = mem.read(ptr, 4 * count) if count else b""
        return [int.from_bytes(raw[4 * i:4 * i + 4], "little") | c.KFD_DBG_QUEUE_INVALID_MASK
                for i in range(count)]

    @staticmethod
    def _write_ids(ptr, ids, mem):
        if ids:
            mem.write(ptr, b"".join(i.to_bytes(4, "little") for i in ids))

    def suspend_queues(self, caller, target, a, mem):
        args = a.suspend_queues
        ids = self._read_ids(args.queue_array_ptr, args.num_queues, mem)
        index = _first_positions(ids)
        total = 0
        for gpu in target.gpu_ids:
            dev = self.kfd.devices[gpu]
            wanted = [q for q in target.queues_on(gpu) if q.qid in index]
            counted, changed = [], False
            for q in wanted:
                n = index[q.qid]
                if not q.is_suspended:                   # suspend_single_queue: 0 for one already suspended
                    if q.exception_status & c.KFD_EC_MASK(c.EC_QUEUE_NEW) or q.being_destroyed:
                        continue                         # -EBUSY: keeps the INVALID bit, not counted
                    q.sync_progress()
                    if q.is_active:
                        self.kfd.timing.save_waves(dev, q, args.grace_period)
                    q.is_suspended = changed = True      # (MES: remove_queue_mes for this one)
                ids[n] &= ~c.KFD_DBG_QUEUE_INVALID_MASK
                counted.append(q)
            total += len(counted)
            if dev.uses_mes:
                # counted straight into the total, no runlist: only the queues removed cost MES calls,
                # and only they have the mask cleared (inside suspend_queues' `if (!err)`)
                if changed:
                    self.kfd.execute_queues(dev)
                for q in counted:
                    q.exception_status &= ~args.exception_mask
            elif counted:                                # HWS: per_device_suspended > 0 remaps, even if every
                self.kfd.execute_queues(dev, grace_period=args.grace_period)   # one was already suspended,
                for q in wanted:                         # and clears the mask of every queue asked for
                    q.exception_status &= ~args.exception_mask
        if total:
            self.kfd.write_wave_state_headers(target)
        self._write_ids(args.queue_array_ptr, ids, mem)
        return total

    def resume_queues(self, caller, target, a, mem):
        args = a.resume_queues
        if not args.queue_array_ptr:
            return self._resume(target, None)
        ids = self._read_ids(args.queue_array_ptr, args.num_queues, mem)
        total = self._resume(target, ids)
        self._write_ids(args.queue_array_ptr, ids, mem)
        return total

    def _resume(self, target, ids):
        index = None if ids is None else _first_positions(ids)
        total = 0
        for gpu in target.gpu_ids:
            dev = self.kfd.devices[gpu]
            resumed, counted = [], 0                     # resume_queues' per_device_resumed
            for q in target.queues_on(gpu):
                if index is not None and q.qid not in index:
                    continue
                if index is not None:
                    ids[index[q.qid]] &= ~c.KFD_DBG_QUEUE_INVALID_MASK
                counted += 1                             # resume_single_queue: 0 for one not suspended
                if q.is_suspended:
                    q.is_suspended = False
                    resumed.append(q)
            total += counted
            if resumed if dev.uses_mes else counted:     # MES: add_queue_mes only for the queues resumed;
                self.kfd.execute_queues(dev)             # HWS: a remap even if none was suspended
                for q in resumed:
                    if q.is_active:
                        self.kfd.timing.restore_waves(dev, q)
                    q.sync_progress()
        return total

    # --- snapshots --------------------------------------------------------------------------------
    def queue_snapshot(self, caller, target, a, mem):
        """kfd_process_queue_manager.c: pqm_get_queue_snapshot, in its order: the count is zeroed
        first (an entry_size of 0 answers EINVAL with num_queues 0), entry_size is cut to the
        kernel's entry before the walk, and each written queue's exception bits are cleared before
        its entry is copied, so a copy that faults leaves num_queues at the entries written before
        it and that queue's bits cleared (kfd_ioctl copies the arguments back even on error)."""
        args = a.queue_snapshot
        room, args.num_queues = args.num_queues, 0
        if args.entry_size == 0:
            raise SimErrno(errno.EINVAL)
        stride = args.entry_size
        args.entry_size = copy = min(stride, SNAPSHOT_ENTRY)
        for q in list(target.queues.values()):              # newest first
            if args.num_queues < room:
                entry = s.kfd_queue_snapshot_entry(
                    q.exception_status, q.ring_base, q.wptr, q.rptr, q.ctx_save_restore_address, q.qid,
                    q.gpu_id, q.ring_size & 0xFFFFFFFF, _user_queue_type(q.queue_type), q.ctx_save_restore_size, 0)
                q.exception_status &= ~args.exception_mask     # set_queue_snapshot_entry
                mem.write(args.snapshot_buf_ptr + args.num_queues * stride, bytes(entry)[:copy])
            args.num_queues += 1
        return 0

    def device_snapshot(self, caller, target, a, mem):
        """kfd_debug.c: kfd_dbg_trap_device_snapshot: only a NULL buffer is -EINVAL (entry_size is
        passed by pointer, so 0 is a valid size that copies nothing); the count becomes the
        target's device count, entry_size is cut to the kernel's entry and the user's stride kept;
        each entry carries its device's exception status, which loses the bits asked to clear
        before the entry is copied."""
        args = a.device_snapshot
        if not args.snapshot_buf_ptr:
            raise SimErrno(errno.EINVAL)
        layout = self.kfd.abi.layout("kfd_dbg_device_info_entry")
        stride, copy = args.entry_size, min(args.entry_size, ctypes.sizeof(layout))
        devices = [self.kfd.devices[g] for g in target.gpu_ids]
        for n, dev in enumerate(devices[:args.num_devices]):
            p = dev.node.props
            entry = layout(gpu_id=dev.gpu_id, location_id=p.get("location_id", 0), vendor_id=p.get("vendor_id", 0),
                           device_id=p.get("device_id", 0), fw_version=p.get("fw_version", 0),
                           gfx_target_version=p.get("gfx_target_version", 0), simd_count=p.get("simd_count", 0),
                           max_waves_per_simd=p.get("max_waves_per_simd", 0), array_count=p.get("array_count", 0),
                           simd_arrays_per_engine=p.get("simd_arrays_per_engine", 0), num_xcc=p.get("num_xcc", 1),
                           capability=p.get("capability", 0), debug_prop=p.get("debug_prop", 0),
                           exception_status=target.device_exceptions.get(dev.gpu_id, 0))
            if args.exception_mask:
                target.device_exceptions[dev.gpu_id] = entry.exception_status & ~args.exception_mask
            mem.write(args.snapshot_buf_ptr + n * stride, bytes(entry)[:copy])
        args.num_devices, args.entry_size = len(devices), copy
        return 0


def _is_per_vmid_supported(dev):
    """kfd_debug.h: kfd_dbg_is_per_vmid_supported: GC 9.4.2 (gfx_target_version 90010), GC 9.4.3,
    9.4.4 and 9.5.0 (90400-90500; 6.12 lists no 9.5.0, but it drives no such GPU either) and GC 11
    and later (110000 on)."""
    v = dev.gfx_target_version
    return v == 90010 or 90400 <= v <= 90500 or v >= 110000


def _first_positions(ids):
    """queue id -> its position in the caller's array, the first where it repeats
    (kfd_device_queue_manager.c: q_array_get_index returns the first match, so only that entry's
    status word is written)."""
    index = {}
    for n, i in enumerate(ids):
        index.setdefault(i & ~c.KFD_DBG_QUEUE_INVALID_MASK, n)
    return index


def _user_queue_type(queue_type):
    """kfd_device_queue_manager.c: set_queue_type_for_user: SDMA_BY_ENG_ID has no user type
    (0xffffffff + WARN_ONCE). A queue created as SDMA_BY_ENG_ID never has it here: allocate_sdma_queue
    made it SDMA or SDMA_XGMI (kernel.py: create_queue); only a queue adopted with that type would."""
    return 0xFFFFFFFF if queue_type == c.KFD_IOC_QUEUE_TYPE_SDMA_BY_ENG_ID else queue_type


def _fd_is_open(pid, fd):
    return os.path.exists(f"/proc/{pid}/fd/{fd}")


def ptrace_parent(pid):
    """The kernel's ptrace_parent(task) for the task (thread) `pid` names, read from
    /proc/<pid>/status: the id of the thread that attached (fs/proc/array.c: task_state prints
    task_pid_nr_ns(tracer): a thread id, not its process's), 0 when not traced."""
    return _status_field(pid, "TracerPid:") or 0


def _thread_group(pid):
    """The process (thread group id) of the thread `pid` names, None if there is none."""
    return _status_field(pid, "Tgid:")


def _status_field(pid, name):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(name):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None
