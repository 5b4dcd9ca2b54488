"""Lv3 through the daemon on the simulated KFD: separate OS processes with real (simulated) KFD
queues, a daemon that attaches to them with ptrace + DBG_TRAP ENABLE, and the board on which
their gates (played here by the test) mark requests active. Each test checks what a user would see:
queues suspended while a higher-priority client is active, resumed after, and never left suspended
(client exits, stops, the daemon killed with SIGKILL)."""
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kfdtool.cwsr import ptrace
from kfdtool.cwsr.debugtrap import PreparedCall
from kfdtool.cwsr.holds import suspended_by
from kfdtool.ioctls.constants import kfd_dbg_runtime_state
from kfdtool.sim import runner
from kfdtool.sysfs import SysfsRoot
from simhelpers import start
from xsched_lv3.board import Board
from xsched_lv3.daemon_link import poke, request, wake_path

REPO = Path(__file__).resolve().parents[1]
DEVICE = 7                                   # the board's key for the GPU both clients use


def wait_for(predicate, what, timeout=5.0, why=None):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}" + (f": {why()}" if why else "")
        time.sleep(0.005)


def spawn_workers(*roles, env=None, linger=False, machine="mi308x"):
    """Simulated GPU processes on the machine's first GPU, 2 queues each, ready when returned; with
    `linger` they outlive their simulator (the pid stays on the board)."""
    workers = []
    for role in roles:
        args = ["--sim", machine, "--role", role, "--queues", "2", "--waves", "200"]
        cmd = ([sys.executable, "-c", f"import kfdtool.sim.workload as w, time; w.main({args!r}); time.sleep(600)"]
               if linger else [sys.executable, "-m", "kfdtool.sim.workload", *args])
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
        assert proc.stdout.readline().startswith("ready"), f"{role} did not start"
        workers.append(proc)
    return workers


