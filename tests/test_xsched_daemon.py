"""xsched-lv3 daemon protocol, dead clients, hints and the CLI's bad-input handling."""
import json
import os
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from xsched_lv3.daemon import may_change
from xsched_lv3.daemon_link import request


@pytest.fixture
def daemon(tmp_path):
    env = dict(os.environ, XSCHED_LV3_BOARD=str(tmp_path / "board"), XSCHED_LV3_SOCKET=str(tmp_path / "d.sock"))
    proc = subprocess.Popen([sys.executable, "-m", "xsched_lv3", "daemon", "--policy", "hpf"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], 10)      # the banner comes once it listens
    assert ready and "xsched-lv3 daemon: policy hpf" in proc.stdout.readline()
    yield env, str(tmp_path / "d.sock")
    proc.terminate()
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0 and "Traceback" not in err, err


CLIENT = """
import json, socket, sys, time
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
s.sendall(json.dumps({"op": "register", "priority": int(sys.argv[2])}).encode() + b"\\n")
print(s.recv(1000).decode().strip(), flush=True)
time.sleep(60)
"""


def spawn_client(sock, priority):
    proc = subprocess.Popen([sys.executable, "-c", CLIENT, sock, str(priority)], stdout=subprocess.PIPE, text=True)
    reply = json.loads(proc.stdout.readline())
    assert reply["ok"]
    return proc


def test_register_status_hint_and_dead_client(daemon):
    env, sock = daemon
    a, b = spawn_client(sock, 5), spawn_client(sock, 1)
    try:
        status = request({"op": "status"}, sock)
        assert status["policy"] == "hpf"
        assert {(c["pid"], c["priority"]) for c in status["clients"]} == {(a.pid, 5), (b.pid, 1)}
        assert request({"op": "hint", "pid": b.pid, "name": "priority", "value": 9}, sock)["ok"]
        assert {c["pid"]: c["priority"] for c in request({"op": "status"}, sock)["clients"]}[b.pid] == 9
        a.kill()                                           # a client dies without a word
        a.wait()
        deadline = time.monotonic() + 5
        while a.pid in {c["pid"] for c in request({"op": "status"}, sock)["clients"]}:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        for p in (a, b):
            p.kill()


@pytest.mark.parametrize("msg,needle", [
    ({"op": "hint", "pid": 1, "name": "priority", "value": "high"}, "wants a number"),
    ({"op": "hint", "pid": 1, "name": "colour", "value": 1}, "unknown hint"),
    ({"op": "hint", "pid": 999999, "name": "priority", "value": 1}, "not scheduled"),
    ({"op": "policy", "name": "fifo"}, "unknown policy"),
    ({"op": "reboot"}, "unknown op"),
    ({"op": "register", "priority": 10**6}, "between -1000 and 1000"),
])
def test_bad_requests_are_rejected(daemon, msg, needle):
    _, sock = daemon
    assert needle in request(msg, sock)["error"]


def test_garbage_does_not_kill_the_daemon(daemon):
    _, sock = daemon
    s = socket.socket(socket.AF_UNIX)
    s.connect(sock)
    s.sendall(b"{not json\n")
    assert "error" in json.loads(s.recv(1000))
    s.close()
    assert request({"op": "status"}, sock)["ok"]


def test_a_local_schedulers_hints_go_through_the_daemon_to_that_queue_only(daemon, monkeypatch):
    """One writer per field: with a daemon serving the board, a LocalScheduler's hint for one of its
    queues is the daemon's write (as `xsched-lv3 hint`'s), to that queue's slot and no other of the
    process; a slot that is not the process's is refused."""
    env, sock = daemon
    monkeypatch.setenv("XSCHED_LV3_BOARD", env["XSCHED_LV3_BOARD"])
    monkeypatch.setenv("XSCHED_LV3_SOCKET", sock)
    from xsched_lv3 import Level, LocalScheduler, XQueue
    from xsched_lv3.backends.sim import SimHwQueue
    from xsched_lv3.board import Board
    sched = LocalScheduler("hpf", board=Board())
    a = sched.add(XQueue(SimHwQueue(Level.BLOCK), priority=1, name="a"))
    b = sched.add(XQueue(SimHwQueue(Level.BLOCK), priority=2, name="b"))
    try:
        monkeypatch.setattr(Board, "set_hint", lambda *args, **kw: pytest.fail("a hint written past the daemon"))
        sched.hint(a, "priority", 9)
        clients = [c for c in request({"op": "status"}, sock)["clients"] if c["pid"] == os.getpid()]
        assert {c["tid"]: c["priority"] for c in clients} == {a.worker_tid: 9, b.worker_tid: 2}
        other = next(i for i in range(32) if i not in {c["slot"] for c in clients})
        reply = request({"op": "hint", "pid": os.getpid(), "slot": other, "name": "priority", "value": 5}, sock)
        assert f"slot {other} is not a client of pid {os.getpid()}" in reply["error"]
    finally:
        sched.close()
        for q in (a, b):
            q.close()


