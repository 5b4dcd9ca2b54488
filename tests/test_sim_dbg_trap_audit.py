"""DBG_TRAP against the Linux kernel's text (drivers/gpu/drm/amd/amdkfd/kfd_chardev.c:
kfd_ioctl_set_debug_trap; kfd_debug.c: kfd_dbg_trap_deactivate, kfd_dbg_trap_set_flags), where an
audit found the simulator apart from it:

- ptrace attaches a thread to a thread: the ptrace test compares the tracer of the target's main
  thread with the calling *thread* (ptrace_parent(target->lead_thread) != current), and ENABLE
  creates a kfd_process when the thread args->pid names is traced by the calling thread. args->pid
  may name any thread of a process (kfd_lookup_process_by_pid finds the process by its mm).
- a debugger's deactivation sets the wave launch mode and the SET_FLAGS flags back, each with a
  runlist refresh of every per-VMID HWS device whatever the flags were, then releases the debug
  VMID of a device without per-VMID debugging, or refreshes a per-VMID HWS one once more.

The test process is the debugger (and, where it debugs itself, the target)."""
import errno
import json
import os
import socket
import subprocess
import sys
import threading

import pytest

from kfdtool.cli.sim_cmd import spawn_workload
from kfdtool.cwsr import ptrace
from kfdtool.ioctls import constants as c
from kfdtool.sim.protocol import IOCTL, ProtocolError, frame, recv_frame
from simhelpers import Client, errno_of


def on_thread(fn, *args):
    """fn(*args) on a new thread of this process: its result, or its exception raised here."""
    out = {}

    def run():
        try:
            out["value"] = fn(*args)
        except BaseException as e:          # handed to the caller
            out["error"] = e
    t = threading.Thread(target=run)
    t.start()
    t.join(30)
    assert not t.is_alive(), "the thread did not finish"
    if "error" in out:
        raise out["error"]
    return out["value"]


@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "60"])
    yield proc.pid
    proc.kill()
    proc.wait()


# --- the ptrace test is per thread --------------------------------------------------------------
def test_a_tracer_thread_that_is_not_the_main_thread_is_the_ptrace_parent(client, sleeper):
    """kfd_ioctl_set_debug_trap: ptrace_attach links the tracee to the thread that attached, so for
    ENABLE of a process with no kfd_process `ptrace_parent(thread) == current` holds for that
    thread alone: the main thread of the debugger gets -ESRCH (nothing created), the tracer thread
    creates the kfd_process and passes the permission test (ptrace_parent(target->lead_thread) ==
    current); it DISABLEs it again."""
    seized, go = threading.Event(), threading.Event()

    def tracer():
        ptrace.seize(sleeper)
        try:
            assert ptrace.tracer_of(sleeper) == threading.get_native_id() != os.getpid()
            seized.set()
            assert go.wait(10)
            enabled = errno_of(lambda: client.enable_debug(pid=sleeper))
            disabled = errno_of(lambda: client.dbg("DISABLE", pid=sleeper)) if not enabled else None
            return enabled, disabled
        finally:
            ptrace.detach(sleeper)

    answer = {}

    def run():
        try:
            answer["tracer"] = tracer()
        except BaseException as e:          # raised below
            answer["error"] = e
        finally:
            seized.set()
    t = threading.Thread(target=run)
    t.start()
    try:
        assert seized.wait(10)
        by_main_thread = errno_of(lambda: client.enable_debug(pid=sleeper))
    finally:
        go.set()
        t.join(30)
    if "error" in answer:
        raise answer["error"]
    assert by_main_thread == errno.ESRCH and answer["tracer"] == (0, 0)


def test_a_thread_that_is_not_the_tracer_is_refused_though_its_main_thread_is(client):
    """kfd_ioctl_set_debug_trap: with the main thread of the debugger as the ptrace parent of a KFD
    process, ENABLE from another thread of the same process is -EPERM ("PID %i is not PTRACED":
    target != p, ptrace_parent(target->lead_thread) != current, and no debugger_process yet); the
    main thread is admitted."""
    victim = spawn_workload("mi308x", "victim", queues=1, waves=10)
    try:
        ptrace.seize(victim)
        try:
            assert on_thread(errno_of, lambda: client.enable_debug(pid=victim)) == errno.EPERM
            assert errno_of(lambda: client.enable_debug(pid=victim)) == 0
            client.dbg("DISABLE", pid=victim)
        finally:
            ptrace.detach(victim)
    finally:
        os.kill(victim, 9)


