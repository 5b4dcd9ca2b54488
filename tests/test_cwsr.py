"""CWSR preemption end to end against the simulator: the library mechanisms, `kfdtool preempt` /
`resume`, and the never-stuck guarantees (signals, --for, kill -9 of the preempting tool)."""
import contextlib
import errno
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import run_cli
from kfdtool import errors
from kfdtool.cli.sim_cmd import spawn_workload
from kfdtool.cwsr import ptrace
from kfdtool.cwsr.debugtrap import DebugTrapSuspend, check_grace_period, make_back_to_back, recover
from kfdtool.cwsr.patched import PatchedIoctlSuspend
from kfdtool.cwsr.update_queue import UpdateQueueSuspend
from kfdtool.device import KfdDevice
from simhelpers import Client, start

MACHINE = "mi300x"


@pytest.fixture(scope="module")
def sim(sim_dir):
    return start(MACHINE)


@pytest.fixture
def victim(sim):
    pid = spawn_workload(MACHINE, "victim", queues=3, waves=400)
    yield pid
    os.kill(pid, signal.SIGKILL)


def states(sim, pid):
    with sim.control() as ctl:
        return {q["qid"]: q for q in ctl("queues", pid=pid)["queues"]}


def progress(sim, pid):
    return {qid: q["progress_ns"] for qid, q in states(sim, pid).items()}


def test_suspend_no_progress_resume_progress_cross_process(sim, victim):
    """The kfdtest pattern, on another process through ptrace + DBG_TRAP."""
    kfd = KfdDevice(sim.open_kfd())
    try:
        with DebugTrapSuspend(kfd, victim) as mech:
            assert ptrace.tracer_of(victim) == 0          # attached only for ENABLE
            result = mech.suspend(grace_period=10)
            outcomes = result.outcomes
            assert [o.outcome for o in outcomes] == ["suspended"] * 3 and result.notes == []   # gfx942: HWS
            assert all(o.save_area_bytes > 0 and o.ctl_stack_bytes > 0 for o in outcomes)
            assert not any(q["active"] for q in states(sim, victim).values())
            p1 = progress(sim, victim)
            time.sleep(0.1)
            assert progress(sim, victim) == p1           # no progress while suspended
            assert all(o.outcome == "resumed" for o in mech.resume().outcomes)
            time.sleep(0.1)
            p2 = progress(sim, victim)
            assert all(p2[q] > p1[q] for q in p1)         # progress again
    finally:
        kfd.close()


def test_thousand_rounds_lose_nothing(sim):
    cl = Client(sim)
    try:
        qids = [cl.rt.create_queue(cl.gpus[0]) for _ in range(2)]
        rings = {q: cl.rt.queues[q]["ring_base"] for q in qids}
        cl.ctl("set_waves", pid=os.getpid(), waves=100)
        with DebugTrapSuspend(cl.kfd, os.getpid()) as mech:
            for _ in range(1000):
                assert all(o.outcome == "suspended" for o in mech.suspend(qids).outcomes)
                assert all(o.outcome == "resumed" for o in mech.resume().outcomes)
            snapshot = {e.queue_id: e for e in mech.queues()}
        final = cl.queues()
        assert all(final[q]["active"] and not final[q]["suspended"] for q in qids)
        assert {q: snapshot[q].ring_base_address for q in qids} == rings        # queues intact
        assert all(final[q]["progress_ns"] > 0 for q in qids)
    finally:
        cl.close()


def test_queue_snapshot_takes_one_call_and_still_finds_every_new_queue(sim):
    """A daemon refreshes the snapshot after every resume: one GET_QUEUE_SNAPSHOT while few queues
    appeared, and when more appeared than it had room for, every one of them still listed and
    suspendable (EC_QUEUE_NEW cleared on all)."""
    from kfdtool.cwsr.debugtrap import SNAPSHOT_SPARE
    from kfdtool.device import _op_name
    cl = Client(sim)
    try:
        first = [cl.rt.create_queue(cl.gpus[0]) for _ in range(2)]
        with DebugTrapSuspend(cl.kfd, os.getpid()) as mech:
            calls = []
            ioctl = cl.kfd.ioctl               # every DBG_TRAP call, however it was built, goes through it
            cl.kfd.ioctl = lambda name, arg, *a: calls.append(_op_name(name, arg)) or ioctl(name, arg, *a)
            assert sorted(e.queue_id for e in mech.queues()) == sorted(first)
            assert calls == ["GET_QUEUE_SNAPSHOT"]
            later = [cl.rt.create_queue(cl.gpus[0]) for _ in range(SNAPSHOT_SPARE + 5)]
            calls.clear()
            assert sorted(e.queue_id for e in mech.queues()) == sorted(first + later)
            assert calls == ["GET_QUEUE_SNAPSHOT"] * 2          # no room for them all the first time
            calls.clear()
            outcomes = mech.suspend(first + later).outcomes
            assert calls == ["SUSPEND_QUEUES"]                  # none came back still new: no repair snapshot
            assert [o.outcome for o in outcomes] == ["suspended"] * len(first + later)
            mech.resume()
    finally:
        cl.close()