def test_only_root_or_owner_may_hint():
    assert may_change(0, os.getpid())
    assert may_change(os.getuid(), os.getpid())
    assert not may_change(os.getuid() + 12345, os.getpid())
    assert not may_change(os.getuid() + 12345, 999999)


def xsched(*args, env=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "xsched_lv3", *args], capture_output=True, text=True,
                          env=env or os.environ, timeout=30, cwd=cwd)


@pytest.mark.parametrize("args,code,needle", [
    (["hint", "--pid", "1", "--priority", "2", "--socket", "/nonexistent.sock"], 1, "no xsched-lv3 daemon"),
    (["hint", "--pid", "1"], 2, "give at least one hint"),
    (["run", "--priority", "1"], 2, "nothing to run"),
    (["hint", "--pid", "1", "--utilization", "300", "--socket", "/x"], 2, "between 0 and 100"),
    (["run", "--window-us", "-5", "--", "true"], 2, "argument --window-us: the window must be between 0 (unbounded) and"),
    (["run", "--window-us", "nan", "--", "true"], 2, "argument --window-us: the window must be between 0 (unbounded) and"),
    (["run", "--window-us", "inf", "--", "true"], 2, "argument --window-us: the window must be between 0 (unbounded) and"),
    # accepted once, then an OverflowError in the program at its first module call under a higher client
    (["run", "--window-us", "1e308", "--", "true"], 2, "argument --window-us: the window must be between 0 (unbounded) and"),
    # accepted once, then the exposure guard's thread died of a timeout past threading.TIMEOUT_MAX
    (["run", "--latency-slack", "1e13", "--", "true"], 2, "latency slack must be between 0 and 100"),
    (["--bogus"], 2, "unrecognized arguments: --bogus"),
    (["status", "--bogus"], 2, "xsched-lv3 status: error: unrecognized arguments: --bogus"),   # the command's usage
    ([], 2, "a COMMAND is required"),
])
def test_cli_errors_are_one_line(args, code, needle):
    """A failure is one line (exit 1); a command held wrong, value out of range included, is a usage
    error (exit 2, argparse's usage and its `error:` line last), as for a value argparse cannot parse."""
    result = xsched(*args)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == code and needle in lines[-1] and "Traceback" not in result.stderr
    assert len(lines) == 1 if code == 1 else "error:" in lines[-1]


def test_run_answers_a_command_that_cannot_start_as_env_does(tmp_path):
    """127 for a command not found, 126 for one that cannot be executed (env(1), nice(1), timeout(1))."""
    missing = xsched("run", "--", "no-such-program-xyz")
    assert missing.returncode == 127 and missing.stderr.strip() == "xsched-lv3: no-such-program-xyz: command not found"
    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\n")
    denied = xsched("run", "--", str(script))
    assert denied.returncode == 126 and "permission denied" in denied.stderr
    assert len(denied.stderr.strip().splitlines()) == 1


def test_cli_hint_through_the_daemon(daemon):
    env, sock = daemon
    client = spawn_client(sock, 0)
    try:
        result = xsched("hint", "--pid", str(client.pid), "--priority", "7", env=env)
        assert result.returncode == 0, result.stderr
        status = xsched("status", env=env)
        assert f"{client.pid:>8}" in status.stdout and "policy: hpf" in status.stdout
    finally:
        client.kill()