@pytest.fixture
def setup(sim_dir, tmp_path, monkeypatch, request):
    """A running simulated mi308x (or the (machine, ABI) a test names), two GPU processes on its
    first GPU, a daemon with Lv3."""
    machine, abi = getattr(request, "param", ("mi308x", "1.23"))
    if abi != "1.23":
        runner.stop(machine)                  # a kernel of another profile: started for this test alone
        request.addfinalizer(lambda: runner.stop(machine))
    sim = start(machine, abi)
    env = dict(os.environ, XSCHED_LV3_BOARD=str(tmp_path / "board"), XSCHED_LV3_SOCKET=str(tmp_path / "d.sock"),
               KFDTOOL_RUN_DIR=str(tmp_path / "run"))
    for key in ("XSCHED_LV3_BOARD", "XSCHED_LV3_SOCKET", "KFDTOOL_RUN_DIR"):
        monkeypatch.setenv(key, env[key])
    workers = spawn_workers("hp-serve", "lp-train", env=env, machine=machine)
    board = Board()
    daemon = subprocess.Popen([sys.executable, "-m", "xsched_lv3", "daemon", "--sim", machine], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready, _, _ = select.select([daemon.stdout], [], [], 20)
    assert ready and f"Lv3 through simulated {machine}" in daemon.stdout.readline()
    ctx = Setup(sim, board, daemon, workers, str(tmp_path / "d.sock"))
    yield ctx
    for proc in workers + [daemon]:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    if daemon.stderr and not daemon.stderr.closed:
        print("daemon log:", daemon.stderr.read())       # shown when a test failed
    board.close()


class Setup:
    def __init__(self, sim, board, daemon, workers, sock):
        self.sim, self.board, self.daemon, self.sock = sim, board, daemon, sock
        self.hp, self.lp = workers
        self.ctl = sim.control()

    def queues(self, proc):
        return self.ctl("queues", pid=proc.pid)["queues"]

    def lp_suspended(self):
        return all(q["suspended"] for q in self.queues(self.lp))

    def lp_running(self):
        return not any(q["suspended"] for q in self.queues(self.lp))

    def client(self, proc, priority):
        """What a gate does for a process under `xsched-lv3 run`: one slot, its GPU known."""
        slot = self.board.allocate(proc.pid, priority, 0, DEVICE)
        poke(wake_path(self.sock))
        return slot

    def hp_holds_lp(self):
        """Both processes as `run` clients (HP 10, LP 0), the LP at Lv3, the HP in a request: the LP's
        queues suspended. Returns their slots."""
        hp, lp = self.client(self.hp, 10), self.client(self.lp, 0)
        wait_for(lambda: self.board.read_slot(lp).level == 3, "Lv3", why=lambda: self.status(self.lp)["why"])
        self.set_active(hp, True)
        wait_for(self.lp_suspended, "suspend")
        return hp, lp

    def hp_holds_attached_lp(self):
        """The LP attached (`xsched-lv3 attach`), the HP a `run` client in a request: the LP's queues
        suspended. Returns the HP's slot."""
        assert xsched("attach", "--pid", str(self.lp.pid)).returncode == 0
        hp = self.client(self.hp, 10)
        self.set_active(hp, True)
        wait_for(self.lp_suspended, "suspend")
        return hp

    def one_request(self, hp):
        """The HP's slot active, then idle: the LP suspended, then running again."""
        self.set_active(hp, True)
        wait_for(self.lp_suspended, "suspend")
        self.set_active(hp, False)
        wait_for(self.lp_running, "resume")

    def set_active(self, slot, active):
        self.board.set_active(slot, active)
        poke(wake_path(self.sock))

    def status(self, proc):
        return next(c for c in request({"op": "status"}, self.sock)["clients"] if c["pid"] == proc.pid)


def test_lv3_suspends_the_lower_client_while_the_higher_one_is_active(setup):
    s = setup
    hp, lp = s.client(s.hp, 10), s.client(s.lp, 0)
    wait_for(lambda: s.board.read_slot(lp).level == 3, "the daemon to take the LP to Lv3",
             why=lambda: s.status(s.lp)["why"])
    assert s.board.read_slot(hp).level == 1           # nobody above the HP: never attached
    assert "DBG_TRAP" in s.status(s.lp)["why"]
    assert s.lp_running()                             # the HP is idle: the LP runs
    s.set_active(hp, True)
    wait_for(s.lp_suspended, "the LP's queues to be suspended")
    assert not any(q["suspended"] for q in s.queues(s.hp))      # the HP's own queues run
    qids = {q["qid"] for q in s.queues(s.lp)}
    wait_for(lambda: set(suspended_by(s.lp.pid)) == qids, "`kfdtool queues` to name the daemon as holder")
    st = s.status(s.lp)
    assert st["suspended"] and st["suspends"] == 1 and st["level"] == 3
    s.set_active(hp, False)
    wait_for(s.lp_running, "the LP's queues to be resumed")
    wait_for(lambda: suspended_by(s.lp.pid) == {}, "the hold record to be cleared")
    for _ in range(3):                                # every request of the HP: suspend, then resume
        s.one_request(hp)
    assert s.status(s.lp)["suspends"] == 4


@pytest.mark.parametrize("setup", [("mi210", "1.17")], indirect=True)
def test_lv3_on_a_kernel_before_7_2_makes_each_call_as_the_ptrace_parent(setup):
    """Linux 6.12's kfd_ioctl_set_debug_trap admits only the target's ptrace parent for every op
    but DISABLE: the daemon still preempts, each call in a ptrace window, and leaves the LP untraced."""
    s = setup
    hp, lp = s.client(s.hp, 10), s.client(s.lp, 0)
    wait_for(lambda: s.board.read_slot(lp).level == 3, "the daemon to take the LP to Lv3",
             why=lambda: s.status(s.lp)["why"])
    assert "each call is made as it" in s.status(s.lp)["why"]
    for _ in range(3):
        s.one_request(hp)
    assert s.status(s.lp)["suspends"] == 3
    assert ptrace.tracer_of(s.lp.pid) in (0, None)
    s.daemon.send_signal(signal.SIGTERM)
    assert s.daemon.wait(timeout=20) == 0
    assert s.lp_running() and ptrace.tracer_of(s.lp.pid) in (0, None)


@pytest.mark.parametrize("setup", [("vega10", "1.23")], indirect=True)
def test_a_gpu_with_one_debug_vmid_takes_one_batch_job_at_lv3_and_the_next_when_it_leaves(setup):
    """kfd_device_queue_manager.c: reserve_debug_trap_vmid: a GPU without per-VMID debugging (GC 9
    before 9.4.2, here a Vega10) has one debug VMID, so a second debugged process's activation is
    ENABLED_BUSY (kfd_debug.c: kfd_dbg_trap_activate) and cannot be suspended. The daemon keeps that
    batch job at Lv1 and says why, preempts the one at Lv3, and takes the other to Lv3 once the
    first has gone."""
    s = setup
    env = dict(os.environ)
    second, = spawn_workers("lp-train", env=env, machine="vega10")
    try:
        hp, lp = s.client(s.hp, 10), s.client(s.lp, 0)
        wait_for(lambda: s.board.read_slot(lp).level == 3, "the first batch job at Lv3",
                 why=lambda: s.status(s.lp)["why"])
        other = s.client(second, 0)
        wait_for(lambda: "one process at a time" in s.status(second)["why"], "the second one's reason",
                 why=lambda: s.status(second)["why"])
        assert s.board.read_slot(other).level == 1
        s.one_request(hp)                                   # the first is still preempted
        assert s.status(s.lp)["suspends"] == 1
        s.lp.kill()
        s.lp.wait()
        wait_for(lambda: s.board.read_slot(other).level == 3, "the second batch job at Lv3", timeout=10,
                 why=lambda: s.status(second)["why"])
        s.set_active(hp, True)
        wait_for(lambda: all(q["suspended"] for q in s.queues(second)), "the second one suspended")
        s.set_active(hp, False)
        wait_for(lambda: not any(q["suspended"] for q in s.queues(second)), "the second one resumed")
    finally:
        second.kill()
        second.wait()


def test_daemon_killed_with_sigkill_leaves_nothing_suspended(setup):
    s = setup
    hp, lp = s.hp_holds_lp()
    s.daemon.send_signal(signal.SIGKILL)
    s.daemon.wait()
    # the kernel's debugger-exit path resumes what the dead debugger suspended
    wait_for(s.lp_running, "the kernel to resume the queues of a dead debugger")
    assert s.board.daemon_pid() == 0                  # gates fall back to Lv1 at once
    assert all(q["debugger"] is None for q in s.queues(s.lp))


def test_hp_that_exits_or_stops_while_active_releases_the_lp(setup):
    s = setup
    hp, lp = s.hp_holds_lp()
    s.hp.send_signal(signal.SIGSTOP)                  # stopped mid-request: it holds nobody
    try:
        wait_for(s.lp_running, "a stopped HP's hold to be excused", timeout=2)
    finally:
        s.hp.send_signal(signal.SIGCONT)
    s.board.set_active(hp, False)
    s.set_active(hp, True)                            # a new request of the same HP counts again
    wait_for(s.lp_suspended, "suspend after SIGCONT")
    s.hp.kill()                                       # exits mid-request
    s.hp.wait()
    wait_for(s.lp_running, "resume after the HP died")
    wait_for(lambda: s.board.read_slot(hp).pid == 0, "the dead HP's slot to be released")


def test_lp_that_exits_while_suspended_and_daemon_stop_resume_everything(setup):
    s = setup
    hp, lp = s.hp_holds_lp()
    s.daemon.send_signal(signal.SIGTERM)              # a clean stop resumes before it exits
    _, err = s.daemon.communicate(timeout=10)
    assert s.daemon.returncode == 0 and "Traceback" not in err, err
    assert s.lp_running()
    assert suspended_by(s.lp.pid) == {}
    assert s.board.daemon_pid() == 0


def test_a_client_leaving_under_lv3_shuts_its_runtime_down_and_exits(setup):
    """A program that returns from main shuts its GPU runtime down (ROCr's hsa_shut_down: its
    queues destroyed, then RUNTIME_ENABLE off). With the daemon as its debugger the kernel makes
    both wait: the destroy of a suspended queue until the daemon resumes it (the HP's request
    ends), the runtime call until the daemon answers EC_PROCESS_RUNTIME (within RUNTIME_POLL_S).
    Without that answer the program would sleep in the kernel for good."""
    s = setup
    hp, lp = s.hp_holds_lp()
    s.lp.send_signal(signal.SIGUSR1)                  # the LP's main returns while it is suspended
    time.sleep(0.3)
    assert s.lp.poll() is None                        # its queues' destroy waits for the resume
    s.set_active(hp, False)
    assert s.lp.wait(timeout=5) == 0
    wait_for(lambda: s.board.read_slot(lp).pid == 0, "the exited LP's slot to be released")


def test_status_cli_shows_level_state_and_why(setup):
    s = setup
    hp, lp = s.hp_holds_lp()
    out = subprocess.run([sys.executable, "-m", "xsched_lv3", "status", "--json"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    clients = {c["pid"]: c for c in json.loads(out.stdout)["clients"]}
    assert clients[s.lp.pid]["level"] == 3 and clients[s.lp.pid]["suspended"]
    assert clients[s.hp.pid]["active"] and not clients[s.hp.pid]["suspended"]
    table = subprocess.run([sys.executable, "-m", "xsched_lv3", "status"], capture_output=True, text=True, timeout=30)
    line = next(ln for ln in table.stdout.splitlines() if ln.split()[:1] == [str(s.lp.pid)])
    assert "Lv3" in line and "suspended" in line and "DBG_TRAP" in line
    # SUSPENDS and SUSP_S count what the daemon did: one more suspend of 0.2 s, the total in between
    held_for = 0.2
    time.sleep(held_for)
    s.set_active(hp, False)
    wait_for(s.lp_running, "resume")
    wait_for(lambda: not s.status(s.lp)["suspended"], "the resume on the board")
    before = s.status(s.lp)
    begun = time.monotonic()
    s.set_active(hp, True)
    wait_for(s.lp_suspended, "suspend")
    time.sleep(held_for)
    s.set_active(hp, False)
    wait_for(lambda: s.status(s.lp)["suspends"] == before["suspends"] + 1 and not s.status(s.lp)["suspended"],
             "the second suspend and its resume on the board")
    after, took = s.status(s.lp), time.monotonic() - begun
    assert held_for <= after["suspended_s"] - before["suspended_s"] <= took, (before, after, took)
    assert after["held_s"] == 0.0                      # at Lv3 its gate never held it


class FakeMechanism:
    """Stands in for DebugTrapSuspend: records calls; a suspend "takes" `switch_s` of wall time."""
    calls = []
    runtime_events = set()                # pids whose runtime turned off or on, not yet answered
    runtime_state = kfd_dbg_runtime_state.DEBUG_RUNTIME_STATE_ENABLED
    ptrace_each_call = False              # a 7.2 kernel: no ptrace window after ENABLE

    live_queues = [0, 1]                  # the target's queues now (a test may add one)

    def __init__(self, kfd, pid, read_wave_state=True):
        self.pid = pid
        self.snapshot = []                # the queue list as of the last queues() (GET_QUEUE_SNAPSHOT)

    def answer_runtime_event(self):
        if self.pid in FakeMechanism.runtime_events:
            FakeMechanism.runtime_events.discard(self.pid)
            FakeMechanism.calls.append(("answer", self.pid))
            return True
        return False

    def known_queues(self):
        return list(self.snapshot)

    def suspend(self, qids=None, grace_period=None):
        from kfdtool.cwsr.mechanisms import MechanismResult, QueueOutcome
        FakeMechanism.calls.append(("suspend", self.pid))
        FakeMechanism.grace_periods.append(grace_period)
        time.sleep(0.002)
        return MechanismResult([QueueOutcome(q, "suspended") for q in (qids or self.queues())])

    def resume(self, qids=None):
        FakeMechanism.calls.append(("resume", self.pid))

    # what the engine makes: nothing to send to a KFD, the work done when "made"
    def suspend_call(self, qids=None, grace_period=None):
        return PreparedCall(None, lambda: self.suspend(qids, grace_period))

    def resume_call(self, qids=None):
        return PreparedCall(None, lambda: self.resume(qids))

    def queues(self, clear_new=True):
        self.snapshot = list(FakeMechanism.live_queues)
        return self.snapshot

    def close(self):
        FakeMechanism.calls.append(("close", self.pid))


@pytest.fixture
def fake_engine(tmp_path, monkeypatch):
    """An Lv3Engine over a private board whose mechanism is FakeMechanism (calls recorded), and
    two live processes to put on the board; yields (board, make_engine, proc_a, proc_b)."""
    import xsched_lv3.lv3 as lv3
    from xsched_lv3.policy import make_policy
    monkeypatch.setattr(lv3, "DebugTrapSuspend", FakeMechanism)
    monkeypatch.setenv("KFDTOOL_RUN_DIR", str(tmp_path / "run"))
    FakeMechanism.calls = []
    FakeMechanism.grace_periods = []
    FakeMechanism.live_queues = [0, 1]
    FakeMechanism.runtime_events = set()

    class Host:
        kfd, grace_period, lost = object(), 1, False

        def level_for(self, pid):
            return lv3.LV3, "Lv3: fake"

        def is_kfd_process(self, pid):
            return True
    board = Board(tmp_path / "board")
    procs = [subprocess.Popen(["sleep", "30"]) for _ in range(2)]
    yield board, (lambda: lv3.Lv3Engine(board, Host(), make_policy("hpf"), log=lambda *_: None)), *procs
    for proc in procs:
        proc.kill()
        proc.wait()
    board.close()


def hp_and_lp(fake_engine, now, hp_priority=10):
    """fake_engine's two processes on the board, the first above the second, and an engine that has
    synced once at `now`. Returns (board, engine, hp slot, lp slot, hp process, lp process)."""
    board, make_engine, hp_proc, lp_proc = fake_engine
    hp = board.allocate(hp_proc.pid, hp_priority, 0, DEVICE)
    lp = board.allocate(lp_proc.pid, 0, 0, DEVICE)
    engine = make_engine()
    engine.sync(now=now)
    return board, engine, hp, lp, hp_proc, lp_proc


def test_hysteresis_keeps_a_returning_hp_from_causing_a_resume_suspend_pair(fake_engine):
    """After the HP goes idle, the LP stays suspended for as long as its last suspend + resume took;
    an HP back within that time costs no switch, one back later gets a resume and a new suspend."""
    board, engine, hp, lp, hp_proc, lp_proc = hp_and_lp(fake_engine, now=100.0)
    assert board.read_slot(lp).level == 3 and FakeMechanism.calls == []     # attached, not suspended
    board.set_active(hp, True)
    engine.sync(now=100.001)
    assert FakeMechanism.calls == [("suspend", lp_proc.pid)]
    switch_s = engine.clients[lp].switch_s
    assert switch_s >= 0.002
    board.set_active(hp, False)
    wake_at = engine.sync(now=100.010)                 # idle: resume is put off by the switch cost
    assert wake_at == pytest.approx(100.010 + switch_s) and len(FakeMechanism.calls) == 1
    board.set_active(hp, True)                        # back within it: still suspended, no calls
    engine.sync(now=100.010 + switch_s / 2)
    assert len(FakeMechanism.calls) == 1 and engine.clients[lp].suspended_at is not None
    board.set_active(hp, False)
    engine.sync(now=100.020)
    assert engine.sync(now=100.020 + switch_s + 1e-6) is None     # later: resumed
    assert FakeMechanism.calls[-1] == ("resume", lp_proc.pid)
    engine.close()
    assert FakeMechanism.calls[-1] == ("close", lp_proc.pid)


def test_a_client_whose_runtime_turns_off_is_answered_and_given_back_to_its_gate(fake_engine):
    """A target turning its GPU runtime off or on sleeps in the kernel until its debugger answers
    (kfd_chardev.c: runtime_disable / runtime_enable): the engine asks every RUNTIME_POLL_S,
    answers, and releases the client to its gate (its queues cannot be suspended meanwhile)."""
    import xsched_lv3.lv3 as lv3
    board, engine, _, lp, _, lp_proc = hp_and_lp(fake_engine, now=100.0)
    assert board.read_slot(lp).level == 3
    FakeMechanism.runtime_events.add(lp_proc.pid)
    engine.sync(now=100.0 + lv3.RUNTIME_POLL_S / 2)
    assert FakeMechanism.runtime_events                   # not asked yet: at most every RUNTIME_POLL_S
    engine.sync(now=100.0 + lv3.RUNTIME_POLL_S)
    assert FakeMechanism.calls[-2:] == [("answer", lp_proc.pid), ("close", lp_proc.pid)]
    assert board.read_slot(lp).level == 1 and "runtime" in engine.describe(lp)["why"]
    engine.close()


def test_a_kernel_that_refuses_even_the_ptrace_parent_leaves_clients_at_lv1_for_good(fake_engine, monkeypatch):
    """The mechanism makes an op refused with EPERM again as the target's ptrace parent (kernels
    before 7.2 admit only it); one refused even so, seen at attach (the queue snapshot), leaves the
    client at Lv1 with that reason, once, instead of flapping between Lv3 and failed suspends."""
    from kfdtool import errors
    board, make_engine, hp_proc, lp_proc = fake_engine

    def refused(self, clear_new=True):
        FakeMechanism.calls.append(("snapshot", self.pid))
        raise errors.PermissionDenied("DBG_TRAP", 1, "not the ptrace parent", op="GET_QUEUE_SNAPSHOT")
    monkeypatch.setattr(FakeMechanism, "queues", refused)
    board.allocate(hp_proc.pid, 10, 0, DEVICE)
    lp = board.allocate(lp_proc.pid, 0, 0, DEVICE)
    engine = make_engine()
    for t in range(5):
        engine.sync(now=100.0 + t)
    assert board.read_slot(lp).level == 1 and "ptrace parent" in engine.describe(lp)["why"]
    assert FakeMechanism.calls == [("snapshot", lp_proc.pid), ("close", lp_proc.pid)]     # asked once
    engine.close()


def test_the_trace_times_a_suspend_from_the_activation_on_its_own_gpu(fake_engine, tmp_path):
    """`daemon --trace`: each suspend says how long after the activation it serves it started (the
    daemon's lag), counted from a client above it on its GPU, not from one on another GPU, and of
    that how long until the daemon's loop woke."""
    import re
    board, make_engine, hp_proc, lp_proc = fake_engine
    other = subprocess.Popen(["sleep", "30"])
    try:
        hp = board.allocate(hp_proc.pid, 10, 0, DEVICE)
        board.allocate(lp_proc.pid, 0, 0, DEVICE)
        elsewhere = board.allocate(other.pid, 10, 0, DEVICE + 1)
        engine = make_engine()
        engine.trace = (tmp_path / "trace").open("w")
        engine.sync()
        board.set_active(hp, True)
        time.sleep(0.05)
        board.set_active(elsewhere, True)           # later, on another GPU: not what the LP yields to
        engine.woken_at = time.monotonic()          # as the daemon's loop marks it on waking
        engine.sync()
        engine.close()
        line = (tmp_path / "trace").read_text()
        found = re.search(r"suspend pid %d took \d+ us (\d+) us after the activation \(woken after (\d+) us\)"
                          % lp_proc.pid, line)
        assert found, line
        lag_us, woken_us = int(found.group(1)), int(found.group(2))
        assert 50_000 <= woken_us <= lag_us < 5_000_000, line
        summary = subprocess.run([sys.executable, str(REPO / "scripts" / "daemon_trace_summary.py"),
                                  str(tmp_path / "trace")], capture_output=True, text=True, timeout=60)
        assert summary.returncode == 0, summary.stderr
        assert re.search(r"suspend lag after the activation +n= +1 +p50 +%d " % lag_us, summary.stdout), summary.stdout
        assert re.search(r"of which until the daemon woke +n= +1 +p50 +%d " % woken_us, summary.stdout), summary.stdout
    finally:
        other.kill()
        other.wait()


def test_the_trace_summary_says_how_long_each_client_stayed_suspended(tmp_path):
    """From a suspend call's start to the next resume call's start for its pid (each takes effect from
    its start), and the share of that pid's traced span its queues spent suspended."""
    import re
    (tmp_path / "trace").write_text(
        "10.000000 suspend pid 7 took 900 us 300 us after the activation queues [0]\n"
        "10.000000 suspend pid 8 took 900 us 300 us after the activation queues [0]\n"
        "10.003000 resume pid 7 took 200 us\n"
        "10.005000 resume pid 8 took 200 us\n"
        "10.050000 suspend pid 7 took 900 us 300 us after the activation queues [0]\n"
        "10.054000 resume pid 7 took 200 us\n")
    summary = subprocess.run([sys.executable, str(REPO / "scripts" / "daemon_trace_summary.py"),
                              str(tmp_path / "trace")], capture_output=True, text=True, timeout=60)
    assert summary.returncode == 0, summary.stderr
    assert re.search(r"suspended for \(suspend to resume\) +n= +3 +p50 +4000 ", summary.stdout), summary.stdout
    # pid 7: 3 + 4 ms of its 54 ms; pid 8: 5 ms of its 5 ms
    assert "suspended share of its traced span pid 7 0.130, pid 8 1.000" in summary.stdout, summary.stdout


@pytest.mark.parametrize("planted", ["file", "shared directory"])
def test_a_records_directory_another_user_could_have_planted_costs_only_the_record(fake_engine, tmp_path, planted):
    """The hold records' directory has a predictable name: one that is a file, or a directory others
    may write, is refused for the record (nothing written there), and the LP is still suspended and
    resumed at Lv3. Before, the refusal (not an OSError) stopped Lv3 for the daemon's whole life."""
    run = tmp_path / "run"
    if planted == "file":
        run.write_text("x")
    else:
        run.mkdir()
        run.chmod(0o777)
    board, engine, hp, lp, hp_proc, lp_proc = hp_and_lp(fake_engine, now=100.0)
    for step in range(2):                              # a second suspend tries the record again
        board.set_active(hp, True)
        engine.sync(now=100.0 + step + 0.001)
        assert engine.clients[lp].suspended_at is not None and board.read_slot(lp).level == 3
        board.set_active(hp, False)
        engine.sync(now=100.0 + step + 0.5)            # (the hysteresis puts the resume off a little)
        engine.sync(now=100.0 + step + 0.9)
        assert engine.clients[lp].suspended_at is None
    assert [c for c, _ in FakeMechanism.calls] == ["suspend", "resume"] * 2
    assert run.is_file() if planted == "file" else list(run.iterdir()) == []
    engine.close()


def test_an_hp_suspends_only_the_lower_clients_on_its_own_gpu(fake_engine):
    """Highest priority per device: a busy HP on one GPU leaves a lower client on another GPU alone
    (not even attached: nobody above it shares its GPU), and suspends the one on its own GPU."""
    board, make_engine, hp_proc, lp_proc = fake_engine
    other_gpu_proc = subprocess.Popen(["sleep", "30"])
    try:
        hp = board.allocate(hp_proc.pid, 10, 0, DEVICE)
        lp = board.allocate(lp_proc.pid, 0, 0, DEVICE)
        elsewhere = board.allocate(other_gpu_proc.pid, 0, 0, DEVICE + 1)
        engine = make_engine()
        engine.sync(now=100.0)
        board.set_active(hp, True)
        engine.sync(now=100.001)
        assert FakeMechanism.calls == [("suspend", lp_proc.pid)]
        assert board.read_slot(elsewhere).level == 1 and engine.clients[elsewhere].mech is None
        assert engine.clients[elsewhere].why == "never preempted: nobody above it on its GPU"
        engine.close()
    finally:
        other_gpu_proc.kill()
        other_gpu_proc.wait()


def test_a_daemon_not_run_by_root_never_attaches_another_users_process(fake_engine, monkeypatch):
    """The daemon preempts only its own user's processes unless it runs as root (it would need ptrace
    rights anyway): one of another uid on the board stays at Lv1 and says why."""
    import xsched_lv3.lv3 as lv3
    board, make_engine, hp_proc, lp_proc = fake_engine
    monkeypatch.setattr(lv3.os, "geteuid", lambda: 4242)
    monkeypatch.setattr(lv3, "_owner", lambda pid: 4243 if pid == lp_proc.pid else 4242)
    hp = board.allocate(hp_proc.pid, 10, 0, DEVICE)
    lp = board.allocate(lp_proc.pid, 0, 0, DEVICE)
    engine = make_engine()
    engine.sync(now=100.0)
    board.set_active(hp, True)
    engine.sync(now=100.001)
    assert FakeMechanism.calls == [] and board.read_slot(lp).level == 1
    assert engine.clients[lp].why == f"Lv1: pid {lp_proc.pid} is not ours"
    engine.close()


def test_a_queue_created_after_a_suspend_is_suspended_from_the_next_one_on(fake_engine):
    """The queue list is taken again after each resume (off the hot path): a queue the LP created
    since is in its next suspend, which passes the host's grace period."""
    board, engine, hp, lp, hp_proc, lp_proc = hp_and_lp(fake_engine, now=100.0)
    for step, expected in enumerate(([0, 1], [0, 1, 2])):
        board.set_active(hp, True)
        engine.sync(now=100.0 + step + 0.001)
        assert engine.clients[lp].queues == tuple(expected)
        FakeMechanism.live_queues = [0, 1, 2]          # created while suspended
        board.set_active(hp, False)
        engine.sync(now=100.0 + step + 0.5)
        engine.sync(now=100.0 + step + 0.9)
        assert engine.clients[lp].suspended_at is None
    assert FakeMechanism.grace_periods == [1, 1]
    engine.close()


def test_an_hp_whose_requests_are_far_apart_gets_its_lp_resumed_at_once(fake_engine):
    """The hysteresis pays only where the HP comes straight back: once its idle gaps are known to be
    longer than a switch, the LP is resumed as soon as the HP goes idle (it would otherwise lose the
    hysteresis after every request); once the HP keeps coming back within one, the LP waits again."""
    from xsched_lv3.policy import GAP_HISTORY, hold_for
    assert hold_for(0.002, []) == 0.002                         # nothing known yet: wait
    assert hold_for(0.002, [0.050] * 8) == 0.0                  # far apart: resume at once
    assert hold_for(0.002, [0.0005] * 8) == 0.002               # straight back: wait
    assert hold_for(0.002, [0.050] * 6 + [0.0005] * 2) == 0.0   # rarely back soon: a switch is cheaper
    board, engine, hp, lp, hp_proc, lp_proc = hp_and_lp(fake_engine, now=100.0)
    t = 100.0
    for k in range(4):                                # requests 50 ms apart
        board.set_active(hp, True)
        engine.sync(now=t + 0.001)
        assert engine.clients[lp].suspended_at is not None
        board.set_active(hp, False)
        engine.sync(now=t + 0.004)
        if k == 0:                                    # no gap seen yet: it waits the switch time
            assert engine.clients[lp].suspended_at is not None
            engine.sync(now=t + 0.004 + engine.clients[lp].switch_s + 1e-6)
        assert engine.clients[lp].suspended_at is None, f"request {k}: still suspended"
        t += 0.050
    for _ in range(GAP_HISTORY):                      # now it comes straight back, again and again
        board.set_active(hp, True)
        engine.sync(now=t + 0.001)
        board.set_active(hp, False)
        engine.sync(now=t + 0.0011)
        t += 0.0012
    assert engine.clients[lp].suspended_at is not None and engine.clients[lp].release_at > t
    engine.close()


def test_the_lower_clients_are_suspended_back_to_back_in_one_round_trip(fake_engine, monkeypatch):
    """SUSPEND_QUEUES names one process, so three lower clients take three calls: prepared first,
    then made back to back through one KfdDevice.ioctls (one round trip to a simulated KFD, where
    threads cost each call a wake-up), and all three are resumed the same way once it is idle."""
    board, make_engine, hp_proc, lp_proc = fake_engine
    others = [subprocess.Popen(["sleep", "30"]) for _ in range(2)]
    rounds = []

    class Kfd:
        def ioctls(self, calls):
            rounds.append([arg for _, arg in calls])
            return [0] * len(calls)

    def call(op):
        def prepare(self, qids=None, grace_period=None):
            done = getattr(FakeMechanism, op)
            return PreparedCall((op, self.pid), lambda: done(self, qids) if op == "resume" else
                                done(self, qids, grace_period))
        return prepare
    monkeypatch.setattr(FakeMechanism, "suspend_call", call("suspend"))
    monkeypatch.setattr(FakeMechanism, "resume_call", call("resume"))
    try:
        hp = board.allocate(hp_proc.pid, 10, 0, DEVICE)
        lps = [board.allocate(p.pid, 0, 0, DEVICE) for p in (lp_proc, *others)]
        lp_pids = sorted(p.pid for p in (lp_proc, *others))
        engine = make_engine()
        engine.host.kfd = Kfd()
        engine.sync(now=100.0)
        board.set_active(hp, True)
        engine.sync(now=100.001)
        assert all(engine.clients[lp].suspended_at is not None for lp in lps)
        assert len(rounds) == 1 and sorted(pid for op, pid in rounds[0] if op == "suspend") == lp_pids
        board.set_active(hp, False)
        engine.sync(now=200.0)          # idle: the resumes are due after the hysteresis
        engine.sync(now=201.0)
        assert all(engine.clients[lp].suspended_at is None for lp in lps)
        assert len(rounds) == 2 and sorted(pid for op, pid in rounds[1] if op == "resume") == lp_pids
        engine.close()
    finally:
        for proc in others:
            proc.kill()
            proc.wait()


def xsched(*args):
    return subprocess.run([sys.executable, "-m", "xsched_lv3", *args], capture_output=True, text=True, timeout=60)


def test_attach_an_uninstrumented_process_and_detach_it(setup):
    """`xsched-lv3 attach`: a running process with no gate (here a bare simulated GPU process) is
    suspended while a higher-priority client is active; `detach` resumes it and lets it go."""
    s = setup
    gpu = s.queues(s.lp)[0]["gpu_id"]
    out = xsched("attach", "--pid", str(s.lp.pid), "--priority", "0", "--device", str(gpu))
    assert out.returncode == 0 and "attached at priority 0; Lv3" in out.stdout, out.stderr
    assert s.board.read_slot(next(i for i, x in s.board.slots() if x.pid == s.lp.pid)).level == 3
    again = xsched("attach", "--pid", str(s.lp.pid))
    assert again.returncode == 1 and "already scheduled" in again.stderr
    from xsched_lv3.board import kfd_device_key
    hp = s.board.allocate(s.hp.pid, 10, 0, kfd_device_key(gpu))        # an instrumented HP (its gate)
    s.set_active(hp, True)
    wait_for(s.lp_suspended, "the attached LP to be suspended")
    status = subprocess.run([sys.executable, "-m", "xsched_lv3", "status"], capture_output=True, text=True, timeout=30)
    line = next(ln for ln in status.stdout.splitlines() if ln.split()[:1] == [str(s.lp.pid)])
    assert "attached" in line and "suspended" in line
    out = xsched("detach", "--pid", str(s.lp.pid))
    assert out.returncode == 0, out.stderr
    wait_for(s.lp_running, "detach to resume the LP while the HP is still active")
    assert all(q["debugger"] is None for q in s.queues(s.lp))
    assert all(x.pid != s.lp.pid for _, x in s.board.slots())
    out = xsched("detach", "--pid", str(s.lp.pid))
    assert out.returncode == 1 and "is not attached" in out.stderr


def test_attach_is_refused_where_lv3_cannot_reach_the_process(setup):
    s = setup
    sleeper = subprocess.Popen(["sleep", "30"])                    # no KFD process: nothing to suspend
    try:
        out = xsched("attach", "--pid", str(sleeper.pid))
        assert out.returncode == 1 and "cannot attach" in out.stderr and len(out.stderr.splitlines()) == 1
        assert "not a KFD process" in out.stderr
        assert all(x.pid != sleeper.pid for _, x in s.board.slots())   # nothing left behind
        # and it is still no KFD process: ENABLE by a ptrace parent would have made it one
        assert not (SysfsRoot(s.sim.sysfs_root).proc / str(sleeper.pid)).exists()
    finally:
        sleeper.kill()
        sleeper.wait()
    for bad, needle in ((["--pid", "0"], "pid must be"), (["--pid", "999999999"], "pid must be"),
                        (["--pid", "1"], "permission denied"), (["--pid", str(s.lp.pid), "--device", "-3"], "device"),
                        (["--pid", str(s.lp.pid), "--device", "99999"], "is not a gpu_id of this host")):
        out = xsched("attach", *bad)
        if os.geteuid() == 0 and bad == ["--pid", "1"]:
            assert out.returncode == 1 and "cannot attach" in out.stderr     # root may, but init has no KFD
            continue
        assert out.returncode == 1 and needle in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_a_new_daemon_releases_processes_attached_to_one_killed_with_sigkill(setup, tmp_path):
    """kill -9 leaves the attached slots on the board (their daemon wrote them, nothing inside the
    processes does); the next daemon releases them instead of adopting an attachment it was not
    asked for, and nothing is suspended."""
    s = setup
    s.hp_holds_attached_lp()
    s.daemon.send_signal(signal.SIGKILL)
    s.daemon.wait()
    wait_for(s.lp_running, "the kernel to resume the queues of a dead debugger")
    assert any(x.pid == s.lp.pid and x.attached for _, x in s.board.slots())
    env = dict(os.environ)
    second = subprocess.Popen([sys.executable, "-m", "xsched_lv3", "daemon", "--sim", "mi308x"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([second.stdout], [], [], 20)
        assert ready and "Lv3 through simulated mi308x" in second.stdout.readline()
        wait_for(lambda: all(x.pid != s.lp.pid for _, x in s.board.slots()), "the stale attachment to be released")
        time.sleep(0.2)
        assert s.lp_running()
        assert xsched("attach", "--pid", str(s.lp.pid)).returncode == 0      # may be attached again
    finally:
        second.send_signal(signal.SIGTERM)
        _, err = second.communicate(timeout=10)
    assert "attached to a daemon that is gone" in err and "Traceback" not in err, err


def test_attach_leaves_a_process_whose_gpu_runtime_is_off_at_lv1(setup):
    """A KFD process whose runtime is off (not a ROCr process, or shutting down) can be debug-enabled
    but not suspended (SUSPEND_QUEUES is EPERM): the daemon says so and keeps it at Lv1 instead of
    announcing Lv3 and failing at the first suspend."""
    worker = subprocess.Popen([sys.executable, "-m", "kfdtool.sim.workload", "--sim", "mi308x", "--role", "no-rocr",
                               "--queues", "1", "--no-runtime-enable"], stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout.readline().startswith("ready")
        out = xsched("attach", "--pid", str(worker.pid))
        assert out.returncode == 1 and "runtime is not on" in out.stderr, out.stderr
        assert len(out.stderr.splitlines()) == 1
        assert all(q["debugger"] is None for q in setup.queues(worker))      # let go again
    finally:
        worker.kill()
        worker.wait()


def test_a_stopping_daemon_resumes_and_releases_attached_processes(setup):
    s = setup
    s.hp_holds_attached_lp()
    s.daemon.send_signal(signal.SIGTERM)
    _, err = s.daemon.communicate(timeout=10)
    assert s.daemon.returncode == 0 and "Traceback" not in err, err
    assert s.lp_running() and all(x.pid != s.lp.pid for _, x in s.board.slots())


class InstantGPU:
    """A recorder whose GPU work is always done (the gate's modes, not its timing, are tested)."""

    def record(self):
        return 1

    def done(self, handle):
        return True

    def wait(self, handle):
        pass

    def device_key(self):
        return DEVICE


def test_a_gate_at_lv3_gates_again_once_its_daemon_is_gone(tmp_path, monkeypatch):
    """The board says Lv3 (the daemon suspends this client), so its gate does not gate; the daemon
    dies (kill -9: nothing is written): within DAEMON_CHECK_S the gate is back on its Lv1 gate."""
    from xsched_lv3.gate import DAEMON_CHECK_S, Gate
    monkeypatch.setenv("XSCHED_LV3_SOCKET", str(tmp_path / "none.sock"))
    board = Board(tmp_path / "board")
    fake_daemon = subprocess.Popen(["sleep", "30"])
    try:
        hp = board.allocate(os.getpid() + 0, 10, 1, DEVICE)   # another client above (its tid tells it apart)
        board.set_active(hp, True)
        board.set_daemon(fake_daemon.pid)
        lp = Gate(InstantGPU(), priority=0, window_us=500, board=board)
        board.write(lp.slot, level=3)                         # what the daemon writes once it holds our queues
        lp.begin_request()
        lp.end_request()
        assert lp.level == 3 and not lp.guarded               # Lv3: no per-launch gate
        fake_daemon.kill()
        fake_daemon.wait()
        time.sleep(DAEMON_CHECK_S * 1.5)
        lp.begin_request()
        assert lp.level == 1 and lp.guarded                   # gated again, though nothing wrote the board
        lp.end_request()
        lp.close()
    finally:
        if fake_daemon.poll() is None:
            fake_daemon.kill()
        board.close()


def test_a_reused_or_stopped_daemon_pid_is_no_daemon(tmp_path):
    board = Board(tmp_path / "board")
    proc = subprocess.Popen(["sleep", "30"])
    try:
        board.set_daemon(proc.pid)
        assert board.daemon_pid() == proc.pid
        from xsched_lv3.board import DAEMON, DAEMON_OFFSET
        pid, pad, started = DAEMON.unpack_from(board.mm, DAEMON_OFFSET)
        DAEMON.pack_into(board.mm, DAEMON_OFFSET, pid, pad, started + 1)   # the pid now names another process
        assert board.daemon_pid() == 0
        board.set_daemon(proc.pid)
        proc.send_signal(signal.SIGSTOP)                                   # Ctrl-Z'd: it holds nothing now
        wait_for(lambda: board.daemon_pid() == 0, "a stopped daemon to count as none")
        proc.send_signal(signal.SIGCONT)
        wait_for(lambda: board.daemon_pid() == proc.pid, "a resumed daemon to count again")
    finally:
        proc.kill()
        proc.wait()
        board.close()


def test_a_process_that_gains_a_second_client_leaves_lv3(fake_engine):
    """Its queues are now also another client's (maybe a higher-priority thread of it): the daemon
    lets go of the process (resumed, debugger gone) and its gates take over."""
    board, engine, _, lp, _, proc = hp_and_lp(fake_engine, now=10.0, hp_priority=5)
    assert board.read_slot(lp).level == 3
    top = board.allocate(proc.pid, 10, 1234, DEVICE)          # a thread of the same process, on top
    board.set_active(top, True)
    engine.sync(now=10.1)
    assert ("close", proc.pid) in FakeMechanism.calls and ("suspend", proc.pid) not in FakeMechanism.calls
    assert board.read_slot(lp).level == 1 and "clients in pid" in engine.describe(lp)["why"]


def test_the_daemon_ignores_ctrl_z(setup):
    s = setup
    s.daemon.send_signal(signal.SIGTSTP)
    time.sleep(0.2)
    from kfdtool.pids import stopped
    assert not stopped(s.daemon.pid)
    assert request({"op": "status"}, s.sock)["ok"]


def test_a_slot_taken_by_a_new_client_is_not_released_for_its_old_owner(tmp_path):
    """A reaper (a gate, the daemon's pidfd) saw pid A dead in slot 0; meanwhile slot 0 went to B.
    Releasing "slot 0 of A" must leave B's slot alone (B would otherwise run unscheduled)."""
    board = Board(tmp_path / "board")
    slot = board.allocate(os.getpid(), 3)
    assert not board.release(slot, pid=os.getpid() + 1_000_000)       # not its owner any more
    assert board.read_slot(slot).pid == os.getpid()
    assert board.release(slot, pid=os.getpid()) and board.read_slot(slot).pid == 0
    board.close()


def test_an_attached_hp_is_seen_busy_from_its_queue_pointers(setup, tmp_path):
    """Neither process has a scheduler inside: the HP is a plain simulated GPU program. The daemon
    reads its queues' read and write pointers; while it has packets outstanding, the attached LP is
    suspended, and it runs again once they are retired."""
    s = setup
    env = dict(os.environ)
    hp = subprocess.Popen([sys.executable, "-c", """
import sys, time
from kfdtool.sim.hip import SimHip, SimModel
hip = SimHip("mi308x"); s = hip.stream()
model = SimModel(hip, [(20000.0, 64)] * 10)            # 200 ms of work, launched at once
hip.synchronize(model(s))                              # warm: queue created
print("ready", flush=True); sys.stdin.readline()
t0 = time.monotonic(); hip.synchronize(model(s)); print(time.monotonic() - t0, flush=True)
sys.stdin.readline()
"""], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert hp.stdout.readline().strip() == "ready"
        gpu = s.queues(s.lp)[0]["gpu_id"]
        assert xsched("attach", "--pid", str(s.lp.pid), "--priority", "0", "--device", str(gpu)).returncode == 0
        out = xsched("attach", "--pid", str(hp.pid), "--priority", "10", "--device", str(gpu))
        assert out.returncode == 0, out.stderr
        time.sleep(0.1)
        assert s.lp_running()                                  # the HP is idle: nothing outstanding
        hp.stdin.write("go\n")
        hp.stdin.flush()
        wait_for(s.lp_suspended, "the LP to be suspended while the attached HP has work", timeout=2)
        assert float(hp.stdout.readline()) >= 0.19             # the HP's 200 ms of work ran
        wait_for(s.lp_running, "the LP to run again once the HP's packets are retired", timeout=2)
    finally:
        hp.kill()
        hp.wait()


def test_attached_processes_never_stay_suspended(setup):
    """kill -9 of the HP holding an attached LP suspended, and of the daemon: nothing stays
    suspended, and the slots go. (An attached HP's activity is the daemon's to write: see the
    pointer test.)"""
    s = setup
    s.hp_holds_attached_lp()
    s.hp.kill()                                        # the HP dies busy
    s.hp.wait()
    wait_for(s.lp_running, "resume after the attached HP died")
    wait_for(lambda: all(x.pid != s.hp.pid for _, x in s.board.slots()), "the dead HP's slot to go")
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        other = s.client(sleeper, 10)
        s.set_active(other, True)
        wait_for(s.lp_suspended, "suspend again")
        s.daemon.send_signal(signal.SIGKILL)
        s.daemon.wait()
        wait_for(s.lp_running, "the kernel to resume the attached LP of a killed daemon")
        assert all(q["debugger"] is None for q in s.queues(s.lp))
    finally:
        sleeper.kill()
        sleeper.wait()


def test_an_attached_lp_killed_while_suspended_costs_the_daemon_nothing(setup):
    s = setup
    s.hp_holds_attached_lp()
    s.lp.kill()
    s.lp.wait()
    wait_for(lambda: all(x.pid != s.lp.pid for _, x in s.board.slots()), "the dead LP's slot to go")
    assert request({"op": "status"}, s.sock)["ok"] and s.daemon.poll() is None


def test_an_attached_hp_killed_while_busy_releases_the_attached_lp(setup):
    s = setup
    hp = subprocess.Popen([sys.executable, "-c", """
import sys
from kfdtool.sim.hip import SimHip, SimModel
hip = SimHip("mi308x"); s = hip.stream()
hip.synchronize(SimModel(hip, [(100.0, 64)])(s))
print("ready", flush=True); sys.stdin.readline()
SimModel(hip, [(1_000_000.0, 64)])(s); hip.flush()     # 1 s of work outstanding
print("launched", flush=True); sys.stdin.readline()
"""], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert hp.stdout.readline().strip() == "ready"
        assert xsched("attach", "--pid", str(s.lp.pid)).returncode == 0
        assert xsched("attach", "--pid", str(hp.pid), "--priority", "10").returncode == 0
        hp.stdin.write("go\n")
        hp.stdin.flush()
        assert hp.stdout.readline().strip() == "launched"
        wait_for(s.lp_suspended, "the attached HP's outstanding work to suspend the LP")
        hp.kill()                                         # dies with its work outstanding
        hp.wait()
        wait_for(s.lp_running, "the LP to run once the busy attached HP is gone")
        wait_for(lambda: all(x.pid != hp.pid for _, x in s.board.slots()), "the dead HP's slot to go")
    finally:
        if hp.poll() is None:
            hp.kill()
            hp.wait()


def test_where_sysfs_pids_are_not_ours_the_kfd_process_check_defers_to_enable(tmp_path):
    """sysfs names KFD processes by host pid; in a container's pid namespace the daemon's own pid is
    not there, and the check must not keep every client at Lv1."""
    from xsched_lv3.lv3 import Host

    class Kfd:
        def close(self):
            pass
    procs = tmp_path / "class" / "kfd" / "kfd" / "proc"
    (procs / "4242").mkdir(parents=True)
    assert Host(Kfd, sysfs_root=tmp_path).is_kfd_process(999999)      # our own pid is missing: can't tell
    (procs / str(os.getpid())).mkdir()
    host = Host(Kfd, sysfs_root=tmp_path)
    assert host.is_kfd_process(4242) and not host.is_kfd_process(999999)


def test_a_restarted_simulator_is_reconnected_and_its_new_processes_reach_lv3(setup, tmp_path):
    """`kfdtool sim stop` + `start` under a running daemon: the daemon's connection to the old server
    is dead (its calls fail with a broken pipe), so it opens the new one and takes the new processes
    to Lv3, instead of leaving every later client at Lv1 until it is restarted."""
    s = setup
    for proc in (s.hp, s.lp):
        proc.kill()
        proc.wait()
    from kfdtool.sim import runner
    runner.stop("mi308x")
    sim = start("mi308x")
    workers = []
    try:
        workers = spawn_workers("hp-serve", "lp-train")
        s.sim, s.ctl = sim, sim.control()
        s.hp, s.lp = workers
        hp, lp = s.client(s.hp, 10), s.client(s.lp, 0)
        wait_for(lambda: s.board.read_slot(lp).level == 3, "the new LP to reach Lv3", timeout=10,
                 why=lambda: s.status(s.lp)["why"])
        s.one_request(hp)
        assert s.daemon.poll() is None
    finally:
        for proc in workers:
            proc.kill()
            proc.wait()


def test_a_host_whose_simulated_kfd_is_gone_says_so_until_it_is_back(tmp_path):
    """Host.reopen: a connection that fails is opened again; while nothing answers, Lv1 with the
    reason (and asked again later), not a final verdict."""
    from kfdtool.errors import SimulatorError
    from xsched_lv3.lv3 import Host

    class Kfd:
        def __init__(self):
            self.alive, self.closed = True, False

        def ioctl(self, name, arg):
            if not self.alive:
                raise SimulatorError("simulated KFD server went away: [Errno 32] Broken pipe")

        def close(self):
            self.closed = True
    opened, server_up = [], [True]

    def open_kfd():
        if not server_up[0]:
            raise SimulatorError("simulated mi308x is not running")
        opened.append(Kfd())
        return opened[-1]
    host = Host(open_kfd, sysfs_root=tmp_path)
    assert host.reopen() and len(opened) == 1          # it answers: nothing reopened
    opened[0].alive, server_up[0] = False, False
    assert not host.reopen() and host.lost and opened[0].closed
    assert host.no_kfd == "Lv1: the simulated KFD went away (simulated mi308x is not running)"
    server_up[0] = True
    assert host.reopen() and not host.lost and host.no_kfd is None and host.kfd is opened[1]


def test_a_debugger_that_takes_the_role_away_does_not_leave_the_lp_suspended(setup):
    """Another process's refused ENABLE (rocgdb attaching to our LP, then giving up) takes the
    debugger role from the daemon (kfd_ioctl_set_debug_trap sets debugger_process before checking):
    the daemon's RESUME gets EPERM. It releases the LP through ptrace (DISABLE resumes everything),
    and attaches it again later."""
    from test_cwsr import THIEF
    s = setup
    hp, lp = s.hp_holds_lp()
    thief = subprocess.Popen([sys.executable, "-c", THIEF, str(s.lp.pid), "mi308x"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert thief.stdout.readline().strip() == "EALREADY"
        assert {q["debugger"] for q in s.queues(s.lp)} == {thief.pid}
        s.set_active(hp, False)
        wait_for(s.lp_running, "the LP's queues to be resumed", why=lambda: s.status(s.lp)["why"])
    finally:
        thief.communicate("\n", timeout=10)
    wait_for(lambda: s.board.read_slot(lp).level == 3, "the LP to be attached again", timeout=10,
             why=lambda: s.status(s.lp)["why"])
    s.one_request(hp)                                 # suspended by the daemon again, and resumed


def _lingering_workers(*roles):
    """Simulated GPU processes that outlive their simulator (the pid stays on the board)."""
    return spawn_workers(*roles, linger=True)


def test_a_simulator_stopped_under_lv3_clients_leaves_them_at_lv1_until_one_answers_again(setup):
    """The suspend of an Lv3 client fails because its simulated KFD stopped: the daemon forgets
    every attachment of that connection, keeps every client at Lv1 saying why (asked again, not
    for good), and once a simulator runs again its new processes reach Lv3."""
    from kfdtool.sim import runner
    s = setup
    workers = _lingering_workers("hp-old", "lp-old")
    try:
        hp, lp = s.client(workers[0], 10), s.client(workers[1], 0)
        wait_for(lambda: s.board.read_slot(lp).level == 3, "Lv3", why=lambda: s.status(workers[1])["why"])
        runner.stop("mi308x")
        s.set_active(hp, True)                        # the suspend fails: nobody is there
        wait_for(lambda: "simulated KFD went away" in s.status(workers[1])["why"], "the reason", timeout=10,
                 why=lambda: s.status(workers[1])["why"])
        assert s.board.read_slot(lp).level == 1 and not s.status(workers[1])["suspended"]
        time.sleep(1.0)                               # asked again meanwhile: still no KFD, still the reason
        assert "simulated KFD went away" in s.status(workers[1])["why"] and s.daemon.poll() is None
        s.set_active(hp, False)
        s.sim = start("mi308x")
        s.ctl = s.sim.control()
        workers += _lingering_workers("hp-new", "lp-new")
        hp2, lp2 = s.client(workers[2], 10), s.client(workers[3], 0)
        wait_for(lambda: s.board.read_slot(lp2).level == 3, "the new LP at Lv3", timeout=10,
                 why=lambda: s.status(workers[3])["why"])
        s.lp = workers[3]
        s.one_request(hp2)
    finally:
        for proc in workers:
            proc.kill()
            proc.wait()


def test_status_names_the_daemon_that_answers_at_the_socket_given(setup, tmp_path):
    """`status --socket S` with a board on which no daemon is registered (another XSCHED_LV3_BOARD):
    the daemon answering at S is the one shown, not "none"."""
    s = setup
    s.client(s.hp, 10)
    env = dict(os.environ, XSCHED_LV3_BOARD=str(tmp_path / "another-board"))
    out = subprocess.run([sys.executable, "-m", "xsched_lv3", "status", "--socket", s.sock], capture_output=True,
                         text=True, timeout=30, env=env)
    assert out.returncode == 0 and f"daemon: pid {s.daemon.pid}" in out.stdout, out.stdout + out.stderr
    assert any(line.split()[:1] == [str(s.hp.pid)] for line in out.stdout.splitlines())
    as_json = subprocess.run([sys.executable, "-m", "xsched_lv3", "status", "--json", "--socket", s.sock],
                             capture_output=True, text=True, timeout=30, env=env)
    assert json.loads(as_json.stdout)["daemon"] == s.daemon.pid


def test_programs_started_by_run_register_with_the_daemon_and_the_lower_one_reaches_lv3(sim_dir, tmp_path):
    """The path a user takes (README, *Lv3 through the daemon*): two ordinary programs on the
    simulated runtime started by `xsched-lv3 run` next to a daemon. The lower one is attached and
    suspended while the service's requests run and is never left suspended; the service is never
    attached; a client killed with SIGKILL loses its slot at once (the daemon watches its pidfd)."""
    start("mi308x")
    env = dict(os.environ, XSCHED_LV3_BOARD=str(tmp_path / "board"), XSCHED_LV3_SOCKET=str(tmp_path / "d.sock"),
               KFDTOOL_RUN_DIR=str(tmp_path / "run"))
    daemon = subprocess.Popen([sys.executable, "-m", "xsched_lv3", "daemon", "--sim", "mi308x"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    job = [sys.executable, str(REPO / "scripts/workloads/sim_job.py"), "--sim", "mi308x", "--seconds", "4"]
    programs = []
    try:
        ready, _, _ = select.select([daemon.stdout], [], [], 20)
        assert ready and "Lv3 through simulated mi308x" in daemon.stdout.readline()
        for priority, role in ((10, ["serve", "--rate", "50"]), (0, ["batch"])):
            programs.append(subprocess.Popen([sys.executable, "-m", "xsched_lv3", "run", "--priority", str(priority),
                                              "--", *job, *role], env=env, stdin=subprocess.DEVNULL,
                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        hp, lp = programs

        def status():
            out = subprocess.run([sys.executable, "-m", "xsched_lv3", "status", "--json"], env=env,
                                 capture_output=True, text=True, timeout=30)
            assert out.returncode == 0, out.stderr
            return {c["pid"]: c for c in json.loads(out.stdout)["clients"]}
        # `run` execs the program: the pid on the board is the one started here
        wait_for(lambda: status().get(lp.pid, {}).get("suspends", 0) >= 3, "the batch program suspended by the daemon",
                 timeout=20, why=status)
        clients = status()
        assert clients[lp.pid]["level"] == 3 and "DBG_TRAP" in clients[lp.pid]["why"]
        assert clients[hp.pid]["level"] == 1 and clients[hp.pid]["suspends"] == 0
        out, err = lp.communicate(timeout=30)
        assert lp.returncode == 0 and "Traceback" not in err, err
        assert suspended_by(lp.pid) == {}              # nothing left suspended, no hold left recorded
        # the daemon watches every client's pidfd: the service killed, its slot goes at once
        hp.kill()
        hp.wait()
        board = Board(str(tmp_path / "board"))          # read as it is (`status` would reap dead clients itself)
        try:
            wait_for(lambda: hp.pid not in {s.pid for _, s in board.slots()},
                     "the killed service's slot released by the daemon", timeout=1.0)
        finally:
            board.close()
    finally:
        for proc in programs + [daemon]:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def test_the_grace_period_is_the_shortest_unless_saving_every_wave_outlasts_a_wave(sim):
    """Saving a whole MI308X partition's waves takes microseconds at HBM bandwidth, far below a wave's
    life: the shortest grace period the hardware honours. The same CWSR area behind a memory a million
    times slower would take longer to save than waves take to finish: then they get the longest."""
    from types import SimpleNamespace
    from kfdtool.topology import read_topology
    from xsched_lv3.lv3 import MIN_GRACE, grace_period_for
    node = next(read_topology(sim.sysfs_root).for_each_gpu())
    grace, why = grace_period_for(node)
    assert grace == MIN_GRACE and why.startswith("shortest grace period: saving every wave takes ~"), why
    slow = SimpleNamespace(props=node.props, mem_banks=[SimpleNamespace(props={"width": 8, "mem_clk_max": 1})])
    grace, why = grace_period_for(slow)
    assert grace == 255 and why.endswith("waves get a grace period to finish"), why
    assert grace_period_for(None)[0] == MIN_GRACE


@pytest.mark.parametrize("abi, params, why", [
    ("1.11", {}, "Lv1: KFD ABI 1.11 has no debugger API (needs 1.13)"),
    ("1.23", {"sched_policy": 2}, "Lv1: amdgpu sched_policy=2 (no HWS): the kernel refuses debugger ops"),
])
def test_a_host_whose_kfd_cannot_suspend_another_process_keeps_every_client_at_lv1(sim_dir, abi, params, why):
    """Per client, the level and the reason (status's WHY): decided from the KFD's ABI and amdgpu's
    parameters before anything is attempted; the same machine with a recent ABI and HWS gives Lv3."""
    from kfdtool.device import KfdDevice
    from kfdtool.sim import runner
    from xsched_lv3.lv3 import LV1, LV3, Host
    for config, expected in (((abi, params), (LV1, why)), (("1.23", {}), LV3)):
        runner.stop("mi308x")
        sim = start("mi308x", abi=config[0], **config[1])
        host = Host(lambda: KfdDevice(sim.open_kfd()), sysfs_root=sim.sysfs_root)
        try:
            level = host.level_for(os.getppid())
            assert level == expected if expected != LV3 else level[0] == LV3, level
        finally:
            host.close()


def test_a_gpu_older_than_gfx9_has_no_debugger_support():
    from kfdtool.cwsr.debugtrap import availability
    verdict = availability(23, 0, [80003, 90400])
    assert not verdict.available and verdict.why == "a GPU older than gfx9 has no debugger support (ENODEV)"


@pytest.mark.parametrize("refusal, why", [
    ("ptrace", "Lv1: ptrace refused (denied)"),
    ("debugger", "Lv1: another debugger (rocgdb?) is attached to pid {pid}"),
])
def test_a_client_the_daemon_cannot_take_the_debugger_role_on_stays_at_lv1_and_says_why(fake_engine, monkeypatch,
                                                                                          refusal, why):
    import errno
    import xsched_lv3.lv3 as lv3
    from kfdtool.errors import AlreadyDebugged, AttachDenied

    class Refused(FakeMechanism):
        def __init__(self, kfd, pid, read_wave_state=True):
            if refusal == "ptrace":
                raise AttachDenied("denied")
            raise AlreadyDebugged("DBG_TRAP", errno.EALREADY, op="ENABLE")
    monkeypatch.setattr(lv3, "DebugTrapSuspend", Refused)
    board, engine, hp, lp, hp_proc, lp_proc = hp_and_lp(fake_engine, now=100.0)
    board.set_active(hp, True)
    engine.sync(now=100.001)
    assert board.read_slot(lp).level == 1 and engine.clients[lp].why == why.format(pid=lp_proc.pid)
    assert FakeMechanism.calls == []
    engine.close()


def test_a_simulator_gone_under_a_back_to_back_suspend_is_the_kfd_gone_not_a_daemon_bug(fake_engine, monkeypatch):
    """A simulated KFD that went away answers the whole batch with SimulatorError: each client's
    call failed that way and the engine reconnects later (`_kfd_gone`), instead of the error
    escaping `sync` as an internal error that stops Lv3 for good (found in review)."""
    from kfdtool.errors import SimulatorError
    board, make_engine, hp_proc, lp_proc = fake_engine

    class Kfd:
        def ioctls(self, calls):
            raise SimulatorError("simulated KFD server went away: [Errno 32] Broken pipe")
    monkeypatch.setattr(FakeMechanism, "suspend_call",
                        lambda self, qids=None, grace_period=None: PreparedCall(("suspend", self.pid), lambda: None))
    hp = board.allocate(hp_proc.pid, 10, 0, DEVICE)
    board.allocate(lp_proc.pid, 0, 0, DEVICE)
    engine = make_engine()
    gone = []
    engine.host.kfd = Kfd()
    monkeypatch.setattr(engine, "_kfd_gone", lambda c, e, now: gone.append(e))
    engine.sync(now=100.0)
    board.set_active(hp, True)
    engine.sync(now=100.001)
    assert [type(e) for e in gone] == [SimulatorError]


def test_an_activation_is_served_before_the_daemon_looks_for_stopped_clients(fake_engine, monkeypatch):
    """The look for stopped processes (a /proc read per active client) comes after the suspends an
    activation wakes the daemon for, not before: it cannot excuse a new activation anyway, and read
    first it delayed every suspend it was due with (about one activation in two at 20 requests a
    second). What it finds is acted on at once (the daemon is asked to sync again)."""
    import xsched_lv3.lv3 as lv3
    looked = []

    def look(states):
        looked.append(len(FakeMechanism.calls))            # how many calls were made before this look
        return {(q.id, q.ready_since) for q in states if q.ready}      # as if every active client stopped

    monkeypatch.setattr(lv3, "stopped_activations", look)
    board, engine, hp, lp, hp_proc, lp_proc = hp_and_lp(fake_engine, now=100.0)
    board.set_active(hp, True)
    assert engine.sync(now=100.1) == 100.1                   # what it found changed: sync again at once
    assert FakeMechanism.calls == [("suspend", lp_proc.pid)] and looked[-1] == 1
    engine.close()