def test_dbg_trap_names_a_process_by_any_of_its_threads(client):
    """kfd_ioctl_set_debug_trap looks the target up from the task args->pid names
    (kfd_lookup_process_by_pid: by the task's mm), so the id of any of its threads finds a KFD
    process: this process debugs itself through a thread id that is not its pid."""
    parked, started = threading.Event(), threading.Event()
    tid = {}

    def park():
        tid["value"] = threading.get_native_id()
        started.set()
        parked.wait(30)
    t = threading.Thread(target=park)
    t.start()
    try:
        assert started.wait(10) and tid["value"] != os.getpid()
        client.enable_debug(pid=tid["value"])
        snapshot, _ = client.snapshot(pid=tid["value"])
        assert snapshot.entry_size > 0
        client.dbg("DISABLE", pid=tid["value"])
    finally:
        parked.set()
        t.join()


# --- the calling thread travels with the open, checked ------------------------------------------
def test_an_open_names_its_thread_and_the_server_takes_only_a_thread_of_the_sender():
    """protocol: b"O" carries {"tid": N}; the server keeps N only where /proc shows it as a thread
    of the process the kernel says sent the open (a process cannot pass for another's tracer)."""
    from kfdtool.sim.protocol import parse_open
    from kfdtool.sim.server import _thread_of
    assert parse_open(b"") is None
    assert parse_open(json.dumps({"tid": 1234}).encode()) == 1234
    for bad in (b"[1]", b'{"tid": "1"}', b'{"tid": 0}', b'{"tid": true}', b"not json"):
        with pytest.raises(ProtocolError):
            parse_open(bad)
    me = os.getpid()
    assert _thread_of(me, threading.get_native_id())[0] == threading.get_native_id()
    assert on_thread(lambda: _thread_of(me, threading.get_native_id())) is not None
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert _thread_of(me, child.pid) is None                   # another process's thread
        assert _thread_of(me, 0x7FFFFFFF) is None
    finally:
        child.kill()
        child.wait()


def test_a_thread_id_taken_again_after_its_thread_exited_does_not_pass_for_it():
    """A connection keeps the thread its open named; once that thread exits, its id may go to
    another thread, even one of another process of the same user that traces a victim (a review did
    that with 32,447 forks, then ENABLEd on the victim through the old connection). The server knows
    the thread by its id and start time, checked after the tracer is read: a thread with that id and
    another start time is not the calling thread, and the call is the process's."""
    from kfdtool.sim.dbg_trap import DbgTrap
    from kfdtool.sim.server import _thread_of
    me, tid = os.getpid(), threading.get_native_id()
    tid_, started = _thread_of(me, tid)
    dbg = DbgTrap.__new__(DbgTrap)                 # its thread test only: no simulated kernel needed
    dbg.calling_thread = (me, tid, started)
    assert dbg._current(me) == tid and dbg._is_current(tid, tid)
    dbg.calling_thread = (me, tid, started - 1)   # the id, but a thread that started at another time
    assert not dbg._is_current(tid, tid)
    exited = on_thread(threading.get_native_id)    # a thread that has exited by now
    dbg.calling_thread = (me, exited, started)
    assert not dbg._is_current(exited, exited)
    assert dbg._current(me + 1) == me + 1 and dbg._is_current(me + 1, me + 1)   # another caller: its own id


TRACER = r"""
import sys, time
from kfdtool.cwsr import ptrace
ptrace.seize(int(sys.argv[1]))
print("seized", flush=True)
sys.stdin.read()
ptrace.detach(int(sys.argv[1]))
"""


def raw_open(sim, body=b""):
    """A connection to the simulator opened with b"O" + `body`, as a client of any version could."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(sim.socket))
    sock.sendall(frame(b"O" + body))
    reply, _ = recv_frame(sock)
    assert json.loads(reply[1:]).get("ok")
    return sock


def raw_dbg_trap(sock, op, pid, member=None, **fields):
    """DBG_TRAP on a raw connection: the ioctl's return value (-errno on error)."""
    from kfdtool.device import dbg_trap_args
    from kfdtool.ioctls.history import KfdAbi
    raw = bytes(dbg_trap_args(op, pid, member, **fields))
    sock.sendall(frame(b"I" + IOCTL.pack(KfdAbi(23).request("DBG_TRAP"), len(raw), 0, 0) + raw))
    reply, _ = recv_frame(sock)
    assert reply[:1] == b"R"
    return int.from_bytes(reply[1:9], "little", signed=True)