def test_run_sets_up_the_child(tmp_path):
    probe = ("import os, sys; print(os.environ['XSCHED_LV3_PRIORITY'], any('_boot' in p for p in sys.path), "
             "os.environ.get('XSCHED_LV3_WINDOW_US'))")
    env = dict(os.environ, XSCHED_LV3_WINDOW_US="123")          # left over in the caller's shell
    result = xsched("run", "--priority", "4", "--", sys.executable, "-c", probe, env=env)
    # the window default is the library's one constant, not a copy in the environment
    assert result.returncode == 0 and result.stdout.split() == ["4", "True", "None"]


FAKE_TORCH_PKG = '''
class Tensor:
    pass
class _Module:
    def __init__(self):
        self._modules = {}
    def __call__(self, *a, **k):
        return self.forward(*a, **k)
    def forward(self, x):
        return x
class _NN:
    Module = _Module
nn = _NN()
class _Event:
    def __init__(self, enable_timing=False, blocking=False):
        pass
    def record(self, stream=None):
        pass
    def query(self):
        return True
    def synchronize(self):
        pass
class _Cuda:
    Event = _Event
    @staticmethod
    def is_initialized():
        return False
cuda = _Cuda()
'''


def test_run_schedules_an_unmodified_torch_program(tmp_path):
    """`xsched-lv3 run` hooks the import of torch: the program's module calls go through a gate
    registered on the board with the priority given on the command line."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(FAKE_TORCH_PKG)
    program = ("import torch, xsched_lv3.pytorch as xt, time\n"
               "m = torch.nn.Module(); m(1)\n"
               "g = xt._process_gate\n"
               "from xsched_lv3.window import DEFAULT_WINDOW_US\n"
               "print(g is not None, g.board.read_slot(g.slot)[1], g.window_us == DEFAULT_WINDOW_US, g.guarded)\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path), XSCHED_LV3_BOARD=str(tmp_path / "board"))
    result = xsched("run", "--priority", "6", "--", sys.executable, "-c", program, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "6", "True", "False"]     # alone on its board: never guarded


@pytest.mark.skipif(not os.path.exists("/usr/bin/python3") or os.path.realpath("/usr/bin/python3") == os.path.realpath(
    sys.executable), reason="needs a second Python, one without this package installed")
def test_run_schedules_a_program_on_another_python(tmp_path):
    """`xsched-lv3 run -- /usr/bin/python3 prog.py` from a venv: the child's Python has no
    xsched_lv3 of its own, and still gets scheduled (no traceback at `import torch`)."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(FAKE_TORCH_PKG)
    program = "import torch, xsched_lv3.pytorch as xt\nprint(xt._process_gate is not None)\n"
    env = dict(os.environ, PYTHONPATH=str(tmp_path), XSCHED_LV3_BOARD=str(tmp_path / "board"))
    result = xsched("run", "--", "/usr/bin/python3", "-c", program, env=env, cwd=tmp_path)   # not the checkout
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert result.stdout.split() == ["True"]