def test_kill_9_of_the_preempting_tool_resumes(sim, victim):
    tool = subprocess.Popen([sys.executable, "-m", "kfdtool", "--sim", MACHINE, "preempt", "--pid", str(victim)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: not any(q["active"] for q in states(sim, victim).values()))
    assert all(q["debugger"] == tool.pid for q in states(sim, victim).values())
    tool.kill()                                      # SIGKILL: no cleanup code runs
    tool.wait()
    _wait_for(lambda: all(q["active"] for q in states(sim, victim).values()))
    assert all(q["debugger"] is None for q in states(sim, victim).values())


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_signals_resume_before_exit(sim, victim, sig):
    tool = subprocess.Popen([sys.executable, "-m", "kfdtool", "--sim", MACHINE, "preempt", "--pid", str(victim)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: not any(q["active"] for q in states(sim, victim).values()))
    listing = json.loads(run_cli("--sim", MACHINE, "queues", "--json", "-p", str(victim)).stdout)
    assert {q["suspended_by"] for q in listing["processes"][0]["queues"]} == {tool.pid}
    tool.send_signal(sig)
    _, err = tool.communicate(timeout=10)
    assert tool.returncode == 128 + sig and "resuming" in err        # the shell's convention: 130, 143, 129
    assert all(q["active"] for q in states(sim, victim).values())
    listing = json.loads(run_cli("--sim", MACHINE, "queues", "--json", "-p", str(victim)).stdout)
    assert {q["suspended_by"] for q in listing["processes"][0]["queues"]} == {None}


def test_preempt_for_duration_json(sim, victim):
    result = run_cli("--sim", MACHINE, "preempt", "--pid", str(victim), "--for", "200ms", "--queue", "1", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [o["outcome"] for o in report["suspend"]] == ["suspended"]
    assert [o["outcome"] for o in report["resume"]] == ["resumed"]
    assert report["held_s"] == pytest.approx(0.2) and report["suspend_s"] > 0 and report["resume_s"] > 0
    assert states(sim, victim)[1]["active"]


@contextlib.contextmanager
def _holding(sim, victim):
    """A live `kfdtool preempt` holding every queue of `victim` (stopped with SIGTERM at the end)."""
    holder = subprocess.Popen([sys.executable, "-m", "kfdtool", "--sim", MACHINE, "preempt", "--pid", str(victim)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for(lambda: not any(q["active"] for q in states(sim, victim).values()))
        yield holder
    finally:
        holder.send_signal(signal.SIGTERM)
        holder.wait(timeout=10)


def test_recovery_resume_all(sim, victim):
    """A holder that is alive: `kfdtool resume --all` resumes anyway, as ptrace parent."""
    with _holding(sim, victim) as holder:
        result = run_cli("--sim", MACHINE, "resume", "--pid", str(victim), "--all", "--json")
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        assert report["resumed"] == 3 and report["other_debugger_kept"] is True
        assert all(q["active"] for q in states(sim, victim).values())
        listing = json.loads(run_cli("--sim", MACHINE, "queues", "--json", "-p", str(victim)).stdout)
        assert {q["suspended_by"] for q in listing["processes"][0]["queues"]} == {None}   # the holder holds nothing now
        second = run_cli("--sim", MACHINE, "preempt", "--pid", str(victim), "--for", "10ms")
        assert second.returncode == 1 and f"kfdtool pid {holder.pid} already preempts" in second.stderr  # still its debugger


def test_another_debugger_is_named(sim, victim):
    kfd = KfdDevice(sim.open_kfd())
    try:
        with DebugTrapSuspend(kfd, victim):
            result = run_cli("--sim", MACHINE, "preempt", "--pid", str(victim), "--for", "10ms")
            assert result.returncode == 1
            assert "EALREADY: another debugger (e.g. rocgdb, rocr-debug-agent, or an xsched-lv3 daemon" in result.stderr
    finally:
        kfd.close()


def test_ptrace_conflict_is_explained(sim, victim):
    ptrace.seize(victim)                             # we play rocgdb: the victim is traced by us
    try:
        other = subprocess.run([sys.executable, "-m", "kfdtool", "--sim", MACHINE, "preempt", "--pid", str(victim),
                                "--for", "10ms"], capture_output=True, text=True, timeout=30)
        assert other.returncode == 1 and f"already traced by pid {os.getpid()}" in other.stderr
    finally:
        ptrace.detach(victim)


def test_runtime_not_enabled_is_explained(sim):
    pid = spawn_workload(MACHINE, "no-rocr", queues=1, extra=["--no-runtime-enable"])
    try:
        result = run_cli("--sim", MACHINE, "preempt", "--pid", str(pid), "--for", "10ms")
        assert result.returncode == 1
        assert "failed with EPERM: target not runtime-enabled (no ROCr runtime)" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    finally:
        os.kill(pid, signal.SIGKILL)


def test_no_hws_is_explained(sim_dir):
    machine = start("mi210", "1.23")
    with machine.control() as ctl:
        ctl("set_param", name="sched_policy", value=2)
    pid = spawn_workload("mi210", "victim", queues=1)
    try:
        result = run_cli("--sim", "mi210", "preempt", "--pid", str(pid), "--for", "10ms")
        assert result.returncode == 1 and "sched_policy=2" in result.stderr
        probe = json.loads(run_cli("--sim", "mi210", "cwsr", "--probe", "--pid", str(pid), "--json").stdout)
        debug = next(m for m in probe["mechanisms"] if m["mechanism"] == "debug-trap")
        assert not debug["available"] and "sched_policy=2" in debug["why"]
    finally:
        os.kill(pid, signal.SIGKILL)
        with machine.control() as ctl:
            ctl("set_param", name="sched_policy", value=0)


@pytest.mark.parametrize("args,needle", [
    (["preempt", "--pid", "999999", "--for", "1s"], "pid 999999 is not a KFD process"),
    (["preempt", "--pid", "{victim}", "--queue", "42", "--for", "1s"], "has no queue 42"),
    (["preempt", "--pid", "{victim}", "--gpu", "1", "--for", "1s"], "has no queues to preempt on those GPUs"),
    (["resume", "--pid", "999999", "--all"], "pid 999999 is not a KFD process"),
])
def test_preempt_bad_input(sim, victim, args, needle):
    result = run_cli("--sim", MACHINE, *[a.format(victim=victim) for a in args])
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("kfdtool: ") and needle in result.stderr and "Traceback" not in result.stderr
    assert all(q["active"] for q in states(sim, victim).values())     # nothing left half-done


def test_bad_duration_is_a_usage_error(sim):
    result = run_cli("--sim", MACHINE, "preempt", "--pid", "1", "--for", "soon")
    assert result.returncode == 2 and "not a duration" in result.stderr


def test_probe_reports_every_mechanism(sim, victim):
    probe = json.loads(run_cli("--sim", MACHINE, "cwsr", "--probe", "--pid", str(victim), "--json").stdout)
    by_name = {m["mechanism"]: m for m in probe["mechanisms"]}
    assert by_name["debug-trap"]["available"]
    assert not by_name["update-queue"]["available"] and "per process" in by_name["update-queue"]["why"]
    for patched in ("patched-preempt-queue", "patched-gpreempt"):     # their ioctls take no pid
        assert not by_name[patched]["available"] and "cannot preempt another process" in by_name[patched]["why"]
    assert probe["kfd_abi"] == "1.23" and probe["gpus"][0]["scheduler"] == "HWS"
    own = json.loads(run_cli("--sim", MACHINE, "cwsr", "--probe", "--json").stdout)    # no target: probed
    assert "no such ioctl" in {m["mechanism"]: m for m in own["mechanisms"]}["patched-preempt-queue"]["why"]


def test_update_queue_mechanism_on_own_queues(sim):
    cl = Client(sim)
    try:
        qid = cl.rt.create_queue(cl.gpus[1])
        cl.ctl("set_waves", pid=os.getpid(), qid=qid, waves=300)
        mech = UpdateQueueSuspend.from_snapshot(cl.kfd)
        assert mech.queues[qid].ring_base == cl.rt.queues[qid]["ring_base"]     # resupplied from the snapshot
        with mech:
            (outcome,) = mech.suspend([qid]).outcomes
            assert outcome.outcome == "suspended" and outcome.save_area_bytes > 0
            assert not cl.queues()[qid]["active"] and cl.queues()[qid]["percent"] == 0
        assert cl.queues()[qid]["active"] and cl.queues()[qid]["percent"] == 100     # close() resumed
    finally:
        cl.close()


def test_patched_ioctls_are_opt_in_and_probed(sim, sim_dir):
    cl = Client(sim)
    try:
        with pytest.raises(errors.NotSupported, match="no such ioctl"):
            PatchedIoctlSuspend(cl.kfd)
    finally:
        cl.close()
    from kfdtool.sim import runner
    runner.stop("mi300x-cpx")
    patched = runner.start("mi300x-cpx", "1.17", realtime=False, patched_preempt=True)
    cl = Client(patched)
    try:
        qid = cl.rt.create_queue(cl.gpus[3])
        with PatchedIoctlSuspend(cl.kfd) as mech:
            assert [o.outcome for o in mech.suspend([qid]).outcomes] == ["suspended"]
            assert not cl.queues()[qid]["active"]
        assert cl.queues()[qid]["active"]
    finally:
        cl.close()
        runner.stop("mi300x-cpx")


def test_grace_period_rules():
    assert check_grace_period(None) == 0
    assert check_grace_period(255) == 255
    with pytest.raises(ValueError, match="8-bit"):
        check_grace_period(256)
    with pytest.raises(ValueError):
        check_grace_period(-1)


def test_recover_library_call(sim, victim):
    kfd = KfdDevice(sim.open_kfd())
    try:
        mech = DebugTrapSuspend(kfd, victim)
        mech.suspend()
        count, outcomes, own = recover(kfd, victim, [0, 2])
        assert count == 2 and not own and [o.outcome for o in outcomes] == ["resumed", "resumed"]
        assert {qid: q["active"] for qid, q in states(sim, victim).items()} == {0: True, 1: False, 2: True}
        mech.close()
        assert all(q["active"] for q in states(sim, victim).values())
    finally:
        kfd.close()


def test_a_queue_id_past_32_bits_is_refused_not_wrapped_onto_queue_0(sim, victim):
    """The ioctl's queue array holds u32 ids: 2**32 became 0 there, and `resume --queue 4294967296`
    resumed queue 0, reporting success (a hostile-input sweep)."""
    kfd = KfdDevice(sim.open_kfd())
    try:
        mech = DebugTrapSuspend(kfd, victim)
        mech.suspend([0])
        for bad in (2 ** 32, 2 ** 31, 1024, -1):     # 2**31: bit 31 is masked off, naming queue 0 too
            with pytest.raises(ValueError, match="queue ids must be integers"):
                mech.resume([bad])
            with pytest.raises(ValueError, match="queue ids must be integers"):
                mech.suspend([bad])
        assert not states(sim, victim)[0]["active"]          # still suspended: nothing was resumed
        mech.close()
        assert all(q["active"] for q in states(sim, victim).values())
    finally:
        kfd.close()


OLD_RULE_MACHINE = "mi210"          # started at ABI 1.17 (Linux 6.12's profile) by the tests below


@pytest.fixture
def old_rule_sim(sim_dir):
    """A simulated kernel before 7.2: every DBG_TRAP op but DISABLE needs the target's ptrace parent."""
    from kfdtool.sim import runner
    runner.stop(OLD_RULE_MACHINE)
    machine = runner.start(OLD_RULE_MACHINE, "1.17", realtime=False)
    yield machine
    runner.stop(OLD_RULE_MACHINE)


def test_before_7_2_the_debugger_must_be_the_ptrace_parent_for_every_op_but_disable(old_rule_sim):
    """kfd_chardev.c: kfd_ioctl_set_debug_trap before 7.2: `target != p && op != DISABLE &&
    ptrace_parent(target) != current` is -EPERM ("not PTRACED"), whoever did ENABLE."""
    pid = spawn_workload(OLD_RULE_MACHINE, "victim", queues=2, waves=100)
    kfd = KfdDevice(old_rule_sim.open_kfd())
    bystander = KfdDevice(old_rule_sim.open_kfd())
    try:
        ptrace.seize(pid)
        kfd.dbg_trap("ENABLE", pid, "enable", dbg_fd=kfd.fd, exception_mask=0)
        ptrace.detach(pid)
        with pytest.raises(errors.PermissionDenied):        # the debugger, no longer its ptrace parent
            kfd.dbg_trap("GET_QUEUE_SNAPSHOT", pid, "queue_snapshot", exception_mask=0, snapshot_buf_ptr=0,
                         num_queues=0, entry_size=64)
        bystander.dbg_trap("DISABLE", pid)                  # DISABLE: anyone
        assert all(q["debugger"] is None for q in states(old_rule_sim, pid).values())
    finally:
        bystander.close()
        kfd.close()
        os.kill(pid, signal.SIGKILL)


def test_before_7_2_we_suspend_and_resume_through_a_ptrace_window_for_each_op(old_rule_sim):
    """The same mechanism on both kernels: on one before 7.2 the first op after ENABLE is refused,
    made again as the target's ptrace parent, and every later op goes that way; nothing is left
    suspended, and the target is never left traced."""
    pid = spawn_workload(OLD_RULE_MACHINE, "victim", queues=3, waves=100)
    kfd = KfdDevice(old_rule_sim.open_kfd())
    try:
        mech = DebugTrapSuspend(kfd, pid)
        outcomes = mech.suspend([0, 1]).outcomes
        assert [o.outcome for o in outcomes] == ["suspended", "suspended"] and mech.ptrace_each_call
        assert {qid: q["active"] for qid, q in states(old_rule_sim, pid).items()} == {0: False, 1: False, 2: True}
        assert ptrace.tracer_of(pid) in (0, None)
        # the daemon's path: prepared calls of several targets made back to back
        [result] = make_back_to_back(kfd, [mech.resume_call([0])])
        assert [o.outcome for o in result.outcomes] == ["resumed"]
        assert states(old_rule_sim, pid)[0]["active"] and not states(old_rule_sim, pid)[1]["active"]
        mech.close()
        assert all(q["active"] and q["debugger"] is None for q in states(old_rule_sim, pid).values())
        assert ptrace.tracer_of(pid) in (0, None)
    finally:
        kfd.close()
        os.kill(pid, signal.SIGKILL)


HOLDER = """
import sys
from kfdtool.cwsr import ptrace
pid = int(sys.argv[1])
ptrace.seize(pid)                                   # a debugger (rocgdb) attached, keeping the target
print("attached", flush=True)
sys.stdin.readline()
ptrace.detach(pid)
"""


@contextlib.contextmanager
def another_tracer(pid):
    """Another debugger (rocgdb, say) attached to `pid` for the block."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(pid)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "attached"
        yield
    finally:
        holder.communicate("\n", timeout=10)


def test_before_7_2_a_window_another_tracer_denies_leaves_the_kernels_eperm(old_rule_sim):
    """The window cannot be had while another debugger traces the target: the caller gets the
    kernel's refusal (PermissionDenied), as a caller that knows nothing of windows expects; once
    that tracer lets go, the same mechanism works and resumes everything."""
    pid = spawn_workload(OLD_RULE_MACHINE, "victim", queues=2, waves=100)
    kfd = KfdDevice(old_rule_sim.open_kfd())
    try:
        mech = DebugTrapSuspend(kfd, pid)
        with another_tracer(pid), pytest.raises(errors.PermissionDenied):
            mech.suspend([0])
        assert [o.outcome for o in mech.suspend([0]).outcomes] == ["suspended"]
        mech.close()
        assert all(q["active"] and q["debugger"] is None for q in states(old_rule_sim, pid).values())
    finally:
        kfd.close()
        os.kill(pid, signal.SIGKILL)


SIGNALLED = r"""
import os, signal, sys, time
from kfdtool.device import KfdDevice
from kfdtool.sim import runner
from kfdtool.sim.workload import FakeRuntime
sim = runner.machine(sys.argv[1])
rt = FakeRuntime(KfdDevice(sim.open_kfd()), sim.sysfs_root)
gpu = next(rt.topology.for_each_gpu()).gpu_id
for _ in range(2):
    rt.create_queue(gpu)
signal.signal(signal.SIGUSR2, lambda *_: os.write(1, b"a"))    # each SIGUSR2 answered with a byte
os.write(1, b"ready\n")
while True:
    time.sleep(0.0005)
"""


def test_before_7_2_signals_sent_during_the_windows_reach_the_target(old_rule_sim):
    """A signal that arrives while we hold the target seized stops it on its way in; the detach
    hands it back (a review found 121 of 300 SIGUSR2 lost, and SIGTERM lost 6 times in 20, while
    every op had its window). Signals are sent from another thread while this one suspends and
    resumes; every one is answered, and SIGTERM ends the target."""
    target = subprocess.Popen([sys.executable, "-c", SIGNALLED, OLD_RULE_MACHINE], stdout=subprocess.PIPE)
    kfd = KfdDevice(old_rule_sim.open_kfd())
    try:
        assert target.stdout.readline() == b"ready\n"
        mech = DebugTrapSuspend(kfd, target.pid)
        mech.suspend()                  # learns the rule first: from here on every op has its window
        mech.resume()
        assert mech.ptrace_each_call
        lost, sent, enough = [], [0], threading.Event()

        def send():
            # until the loop below has made enough rounds: a busy host makes the first rounds slow,
            # and a fixed count of signals was once all answered within a single round
            while not enough.is_set():
                os.kill(target.pid, signal.SIGUSR2)
                ready, _, _ = select.select([target.stdout], [], [], 2.0)
                if ready:
                    os.read(target.stdout.fileno(), 1)
                else:
                    lost.append(1)
                sent[0] += 1
        sender = threading.Thread(target=send)
        sender.start()
        rounds, deadline = 0, time.monotonic() + 60
        try:
            while (rounds < 20 or sent[0] < 300) and time.monotonic() < deadline:
                mech.suspend()
                mech.resume()
                rounds += 1
        finally:
            enough.set()
            sender.join()
        assert rounds >= 20 and sent[0] >= 300 and not lost, (rounds, sent[0], len(lost))
        os.kill(target.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while target.poll() is None and time.monotonic() < deadline:
            try:
                mech.suspend()
                mech.resume()
            except errors.Error:
                break                                   # it is going or gone
        target.wait(timeout=5)                          # ended (its runtime exits cleanly on SIGTERM)
        mech.close()                                    # on a target that is gone: quietly
    finally:
        if target.poll() is None:
            target.kill()
            target.wait()
        kfd.close()


def test_before_7_2_a_target_gone_or_taken_answers_as_the_kernel_would(old_rule_sim):
    """Once every op has its window: a target that exited answers ESRCH (close() is quiet, as on
    7.2), and one another debugger took over answers EPERM (not the window's AttachDenied)."""
    pid = spawn_workload(OLD_RULE_MACHINE, "victim", queues=2, waves=100)
    kfd = KfdDevice(old_rule_sim.open_kfd())
    try:
        mech = DebugTrapSuspend(kfd, pid)
        mech.suspend([0])
        assert mech.ptrace_each_call
        with another_tracer(pid), pytest.raises(errors.PermissionDenied):
            mech.resume([0])
        os.kill(pid, signal.SIGKILL)
        _wait_for(lambda: not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z")
        with pytest.raises(errors.KfdIoctlError) as gone:
            mech.resume([0])
        assert gone.value.errno == errno.ESRCH
        mech.close()                                    # quietly
    finally:
        kfd.close()


def test_on_7_2_the_debugger_needs_no_ptrace_window_after_enable(sim, victim):
    kfd = KfdDevice(sim.open_kfd())
    try:
        mech = DebugTrapSuspend(kfd, victim)
        mech.suspend([0])
        mech.resume([0])
        assert not mech.ptrace_each_call
        mech.close()
    finally:
        kfd.close()


def test_kfdtool_preempt_works_on_a_kernel_before_7_2(old_rule_sim):
    pid = spawn_workload(OLD_RULE_MACHINE, "victim", queues=2, waves=100)
    try:
        r = subprocess.run([sys.executable, "-m", "kfdtool", "--sim", OLD_RULE_MACHINE, "preempt", "--pid", str(pid),
                            "--for", "50ms", "--json"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        report = json.loads(r.stdout)
        assert {q["outcome"] for q in report["suspend"]} == {"suspended"}
        assert {q["outcome"] for q in report["resume"]} == {"resumed"}
        assert all(q["active"] and q["debugger"] is None for q in states(old_rule_sim, pid).values())
    finally:
        os.kill(pid, signal.SIGKILL)


def _wait_for(predicate, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached in time")


def test_debug_trap_suspend_emits_no_smi_events_eviction_does(sim):
    """kfd-abi.md §5.3: debugger suspend/resume and UPDATE_QUEUE are silent; eviction is not."""
    from kfdtool.ioctls import constants as c
    cl = Client(sim)
    try:
        qid = cl.rt.create_queue(cl.gpus[0])
        fd = cl.open_smi(cl.gpus[0], c.KFD_SMI_EVENT_QUEUE_EVICTION, c.KFD_SMI_EVENT_QUEUE_RESTORE)
        with DebugTrapSuspend(cl.kfd, os.getpid()) as mech:
            mech.suspend([qid])
            mech.resume([qid])
        with UpdateQueueSuspend.from_snapshot(cl.kfd) as mech:
            mech.suspend([qid])
        time.sleep(0.05)
        with pytest.raises(BlockingIOError):
            os.read(fd, 4096)
        cl.ctl("evict", pid=os.getpid())
        cl.ctl("restore", pid=os.getpid())
        time.sleep(0.05)
        records = []
        while True:                       # the simulator hands out one record per read
            try:
                records.append(os.read(fd, 4096))
            except BlockingIOError:
                break
        assert b"".join(records).decode().count(f" -{os.getpid()} ") >= 2
        os.close(fd)
    finally:
        cl.close()


def test_works_as_the_targets_ptrace_parent(sim, victim):
    """Already its tracer (e.g. a launcher that ptraces): no second attach, DBG_TRAP allowed."""
    ptrace.seize(victim)
    kfd = KfdDevice(sim.open_kfd())
    try:
        with DebugTrapSuspend(kfd, victim) as mech:
            assert ptrace.tracer_of(victim) == os.getpid()
            assert [o.outcome for o in mech.suspend([0]).outcomes] == ["suspended"]
        assert all(q["active"] for q in states(sim, victim).values())
    finally:
        kfd.close()
        ptrace.detach(victim)


def test_resume_of_a_queue_that_does_not_exist_fails_like_preempt(sim, victim):
    result = run_cli("--sim", MACHINE, "resume", "--pid", str(victim), "--queue", "99")
    assert result.returncode == 1 and "not-found" in result.stdout
    assert result.stderr.strip() == f"kfdtool: pid {victim}: queue 99 not-found"


def test_a_signal_at_any_moment_leaves_nothing_suspended_and_no_traceback(sim, victim):
    """Signals from the first line (opening the device) to the last (DISABLE), at spread moments."""
    for delay in (0.0, 0.02, 0.05, 0.08, 0.12, 0.2, 0.3, 0.45):
        tool = subprocess.Popen([sys.executable, "-m", "kfdtool", "--sim", MACHINE, "preempt", "--pid", str(victim),
                                 "--for", "1ms"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        tool.send_signal(signal.SIGTERM)
        _, err = tool.communicate(timeout=10)
        assert "Traceback" not in err, err
        assert tool.returncode in (0, 128 + signal.SIGTERM, -signal.SIGTERM), (delay, tool.returncode, err)
        _wait_for(lambda: all(q["active"] for q in states(sim, victim).values()))


def test_a_second_kfdtool_is_named_not_rocgdb(sim, victim):
    with _holding(sim, victim) as holder:
        second = run_cli("--sim", MACHINE, "preempt", "--pid", str(victim), "--for", "10ms")
        assert second.returncode == 1 and f"kfdtool pid {holder.pid} already preempts pid {victim}" in second.stderr
        assert "rocgdb" not in second.stderr


def test_probe_of_a_process_without_queues_says_so(sim):
    result = run_cli("--sim", MACHINE, "cwsr", "--probe", "--pid", "999999", "--json")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip() == "kfdtool: pid 999999 is not a KFD process: no queues to preempt"


def test_resume_and_preempt_name_each_queue_once(sim, victim):
    result = run_cli("--sim", MACHINE, "preempt", "--pid", str(victim), "--queue", "0", "--queue", "0",
                     "--for", "10ms", "--json")
    assert result.returncode == 0
    assert [o["qid"] for o in json.loads(result.stdout)["suspend"]] == [0]


def test_grace_period_is_checked_by_the_library_too(sim, victim):
    """The CLI refuses --grace 256 while parsing (tests/test_bad_inputs.py); a library caller learns it
    from the mechanism, before anything is suspended."""
    kfd = KfdDevice(sim.open_kfd())
    try:
        with DebugTrapSuspend(kfd, victim) as mech:
            with pytest.raises(ValueError, match="does not fit the 8-bit SCH_WAVE field"):
                mech.suspend([q.queue_id for q in mech.queues()], 256)
        assert all(q["active"] for q in states(sim, victim).values())
    finally:
        kfd.close()


def test_a_run_dir_that_is_a_file_is_refused_before_suspending(sim, victim, tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    result = run_cli("--sim", MACHINE, "preempt", "--pid", str(victim), "--for", "10ms",
                     env={"KFDTOOL_RUN_DIR": str(not_a_dir)})
    assert result.returncode == 1 and result.stderr.strip() == \
        f"kfdtool: {not_a_dir} (KFDTOOL_RUN_DIR) is not a directory: refusing to keep hold records there"
    assert all(q["active"] for q in states(sim, victim).values())


@pytest.mark.parametrize("planted", ["shared directory", "link to a directory"])
def test_a_run_dir_others_could_have_planted_is_refused_before_suspending(sim, victim, tmp_path, planted):
    """The default records directory (/tmp/kfdtool-run-<uid>) has a predictable name: another user
    could create it first, writable by all, or put a link there, and then have our records written
    into any file of ours through links planted inside. Only a directory of ours that nobody else
    may write is used."""
    run = tmp_path / "run"
    if planted == "shared directory":
        run.mkdir()
        run.chmod(0o777)
        why = "may be written by others (mode 777)"
    else:
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        run.symlink_to(tmp_path / "elsewhere")
        why = "is not a directory"
    result = run_cli("--sim", MACHINE, "preempt", "--pid", str(victim), "--for", "10ms", env={"KFDTOOL_RUN_DIR": str(run)})
    assert result.returncode == 1 and result.stderr.strip() == \
        f"kfdtool: {run} (KFDTOOL_RUN_DIR) {why}: refusing to keep hold records there"
    assert all(q["active"] for q in states(sim, victim).values())


def test_a_hold_record_is_never_written_through_a_link_at_its_temporary_name(tmp_path, monkeypatch):
    from kfdtool.cwsr.holds import Hold, for_each_hold
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    monkeypatch.setenv("KFDTOOL_RUN_DIR", str(run))
    precious = tmp_path / "precious.txt"
    precious.write_text("somebody's notes\n")
    target = os.getppid()
    (run / f"{target}.{os.getpid()}.tmp").symlink_to(precious)
    with Hold(target, [0, 1], "test") as hold:
        assert precious.read_text() == "somebody's notes\n"
        assert [r["queues"] for r in for_each_hold()] == [[0, 1]]
        hold.update([1])
        assert [r["queues"] for r in for_each_hold()] == [[1]]
    assert precious.read_text() == "somebody's notes\n" and list(run.iterdir()) == []


@pytest.mark.parametrize("record", ['{"holder_pid": "x", "target_pid": 1}', "[1, 2]", '{"holder_pid": 1, "target_pid": 1, '
                                    '"queues": 5}', '{"holder_pid": 100000000000000000000, "target_pid": 1, "queues": []}',
                                    '{"holder_pid": 1, "target_pid": 1, "queues": ["0"]}', "\u0000"])
def test_a_malformed_hold_record_is_ignored_by_queues(sim, victim, tmp_path, record):
    """Before, each of these made `kfdtool queues` end in a traceback (TypeError, AttributeError,
    OverflowError)."""
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    (run / "1.1.json").write_text(record)
    result = run_cli("--sim", MACHINE, "queues", "--json", "-p", str(victim), env={"KFDTOOL_RUN_DIR": str(run)})
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    listing = json.loads(result.stdout)
    assert {q["suspended_by"] for q in listing["processes"][0]["queues"]} == {None}


def test_patched_mechanism_is_not_offered_for_another_process(sim, victim):
    """The patched 0x87/0x88 ioctls take no pid: `preempt` refuses them while parsing, in one line,
    before touching the target."""
    result = run_cli("--sim", MACHINE, "preempt", "--pid", str(victim), "--mechanism", "patched-preempt-queue",
                     "--for", "10ms")
    assert result.returncode == 2 and result.stdout == "" and "Traceback" not in result.stderr
    (error,) = [line for line in result.stderr.splitlines() if "error:" in line]
    assert "act only on the calling process's own queues; use debug-trap" in error
    assert all(q["active"] and q["debugger"] is None for q in states(sim, victim).values())


def test_preempt_reports_the_mechanisms_notes(sim_dir):
    """A grace period for queues of an MES GPU (gfx11+): `preempt` passes on the mechanism's note."""
    from kfdtool.sim import runner
    composite = start("composite")
    from kfdtool.topology import read_topology
    gpus = list(read_topology(composite.sysfs_root).for_each_gpu())      # the workload's order
    first_mes = next(i for i, g in enumerate(gpus) if g.gfx_target_version >= 110000)
    pid = spawn_workload("composite", "mes-victim", first_gpu=first_mes, queues=1)
    try:
        result = run_cli("--sim", "composite", "preempt", "--pid", str(pid), "--grace", "10", "--for", "10ms", "--json")
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        assert report["notes"] == ["the MES scheduler (gfx11+) ignores the grace period"]
        text = run_cli("--sim", "composite", "preempt", "--pid", str(pid), "--grace", "10", "--for", "10ms")
        assert "note: the MES scheduler (gfx11+) ignores the grace period" in text.stdout
    finally:
        os.kill(pid, signal.SIGKILL)
        runner.stop("composite")            # other tests start it with another ABI


THIEF = """
import sys
from kfdtool.sim import runner
from kfdtool.device import KfdDevice
from kfdtool.cwsr import ptrace
from kfdtool.errors import AlreadyDebugged
pid = int(sys.argv[1])
kfd = KfdDevice(runner.machine(sys.argv[2]).open_kfd())
ptrace.seize(pid)                                   # rocgdb attaching to a process we already debug
try:
    kfd.dbg_trap("ENABLE", pid, "enable", dbg_fd=kfd.fd, exception_mask=0)
    answer = "enabled"
except AlreadyDebugged:
    answer = "EALREADY"                             # it gives up, as ROCdbgapi does ...
ptrace.detach(pid)                                  # ... and lets go, before it says so (the test
print(answer, flush=True)                           # then attaches: not while this one still is)
sys.stdin.readline()
"""


def test_a_refused_enable_takes_the_debugger_role_and_we_still_resume_everything(sim, victim):
    """kfd_ioctl_set_debug_trap names the caller of ENABLE the target's debugger_process before
    kfd_dbg_trap_enable refuses it (EALREADY): the debugger that did ENABLE gets EPERM from then on
    and its exit no longer disables the target. Each op of ours is then made again as the target's
    ptrace parent, which the kernel admits, and so is our DISABLE: what we suspended is resumed all
    the same, queue by queue as asked."""
    kfd = KfdDevice(sim.open_kfd())
    thief = None
    try:
        mech = DebugTrapSuspend(kfd, victim)
        mech.suspend([0, 1])
        thief = subprocess.Popen([sys.executable, "-c", THIEF, str(victim), MACHINE], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        assert thief.stdout.readline().strip() == "EALREADY"
        assert {q["debugger"] for q in states(sim, victim).values()} == {thief.pid}   # the role went with it
        assert [o.outcome for o in mech.resume([0]).outcomes] == ["resumed"]
        assert mech.ptrace_each_call                          # learned from the EPERM the window cured
        assert {qid: q["active"] for qid, q in states(sim, victim).items()}[0]
        assert ptrace.tracer_of(victim) in (0, None)          # the window closed again
        mech.close()
        assert all(q["active"] and q["debugger"] is None for q in states(sim, victim).values())
        assert ptrace.tracer_of(victim) in (0, None)          # and we let go of it again
    finally:
        if thief is not None:
            thief.communicate("\n", timeout=10)
        kfd.close()


def test_resume_all_of_a_process_we_debug_leaves_us_its_debugger(sim, victim):
    """`kfdtool resume --all` on a process another debugger holds resumes it as ptrace parent without
    ENABLE (which, refused, would still have taken that debugger's role): the holder keeps it."""
    kfd = KfdDevice(sim.open_kfd())
    try:
        with DebugTrapSuspend(kfd, victim) as mech:
            mech.suspend([0, 1, 2])
            result = run_cli("--sim", MACHINE, "resume", "--pid", str(victim), "--all")
            assert result.returncode == 0, result.stderr
            assert all(q["active"] and q["debugger"] == os.getpid() for q in states(sim, victim).values())
            assert all(o.ok for o in mech.resume().outcomes)        # still ours to use: no EPERM
            assert [o.outcome for o in mech.suspend([0]).outcomes] == ["suspended"]
        assert all(q["active"] for q in states(sim, victim).values())
    finally:
        kfd.close()


def test_debugging_a_process_that_never_opened_kfd_makes_it_none(sim):
    """ENABLE by a ptrace parent would create a KFD process (kfd_ioctl_set_debug_trap calls
    kfd_create_process); kfdtool's question before ENABLE looks the target up without creating it,
    so a process that never used the GPU is refused (ESRCH) and stays no KFD process."""
    from kfdtool.sysfs import SysfsRoot
    sleeper = subprocess.Popen(["sleep", "30"])
    kfd = KfdDevice(sim.open_kfd())
    try:
        with pytest.raises(errors.ProcessNotFound):
            DebugTrapSuspend(kfd, sleeper.pid)
        assert not (SysfsRoot(sim.sysfs_root).proc / str(sleeper.pid)).exists()
        assert ptrace.tracer_of(sleeper.pid) in (0, None)
    finally:
        kfd.close()
        sleeper.kill()
        sleeper.wait()


@pytest.fixture
def draining_sim(tmp_path, monkeypatch):
    """A realtime simulator of its own without CWSR, where a suspend drains its waves (ESTIMATE 1 ms,
    longer than the server takes to handle it: each returns later than the server's now). Yields
    (sim, kfd, spawn_victim): spawn_victim(queues) starts a process with waves on its queues (killed
    after)."""
    from kfdtool.sim import runner
    monkeypatch.setenv("KFDTOOL_SIM_DIR", str(tmp_path))
    sim = runner.start(MACHINE, params={"cwsr_enable": 0})
    victims = []

    def spawn_victim(queues=2):
        victims.append(spawn_workload(MACHINE, "victim", queues=queues, waves=400))
        return victims[-1]
    kfd = KfdDevice(sim.open_kfd())
    try:
        yield sim, kfd, spawn_victim
    finally:
        kfd.close()
        for pid in victims:
            os.kill(pid, signal.SIGKILL)


def test_calls_made_back_to_back_answer_as_made_one_by_one_each_after_the_one_before(draining_sim):
    """A daemon preempting several processes makes their SUSPEND_QUEUES back to back
    (make_back_to_back): each answers as it would alone, one that fails (a pid nobody debugs)
    stops none of the others, none goes through the one-call path, and the caller takes at least
    the sum of their costs. Realtime and without CWSR a suspend drains its waves (ESTIMATE 1 ms,
    longer than the server takes to handle it), so each call returns later than the server's now:
    the server makes the next one when it has returned, as the caller's loop would, and all are
    answered in one round trip (before, the caller was answered there and sent the rest: a round
    trip a call, each after a wake-up of the caller)."""
    from kfdtool.cwsr.debugtrap import PreparedCall, make_back_to_back
    from kfdtool.device import dbg_trap_args
    sim, kfd, spawn_victim = draining_sim
    victims = [spawn_victim(), spawn_victim()]
    one_by_one, round_trips = [], []
    single, batch = kfd.backend.ioctl, kfd.backend._batch
    kfd.backend.ioctl = lambda request, arg: one_by_one.append(request) or single(request, arg)
    kfd.backend._batch = lambda calls: round_trips.append(len(calls)) or batch(calls)
    with DebugTrapSuspend(kfd, victims[0]) as first, DebugTrapSuspend(kfd, victims[1]) as second:
        calls = [first.suspend_call(grace_period=1),
                 PreparedCall(dbg_trap_args("SUSPEND_QUEUES", os.getpid(), "suspend_queues"), lambda: None),
                 second.suspend_call(grace_period=1)]
        one_by_one.clear()
        round_trips.clear()
        began = time.monotonic()
        done = make_back_to_back(kfd, calls)
        took = time.monotonic() - began
        with sim.control() as ctl:
            cost = ctl("last_cost")              # the second suspend's (the same work as the first's)
        one_call_s = cost["remap_s"] + cost["grace_s"] + cost["save_s"]
        assert one_by_one == []
        assert [o.outcome for o in done[0].outcomes] == ["suspended"] * 2
        assert isinstance(done[1], errors.KfdIoctlError)           # this process is nobody's debuggee
        assert [o.outcome for o in done[2].outcomes] == ["suspended"] * 2
        assert not any(q["active"] for v in victims for q in states(sim, v).values())
        assert one_call_s >= 1e-3 and took >= 2 * one_call_s
        assert round_trips == [3]
        assert took < 0.4        # not left to the server's 0.5 s poll: its wake timer fires for the next call
        resumed = make_back_to_back(kfd, [first.resume_call(), second.resume_call()])
        assert [[o.outcome for o in r.outcomes] for r in resumed] == [["resumed"] * 2] * 2
        assert one_by_one == []
        assert all(q["active"] for v in victims for q in states(sim, v).values())


def test_a_caller_that_hangs_up_while_its_calls_wait_for_the_one_before_stops_only_its_own_calls(draining_sim):
    """The server makes a batch's next call when the one before has returned (each suspend here
    drains its waves, ~1 ms; every call remaps the device). A caller whose connection closes
    meanwhile loses the calls it had not yet made: none is made after it hung up. The server serves
    on, with no error of its own, and the caller's debuggee is resumed when it detaches."""
    import socket
    import threading
    from kfdtool.cwsr.debugtrap import make_back_to_back
    sim, kfd, spawn_victim = draining_sim
    victim = spawn_victim()

    def remaps():                                  # one a suspend or resume made
        with sim.control() as ctl:
            return sum(ctl("status")["remaps"].values())
    with DebugTrapSuspend(kfd, victim) as mech:
        qids = sorted(states(sim, victim))
        calls = [call for _ in range(32) for call in (mech.suspend_call(grace_period=1), mech.resume_call(qids))]
        channel, outcome = [], []

        def make_them():
            channel.append(kfd.backend._channel())          # this thread's connection
            outcome.append(make_back_to_back(kfd, calls))
        before = remaps()
        maker = threading.Thread(target=make_them)
        maker.start()
        deadline = time.monotonic() + 10
        while remaps() - before < 4:                        # a few made: the rest take ~30 ms or more
            assert time.monotonic() < deadline
        channel[0].sock.shutdown(socket.SHUT_RDWR)
        maker.join(10)
        assert not maker.is_alive()
        assert all(isinstance(answer, errors.SimulatorError) for answer in outcome[0])
        time.sleep(0.2)                                     # longer than the rest would have taken
        made = remaps() - before
        time.sleep(0.1)
        assert 4 <= made < len(calls) and remaps() - before == made
    assert all(q["active"] for q in states(sim, victim).values())
    log = (sim.dir / "server.log").read_text()
    assert "simulator bug" not in log and "Traceback" not in log


def test_a_client_that_does_not_wait_for_its_calls_to_return_cannot_hold_the_queue_manager_for_others(draining_sim):
    """Each suspend here drains its waves (~1 ms) under the device's queue-manager lock, and its
    caller is told when the call returns. A client that sends 60 such calls at once without waiting
    (a kernel thread could not: it makes its next call only once the last returned) has each made
    when its last returned, so another client's call waits for at most about one of them, not for
    all (before, the lock's modelled time was pushed ~30 ms ahead of everyone)."""
    import socket
    from kfdtool.ioctls.requests import BY_NAME
    from kfdtool.sim.client import _ioctl_body, _outgoing
    from kfdtool.sim.protocol import frame, recv_frame
    sim, kfd, spawn_victim = draining_sim
    victims = [spawn_victim(queues=1), spawn_victim(queues=1)]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as hasty, \
            DebugTrapSuspend(kfd, victims[0]) as theirs, DebugTrapSuspend(kfd, victims[1]) as ours:
        hasty.settimeout(30)
        qids = sorted(states(sim, victims[0]))
        ours.queues()
        calls = [call for _ in range(30) for call in (theirs.suspend_call(qids, grace_period=1),
                                                     theirs.resume_call(qids))]
        dbg_trap = BY_NAME["DBG_TRAP"].request()
        hasty.connect(str(sim.socket))
        hasty.sendall(frame(b"O"))
        recv_frame(hasty)
        for call in calls:                                 # all at once, none waited for
            raw, regions = _outgoing(dbg_trap, call.arg)
            hasty.sendall(frame(b"I" + _ioctl_body(dbg_trap, raw, regions, time.monotonic_ns())))
        time.sleep(0.005)
        began = time.monotonic()
        result = ours.suspend(grace_period=1)              # ~1 ms of its own
        took = time.monotonic() - began
        assert [o.outcome for o in result.outcomes] == ["suspended"]
        assert took < 0.012, f"our suspend waited {took * 1e3:.1f} ms for the other client's calls"
        for _ in calls:                                    # theirs are all answered, in the end
            assert recv_frame(hasty)[0][:1] == b"R"


def test_a_call_that_sleeps_in_the_kernel_ends_a_batch_and_the_rest_are_made_after_it(sim):
    """DESTROY_QUEUE of a queue its debugger suspended sleeps until the queue is resumed. Made back
    to back with a call after it, that call is made only once the destroy returned, as a loop in
    one thread would make it, and both answer."""
    import threading
    cl = Client(sim)
    try:
        qid = cl.rt.create_queue(cl.gpus[0])
        with DebugTrapSuspend(cl.kfd, os.getpid()) as mech:
            mech.suspend([qid])
            resumed_at = []

            def resume_later():
                time.sleep(0.1)
                resumed_at.append(time.monotonic())
                mech.resume([qid])                 # another thread: its own connection
            resumer = threading.Thread(target=resume_later)
            resumer.start()
            destroy = cl.kfd.abi.layout("kfd_ioctl_destroy_queue_args")
            answers = cl.kfd.ioctls([("DESTROY_QUEUE", destroy(qid, 0)), ("DESTROY_QUEUE", destroy(qid, 0))])
            returned_at = time.monotonic()
            resumer.join()
            cl.rt.queues.pop(qid)
            assert answers[0] == 0
            # made after the first returned, the second finds the queue gone (EINVAL); made while the
            # first slept, it would have found it being destroyed (EBUSY)
            assert isinstance(answers[1], errors.KfdIoctlError) and answers[1].errno == errno.EINVAL
            assert returned_at >= resumed_at[0]           # the destroy slept until the resume
            assert qid not in cl.queues()
    finally:
        cl.close()


def test_an_smi_events_call_among_calls_back_to_back_still_gets_its_fd(sim):
    """SMI_EVENTS returns an fd, which only a one-call reply carries: among calls made back to back
    it is made by itself, in its place, and its fd is usable (found in review: it came back -1)."""
    from kfdtool.ioctls import structs as s
    cl = Client(sim)
    try:
        version, events = s.kfd_ioctl_get_version_args(), s.kfd_ioctl_smi_events_args(gpuid=cl.gpus[0])
        assert cl.kfd.ioctls([("GET_VERSION", version), ("SMI_EVENTS", events)]) == [0, 0]
        assert version.major_version == 1
        os.fstat(events.anon_fd)                          # a real descriptor of ours
        os.close(events.anon_fd)
    finally:
        cl.close()


def test_a_gpu_with_one_debug_vmid_suspends_one_process_at_a_time(sim_dir):
    """kfd_device_queue_manager.c: reserve_debug_trap_vmid: a GPU without per-VMID debugging (a
    Vega10) has one debug VMID, so a second process's debug session is ENABLED_BUSY and its queues
    cannot be suspended: `suspend` says so in one line (no SUSPEND_QUEUES is made, the kernel would
    answer EPERM), and once the first session has ended a new one suspends it."""
    vega = start("vega10")
    first_pid = spawn_workload("vega10", "first", queues=1, waves=10)
    second_pid = spawn_workload("vega10", "second", queues=1, waves=10)
    kfd = KfdDevice(vega.open_kfd())
    try:
        first = DebugTrapSuspend(kfd, first_pid)
        assert first.suspend().ok
        second = DebugTrapSuspend(kfd, second_pid)
        with pytest.raises(errors.PermissionDenied, match="ENABLED_BUSY"):
            second.suspend()
        second.close()
        first.resume()
        first.close()
        again = DebugTrapSuspend(kfd, second_pid)
        assert again.suspend().ok
        again.resume()
        again.close()
        with vega.control() as ctl:
            for pid in (first_pid, second_pid):
                assert not any(q["suspended"] for q in ctl("queues", pid=pid)["queues"])
    finally:
        for pid in (first_pid, second_pid):
            os.kill(pid, signal.SIGKILL)
        kfd.close()