def test_naming_another_process_s_tracer_thread_does_not_pass_for_it(client, sim):
    """A connection whose open names a thread of another process (here the tracer of a KFD
    process) is taken as its process's: ENABLE on the traced process is -EPERM, as from any
    process that is not the tracer."""
    victim = spawn_workload("mi308x", "victim", queues=1, waves=10)
    tracer = subprocess.Popen([sys.executable, "-c", TRACER, str(victim)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert tracer.stdout.readline().strip() == "seized"
        assert ptrace.tracer_of(victim) == tracer.pid
        with raw_open(sim, json.dumps({"tid": tracer.pid}).encode()) as sock:
            assert raw_dbg_trap(sock, "ENABLE", victim, "enable", dbg_fd=sock.fileno()) == -errno.EPERM
    finally:
        tracer.stdin.close()
        tracer.wait(10)
        os.kill(victim, 9)


def test_an_open_that_names_no_thread_is_taken_as_its_process_main_thread(client, sim):
    """A client that names no thread in its open (one from before the tid was sent) keeps the old
    answer: its process stands for the calling thread, so a call from any of its threads passes
    where its main thread is the tracer."""
    victim = spawn_workload("mi308x", "victim", queues=1, waves=10)
    try:
        ptrace.seize(victim)
        try:
            def from_a_thread():
                with raw_open(sim) as sock:
                    enabled = raw_dbg_trap(sock, "ENABLE", victim, "enable", dbg_fd=sock.fileno())
                    return enabled, raw_dbg_trap(sock, "DISABLE", victim)
            assert on_thread(from_a_thread) == (0, 0)
        finally:
            ptrace.detach(victim)
    finally:
        os.kill(victim, 9)


# --- deactivation refreshes the runlists --------------------------------------------------------
def remaps(client):
    return {int(g): n for g, n in client.ctl("status")["remaps"].items()}


def test_disable_refreshes_a_per_vmid_hws_device_three_times_whatever_the_flags(client):
    """kfd_dbg_trap_deactivate on GC 9.4.3 under HWS (per-VMID debugging): the wave launch mode set
    back to normal (kfd_dbg_trap_set_wave_launch_mode(target, 0)), the flags set to 0
    (kfd_dbg_trap_set_flags, which refreshes every per-VMID device without comparing old and new
    flags) and the per-device debug_refresh_runlist: three execute_queues_cpsch calls (the
    simulator's `remaps` count), with or without flags set before (no queue of the target there:
    resume_queues remaps nothing). With no active queue on the device the kernel's unmap and map
    return early (unmap_queues_cpsch without an active runlist, map_queues_cpsch without active
    queues), so nothing stalls; with queues each call stalls them all."""
    gpu = client.gpus[0]
    assert not client.queues()
    for flags in (0, c.KFD_DBG_TRAP_FLAG_SINGLE_MEM_OP):
        client.enable_debug()
        if flags:
            client.dbg("SET_FLAGS", "set_flags", flags=flags)
        before = remaps(client)[gpu]
        client.dbg("DISABLE")
        assert remaps(client)[gpu] == before + 3


def test_disable_refreshes_each_kind_of_device_as_the_kernel_does(composite_612):
    """Linux 6.12.117, kfd_dbg_trap_deactivate on every device of the target: a per-VMID HWS device
    (GC 9.4.2+ before GC 11: MI300X, MI350X) is refreshed three times; one without per-VMID
    debugging (Radeon VII, Navi23) has its debug VMID released (release_debug_trap_vmid: one unmap
    and map), its debug_refresh_runlist calls returning before unmapping; a MES device (GC 11+)
    takes set_shader_debugger calls that unmap nothing."""
    cl = Client(composite_612)
    try:
        assert not cl.queues()
        kinds = {}
        for node in cl.rt.topology.for_each_gpu():
            v = node.gfx_target_version
            kinds[node.gpu_id] = ("mes" if v >= 110000 else
                                  "per-vmid" if (v == 90010 or 90400 <= v <= 90500) else "global")
        assert set(kinds.values()) == {"mes", "per-vmid", "global"}
        cl.enable_debug()
        before = remaps(cl)
        cl.dbg("DISABLE")
        after = remaps(cl)
        expected = {"mes": 0, "per-vmid": 3, "global": 1}
        assert {g: after[g] - before[g] for g in kinds} == {g: expected[k] for g, k in kinds.items()}
    finally:
        cl.close()