def test_bad_board_paths_and_programs_are_one_line_and_touch_nothing(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("somebody's notes\n")
    script = tmp_path / "not-executable.sh"
    script.write_text("echo hi\n")
    cases = [
        ({"XSCHED_LV3_BOARD": str(tmp_path)}, ["status"], "Is a directory"),
        ({"XSCHED_LV3_BOARD": str(tmp_path / "missing" / "board")}, ["status"], "No such file or directory"),
        ({"XSCHED_LV3_BOARD": str(notes)}, ["status"], "is not an xsched_lv3 board"),
        ({"XSCHED_LV3_BOARD": str(tmp_path / "board")}, ["run", "--", str(script)], "permission denied"),
    ]
    for extra, args, needle in cases:
        result = xsched(*args, env=dict(os.environ, **extra))
        assert result.returncode == (126 if args[0] == "run" else 1) and needle in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    # `run` with an unusable board: the job still runs (unscheduled), with one warning
    result = xsched("run", "--", sys.executable, "-c", "print('ran')", env=dict(os.environ, XSCHED_LV3_BOARD=str(notes)))
    assert result.returncode == 0 and result.stdout == "ran\n", result.stderr
    assert result.stderr.count("\n") == 1 and "is not an xsched_lv3 board; running" in result.stderr
    assert notes.read_text() == "somebody's notes\n"          # never overwritten by a board


def test_a_full_board_leaves_the_program_running_unscheduled(tmp_path):
    """32 clients already registered: `import torch` under `run` must not raise; one warning."""
    from xsched_lv3.board import SLOTS, Board
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(FAKE_TORCH_PKG)
    board = Board(tmp_path / "board")
    for _ in range(SLOTS):
        board.allocate(os.getpid())               # alive: never reaped
    program = "import torch, xsched_lv3.pytorch as xt\nprint('ran', xt._process_gate)\n"
    env = dict(os.environ, PYTHONPATH=str(tmp_path), XSCHED_LV3_BOARD=str(tmp_path / "board"))
    result = xsched("run", "--", sys.executable, "-c", program, env=env)
    assert result.returncode == 0 and result.stdout.split() == ["ran", "None"], result.stderr
    assert result.stderr.count("\n") == 1 and "no free slot" in result.stderr and "unscheduled" in result.stderr


def test_a_board_another_user_could_have_placed_is_refused(tmp_path):
    """A predictable name in a shared directory: a symlink there is never followed (it pointed
    another user's victim at a file of theirs), a file writable by others or hard-linked is
    refused, and a new board is created 0600."""
    from xsched_lv3.board import Board, BoardUnusable
    fresh = Board(tmp_path / "fresh")
    assert (os.stat(tmp_path / "fresh").st_mode & 0o777) == 0o600
    fresh.close()
    target = tmp_path / "precious"
    target.write_text("root's file\n")
    os.symlink(target, tmp_path / "link")
    shared = tmp_path / "shared"
    Board(shared).close()
    os.chmod(shared, 0o666)
    os.link(tmp_path / "fresh", tmp_path / "hard")
    for name, needle in (("link", "symbolic link"), ("shared", "writable by other users"), ("hard", "2 links")):
        with pytest.raises(BoardUnusable, match=needle):
            Board(tmp_path / name)
    assert target.read_text() == "root's file\n"


def test_run_drops_hints_it_was_not_given(tmp_path):
    probe = "import os; print(os.environ.get('XSCHED_LV3_DEADLINE_US'), os.environ.get('XSCHED_LV3_UTILIZATION'))"
    env = dict(os.environ, XSCHED_LV3_DEADLINE_US="abc", XSCHED_LV3_UTILIZATION="500",
               XSCHED_LV3_BOARD=str(tmp_path / "board"))
    result = xsched("run", "--utilization", "20", "--", sys.executable, "-c", probe, env=env)
    assert result.returncode == 0 and result.stdout.split() == ["None", "20.0"]


def test_status_json_stays_json_when_the_board_holds_a_nan(tmp_path):
    """Any process of this user can write the board: a NaN there must not make `status --json` print
    something no JSON parser accepts."""
    from xsched_lv3.board import Board
    env = {**os.environ, "XSCHED_LV3_BOARD": str(tmp_path / "board")}
    board = Board(str(tmp_path / "board"))
    slot = board.allocate(os.getpid(), 5, 0, 0)
    board.write(slot, held_s=float("nan"), announce=False)
    out = xsched("status", "--json", env=env)
    assert out.returncode == 0, out.stderr

    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")
    doc = json.loads(out.stdout, parse_constant=refuse)
    assert [c["held_s"] for c in doc["clients"] if c["pid"] == os.getpid()] == [None]
    board.release(slot, os.getpid())


def test_status_says_which_service_lets_lower_clients_run_beside_it(tmp_path):
    """A service whose protection found its lower clients harmless does not mark itself active: it
    shows as exposing, not idle (it may be busy), so an admin sees why the batch job is not held."""
    from xsched_lv3.board import Board
    env = {**os.environ, "XSCHED_LV3_BOARD": str(tmp_path / "board")}
    board = Board(str(tmp_path / "board"))
    service = board.allocate(os.getpid(), 10, 1, 0)
    batch = board.allocate(os.getpid(), 0, 2, 0)
    board.write(service, exposing=1, announce=False)
    out = xsched("status", env=env)
    assert out.returncode == 0, out.stderr
    rows = {line.split()[1]: line.split()[5] for line in out.stdout.splitlines()[2:]}
    assert rows == {"1": "exposing", "2": "idle"}
    doc = json.loads(xsched("status", "--json", env=env).stdout)
    assert sorted(c["exposing"] for c in doc["clients"]) == [False, True]
    for slot in (service, batch):
        board.release(slot, os.getpid())


# --- `run` starts the program as a shell would (a sweep with odd programs found each of these) ---------

def test_run_leaves_the_program_the_signal_dispositions_it_has_without_us(tmp_path):
    """Python ignores SIGPIPE and SIGXFSZ and exec keeps that: a pipeline's writer under `run` looped on
    EPIPE (`while :; do echo x; done | head -1` never ended) instead of dying of its closed pipe."""
    script = "grep SigIgn /proc/$$/status"
    plain = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)
    under = xsched("run", "--", "sh", "-c", script, env=dict(os.environ, XSCHED_LV3_BOARD=str(tmp_path / "board")))
    assert under.returncode == 0 and under.stdout == plain.stdout, (under.stdout, plain.stdout)
    pipeline = xsched("run", "--", "sh", "-c", "while :; do echo x; done | head -1",
                      env=dict(os.environ, XSCHED_LV3_BOARD=str(tmp_path / "board")))
    assert pipeline.returncode == 0 and pipeline.stdout == "x\n"


def test_run_puts_neither_the_working_directory_nor_a_relative_board_on_the_programs_path(tmp_path):
    """With no PYTHONPATH, `run` set it to "<_boot>:", whose empty entry is the working directory: a
    json.py there shadowed the standard library's. A relative XSCHED_LV3_BOARD named another board
    once the program changed directory."""
    (tmp_path / "json.py").write_text("print('SHADOW')\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "prog").mkdir()
    (tmp_path / "prog" / "p.py").write_text(
        "import json, os, sys; os.chdir('sub'); "
        "print(os.environ['XSCHED_LV3_BOARD'], '' in os.environ['PYTHONPATH'].split(os.pathsep))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["XSCHED_LV3_BOARD"] = "board.rel"
    # the installed command, as a user runs it (`python -m` would put the directory on our own path)
    command = str(Path(sys.executable).with_name("xsched-lv3"))
    result = subprocess.run([command, "run", "--", sys.executable, "prog/p.py"], capture_output=True, text=True,
                            env=env, timeout=30, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(tmp_path / "board.rel"), "False"]


def test_run_keeps_the_sitecustomize_it_hides(tmp_path):
    """Our sitecustomize comes first on PYTHONPATH: the one Python would have run (a distribution's,
    a virtual environment's, the program's own) runs too, and is the module `sitecustomize`."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text("import builtins\nbuiltins.SITE_OK = True\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"), XSCHED_LV3_BOARD=str(tmp_path / "board"))
    program = "import sitecustomize; print(SITE_OK, sitecustomize.__file__)"
    result = xsched("run", "--", sys.executable, "-c", program, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", str(tmp_path / "site" / "sitecustomize.py")]


def test_run_runs_a_script_without_an_interpreter_line_with_sh_as_env_does(tmp_path):
    script = tmp_path / "noshebang"
    script.write_text('echo "ran with $1"\n')
    script.chmod(0o755)
    env = dict(os.environ, XSCHED_LV3_BOARD=str(tmp_path / "board"), PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    for name in (str(script), "noshebang"):
        result = xsched("run", "--", name, "a", env=env)
        assert result.returncode == 0 and result.stdout == "ran with a\n", (name, result.returncode, result.stderr)


def test_run_with_its_stderr_closed_writes_nothing_into_the_programs_stdout(tmp_path):
    """print(file=sys.stderr) with stderr closed writes to stdout: `run`'s warning went into the
    output of the program it started."""
    out = tmp_path / "out"
    with open(out, "w") as f:
        subprocess.run([sys.executable, "-m", "xsched_lv3", "run", "--", "echo", "hello"], stdout=f, stderr=subprocess.DEVNULL,
                       env=dict(os.environ, XSCHED_LV3_BOARD=str(tmp_path)), timeout=30,
                       preexec_fn=lambda: os.close(2))
    assert out.read_text() == "hello\n"
