"""The daemon tried as a hostile local user would: malformed and fuzzed requests, a client that
never reads, over-long lines, a --socket naming someone's file, a second daemon, signals, modes.
Every daemon here runs as a subprocess and must end cleanly on SIGTERM: exit 0, no traceback and no
internal error in its log (the fixture checks this after each test)."""
import json
import os
import random
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from xsched_lv3.board import SLOTS
from xsched_lv3.daemon import MAX_LINE_BYTES, connection_refusal
from xsched_lv3.daemon_link import request, wake_path

READ_TIMEOUT_S = 10


def start_daemon(tmp_path, *args, env=None, wait_ready=True):
    env = env or dict(os.environ, XSCHED_LV3_BOARD=str(tmp_path / "board"),
                      XSCHED_LV3_SOCKET=str(tmp_path / "d.sock"))
    proc = subprocess.Popen([sys.executable, "-m", "xsched_lv3", "daemon", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if wait_ready:
        ready, _, _ = select.select([proc.stdout], [], [], READ_TIMEOUT_S)
        line = proc.stdout.readline() if ready else b""
        assert b"xsched-lv3 daemon: policy" in line, (line, proc.poll())
    return proc


def stop_daemon(proc, signum=signal.SIGTERM):
    """Signal the daemon; its exit status and log, which must show a clean shutdown."""
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=READ_TIMEOUT_S)
    err = err.decode()
    assert proc.returncode == 0 and "Traceback" not in err and "internal error" not in err, (proc.returncode, err)
    return err


@pytest.fixture
def daemon(tmp_path):
    proc = start_daemon(tmp_path)
    yield str(tmp_path / "d.sock")
    stop_daemon(proc)


def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(READ_TIMEOUT_S)
    s.connect(path)
    return s


def read_line(s):
    """One reply line, or None when the daemon closed the connection."""
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = s.recv(1)
        if not chunk:
            return None
        buf += chunk
    return json.loads(buf)


def ask(s, line):
    s.sendall(line + b"\n")
    return read_line(s)


STATUS = b'{"op": "status"}'


def assert_serving(path):
    assert request({"op": "status"}, path)["ok"]


MALFORMED = [
    (b"[]", "one JSON object per line"),
    (b'"x"', "one JSON object per line"),
    (b"null", "one JSON object per line"),
    (b"", "not a request"),
    (b"{not json", "not a request"),
    (b"\xff\xfe{}", "not a request"),                                   # not UTF-8
    (b"[" * 20000 + b"]" * 20000, "nested too deeply"),
    (b'{"op": "register", "priority": 1' + b"0" * 5000 + b"}", "not a request"),   # too many digits for int()
    (b'{"op": "register", "priority": 1e999}', "must be a finite number"),
    (b'{"op": "register", "priority": NaN}', "must be a finite number"),
    (b'{"op": "register", "priority": true}', "wants a number"),
    (b'{"op": "register", "priority": "5"}', "wants a number"),
    (b'{"op": "register", "priority": 2.5}', "wants a whole number"),
    (b'{"op": "register", "priority": 1000000000000}', "between -1000 and 1000"),
    (b'{"op": "register", "hints": [1, 2]}', "hints must be an object"),
    (b'{"op": "register", "hints": {"utilization": 1e999}}', "must be a finite number"),
    (b'{"op": "register", "hints": {"nice": 5}}', "unknown hint"),
    (b'{"op": "register", "hints": {"priority": 5}}', "not among the hints"),
    (b'{"op": "register", "tid": -1}', "tid must be a thread id"),
    (b'{"op": "register", "tid": true}', "tid must be a thread id"),
    (b'{"op": "register", "tid": 1e99}', "tid must be a thread id"),
    (b'{"op": "hint", "pid": 1e999, "name": "priority", "value": 1}', "pid must be a process id"),
    (b'{"op": "hint", "pid": true, "name": "priority", "value": 1}', "pid must be a process id"),
    (b'{"op": "hint", "pid": -1, "name": "priority", "value": 1}', "pid must be a process id"),
    (b'{"op": "hint", "pid": 99999999999, "name": "priority", "value": 1}', "pid must be a process id"),
    (b'{"op": "hint", "name": "priority", "value": 1}', "pid must be a process id"),
    (b'{"op": "hint", "pid": 1, "name": "critical_priority", "value": 1099511627776}', "between -1000 and 1000"),
    (b'{"op": "hint", "pid": 1, "name": "utilization", "value": Infinity}', "must be a finite number"),
    (b'{"op": "hint", "pid": 1, "name": "deadline_us", "value": 1' + b"0" * 400 + b"}", "must be a finite number"),
    (b'{"op": "hint", "pid": 1, "name": ["priority"], "value": 1}', "unknown hint"),
    (b'{"op": "hint", "pid": 1, "name": "priority"}', "wants a number, got None"),
    (b'{"op": "policy", "name": ["hpf"]}', "unknown policy"),
    (b'{"op": {"a": 1}}', "unknown op"),
    (b"{}", "unknown op None"),
]


@pytest.mark.parametrize("line,needle", MALFORMED, ids=[repr(m[0][:40]) for m in MALFORMED])
def test_each_malformed_request_gets_one_error_and_the_connection_goes_on(daemon, line, needle):
    with connect(daemon) as s:
        reply = ask(s, line)
        assert set(reply) == {"error"} and needle in reply["error"], reply
        assert len(reply["error"]) < 300                   # one line, not an echo of the input
        assert ask(s, STATUS)["ok"]                         # the same connection still works
    assert_serving(daemon)


def test_wake_socket_survives_any_datagrams(daemon):
    """Anyone who can reach the wake socket can only make the daemon read the board again."""
    wake = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    for payload in (b"", b"x" * 60000, os.urandom(512), b'{"op": "shutdown"}\n'):
        for _ in range(200):
            try:
                wake.sendto(payload, wake_path(daemon))
            except BlockingIOError:
                break
    wake.close()
    assert_serving(daemon)


def test_register_beyond_the_board_gets_an_error(daemon):
    with connect(daemon) as s:
        slots = [ask(s, b'{"op": "register", "priority": 1}')["slot"] for _ in range(SLOTS)]
        assert sorted(slots) == list(range(SLOTS))
        assert "no free slot" in ask(s, b'{"op": "register"}')["error"]
    assert len(request({"op": "status"}, daemon)["clients"]) == SLOTS


def test_clients_that_go_away_before_their_reply(daemon):
    for i in range(50):
        s = connect(daemon)
        s.sendall(STATUS + b"\n" + (b'{"op": "register"}\n' if i % 2 else b""))
        if i % 3 == 0:     # a reset rather than a close: the daemon's send fails with ECONNRESET
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()
    assert_serving(daemon)


def test_an_over_long_line_closes_its_connection_at_once(daemon):
    """100 MiB without a newline took 90 s (quadratic buffering) before; now the connection is
    closed with a reason after MAX_LINE_BYTES, and the sender learns it within a second."""
    chunk = b"x" * (1 << 20)
    start = time.monotonic()
    with connect(daemon) as s:
        sent = 0
        try:
            for _ in range(100):
                s.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        elapsed = time.monotonic() - start
        assert sent < 100 << 20 and elapsed < 2.0, (sent, elapsed)
        try:
            reply = read_line(s)
        except ConnectionResetError:     # the close beat the reason (bytes were still unread there)
            reply = None
        if reply is not None:
            assert f"longer than {MAX_LINE_BYTES} bytes" in reply["error"]
    with connect(daemon) as s:           # a long line that does end: still too long
        s.sendall(b'{"op": "status", "pad": "' + b"y" * MAX_LINE_BYTES + b'"}\n')
        assert "MAX_LINE_BYTES" in read_line(s)["error"]
        assert read_line(s) is None      # closed
    assert_serving(daemon)


def fuzz_lines(rng):
    """Lines a hostile client might send: random bytes, truncated or mutated requests, deep JSON,
    huge and odd numbers in every field (each line within MAX_LINE_BYTES)."""
    valid = [{"op": "status"}, {"op": "register", "priority": 3},
             {"op": "hint", "pid": os.getpid(), "name": "priority", "value": 2},
             {"op": "policy", "name": "hpf"}]
    odd_values = [None, True, [], {}, "", "x" * 50, -1, 0, 2 ** 31, 2 ** 64, -2 ** 63, 1e308, -1e999,
                  float("nan"), 0.5, [[[[]]]], {"op": "status"}]
    for _ in range(400):
        kind = rng.randrange(6)
        if kind == 0:
            yield bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))).replace(b"\n", b" ")
        elif kind == 1:
            text = json.dumps(rng.choice(valid)).encode()
            yield text[:rng.randrange(len(text))]
        elif kind == 2:
            opener = rng.choice([b"[", b'{"a":'])
            yield opener * rng.randrange(500, MAX_LINE_BYTES // len(opener))     # over-long lines: tested above
        elif kind == 3:
            msg = dict(rng.choice(valid))
            msg[rng.choice(["op", "pid", "name", "value", "priority"])] = rng.choice(odd_values)
            yield json.dumps(msg).encode()
        elif kind == 4:
            yield b'{"op": "hint", "pid": ' + str(rng.randrange(10 ** 30)).encode() + b', "value": 1e' + \
                str(rng.randrange(400)).encode() + b"}"
        else:
            text = bytearray(json.dumps(rng.choice(valid)).encode())
            for _ in range(3):
                text[rng.randrange(len(text))] = rng.randrange(32, 127)
            yield bytes(text)


def test_protocol_fuzz(daemon):
    """Fuzzed lines over several connections at once, sent in odd-sized pieces: every line gets one
    JSON object back, no connection is dropped, and a well-formed status works afterwards."""
    rng = random.Random(10_5)
    conns = [connect(daemon) for _ in range(6)]
    expected = [0] * len(conns)
    pending = [bytearray() for _ in conns]
    for line in fuzz_lines(rng):
        i = rng.randrange(len(conns))
        pending[i] += line + b"\n"
        expected[i] += 1
    for i, s in enumerate(conns):
        data = bytes(pending[i] + STATUS + b"\n")
        while data:                                # odd-sized pieces: lines split across reads
            cut = rng.randrange(1, 5000)
            s.sendall(data[:cut])
            data = data[cut:]
    for i, s in enumerate(conns):
        replies = [read_line(s) for _ in range(expected[i] + 1)]
        assert all(isinstance(r, dict) and ("error" in r or r.get("ok")) for r in replies), replies
        assert replies[-1]["ok"] and "clients" in replies[-1]        # the closing status
        s.close()
    assert_serving(daemon)


def round_trips_per_second(path, seconds):
    with connect(path) as s:
        count, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            assert ask(s, STATUS)["ok"]
            count += 1
    return count / seconds


def test_a_client_that_never_reads_does_not_slow_the_others(daemon):
    """A client pipelines requests and never reads its replies (the daemon's old blocking sendall
    stopped serving everyone); another client's request rate stays within a factor of 3 of the rate
    with nobody in the way, and the stalled client gets all its replies once it reads."""
    alone = round_trips_per_second(daemon, 0.5)
    hog = connect(daemon)
    hog.setblocking(False)
    requests = STATUS + b"\n"
    sent, last_progress = 0, time.monotonic()
    while time.monotonic() - last_progress < 0.3:  # until the daemon stops taking its requests
        try:
            sent += hog.send(requests * 1000)
            last_progress = time.monotonic()
        except BlockingIOError:
            time.sleep(0.01)
    assert sent > 100_000                          # replies to it fill the socket buffers: it is stalled
    beside = round_trips_per_second(daemon, 0.5)
    assert beside > alone / 3, (alone, beside)
    hog.settimeout(READ_TIMEOUT_S)
    lines = 0
    whole = sent // len(requests)
    while lines < whole:
        lines += hog.recv(1 << 20).count(b"\n")
    assert lines == whole
    hog.close()


def test_socket_path_naming_a_file_is_refused_and_the_file_kept(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("somebody's notes\n")
    link = tmp_path / "link.sock"
    link.symlink_to(notes)
    for target in (notes, link, tmp_path):
        env = dict(os.environ, XSCHED_LV3_BOARD=str(tmp_path / "board"))
        result = subprocess.run([sys.executable, "-m", "xsched_lv3", "daemon", "--socket", str(target)],
                                env=env, capture_output=True, text=True, timeout=30)
        assert result.returncode == 1 and "not removing it" in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert notes.read_text() == "somebody's notes\n" and link.is_symlink()


def test_a_second_daemon_is_refused_and_the_first_keeps_serving(tmp_path, daemon):
    second = start_daemon(tmp_path, wait_ready=False)
    _, err = second.communicate(timeout=30)
    assert second.returncode == 1 and b"another xsched-lv3 daemon (pid" in err, err
    assert len(err.strip().splitlines()) == 1
    assert_serving(daemon)


def test_a_second_daemon_on_the_same_board_through_another_socket_is_refused(tmp_path):
    """Before, it started: it took the board's daemon record (new clients then found no daemon once
    it left) and released the first daemon's attached clients."""
    from xsched_lv3.board import Board
    first = start_daemon(tmp_path)
    try:
        env = dict(os.environ, XSCHED_LV3_BOARD=str(tmp_path / "board"), XSCHED_LV3_SOCKET=str(tmp_path / "other.sock"))
        second = start_daemon(tmp_path, env=env, wait_ready=False)
        _, err = second.communicate(timeout=30)
        assert second.returncode == 1 and f"already serves the board {tmp_path / 'board'}".encode() in err, err
        assert len(err.strip().splitlines()) == 1
        assert not (tmp_path / "other.sock").exists()
        assert not (tmp_path / "other.sock.lock").exists()     # a refused start leaves nothing behind
        assert_serving(str(tmp_path / "d.sock"))
        board = Board(str(tmp_path / "board"))
        assert board.daemon_pid() == first.pid
        board.close()
    finally:
        stop_daemon(first)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_shuts_down_cleanly_removing_only_our_socket(tmp_path, signum):
    proc = start_daemon(tmp_path)
    sock = tmp_path / "d.sock"
    assert stat.S_IMODE(sock.lstat().st_mode) == 0o600
    stop_daemon(proc, signum)
    assert not sock.exists() and not (tmp_path / "d.sock.lock").exists()    # nothing to recover
    # the socket replaced under a running daemon (someone else's file now): left alone at shutdown
    proc = start_daemon(tmp_path)
    sock.unlink()
    sock.write_text("not the daemon's\n")
    stop_daemon(proc, signum)
    assert sock.read_text() == "not the daemon's\n"


def test_a_killed_daemons_socket_is_reclaimed_by_the_next(tmp_path):
    """kill -9 leaves the socket behind; the next daemon recognises it as the one the lock file
    recorded, replaces it, and serves."""
    proc = start_daemon(tmp_path)
    proc.kill()
    proc.wait()
    assert (tmp_path / "d.sock").exists()
    proc = start_daemon(tmp_path)
    assert_serving(str(tmp_path / "d.sock"))
    stop_daemon(proc)


def test_a_refused_start_removes_only_the_lock_files_it_made(tmp_path):
    """A --socket that is a folder, a file or a dangling symlink is refused at bind: the lock file
    made for it goes with the refusal (a hostile-input sweep found one left per refused start)."""
    for name, make in [("dir", lambda p: p.mkdir()), ("file", lambda p: p.write_text("x\n")),
                       ("dangling", lambda p: p.symlink_to(tmp_path / "nowhere"))]:
        path = tmp_path / name
        make(path)
        env = dict(os.environ, XSCHED_LV3_BOARD=str(tmp_path / "board"), XSCHED_LV3_SOCKET=str(path))
        result = subprocess.run([sys.executable, "-m", "xsched_lv3", "daemon", "--socket", str(path)], env=env,
                                capture_output=True, text=True, timeout=30)
        assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert not Path(f"{path}.lock").exists() and not (tmp_path / "board.lock").exists(), name
        assert os.path.lexists(path), name                 # what the path named is left alone


def test_a_lock_file_removed_while_another_waited_to_lock_it_is_opened_again(tmp_path, monkeypatch):
    """The one race a removable lock file has: a second daemon opens the name, the first removes the
    file and lets go, the second locks the removed file. It must notice and lock the name's new file,
    or a third daemon would lock that one beside it."""
    import fcntl

    from xsched_lv3 import daemon as daemon_mod
    path = str(tmp_path / "x.lock")
    first = daemon_mod.SingleInstance(path, "x")
    real_flock, calls = fcntl.flock, []

    def flock_after_the_first_let_go(fd, op):
        calls.append(fd)
        if len(calls) == 1:
            first.release()                    # between the second's open and its flock
        return real_flock(fd, op)
    monkeypatch.setattr(daemon_mod.fcntl, "flock", flock_after_the_first_let_go)
    second = daemon_mod.SingleInstance(path, "x")
    assert len(calls) == 2                     # locked the removed file, then the name's new one
    assert os.fstat(second.fd).st_ino == os.stat(path).st_ino
    monkeypatch.setattr(daemon_mod.fcntl, "flock", real_flock)
    with pytest.raises(daemon_mod.DaemonRefused, match="already serves x"):
        daemon_mod.SingleInstance(path, "x")   # a third is refused: one lock for the name
    second.release()
    assert not os.path.exists(path)


def test_a_refused_start_leaves_a_killed_daemons_socket_for_the_next_to_reclaim(tmp_path):
    """kill -9 leaves the socket and the lock file's record of it; a start on that socket that is
    refused (another daemon serves the board) must leave both, or the next start finds a socket no
    record names and refuses to remove it (a review found the record wiped)."""
    killed = start_daemon(tmp_path)
    killed.kill()
    killed.wait()
    other = dict(os.environ, XSCHED_LV3_BOARD=str(tmp_path / "board"), XSCHED_LV3_SOCKET=str(tmp_path / "o.sock"))
    holder = start_daemon(tmp_path, env=other)
    try:
        refused = start_daemon(tmp_path, wait_ready=False)
        _, err = refused.communicate(timeout=30)
        assert refused.returncode == 1 and b"already serves the board" in err, err
        assert (tmp_path / "d.sock").exists() and (tmp_path / "d.sock.lock").exists()
    finally:
        stop_daemon(holder)
    proc = start_daemon(tmp_path)                  # reclaims the killed daemon's socket and serves
    assert_serving(str(tmp_path / "d.sock"))
    stop_daemon(proc)
    assert not (tmp_path / "d.sock").exists() and not (tmp_path / "d.sock.lock").exists()


def test_a_daemon_whose_log_reader_went_away_still_resumes_and_cleans_up_at_sigterm(tmp_path):
    """Its stderr a pipe nobody reads any more: the shutdown's log line must not skip the shutdown
    (it raised BrokenPipeError before resuming anything or removing the socket)."""
    proc = start_daemon(tmp_path)
    proc.stderr.close()                        # the reader of its log goes away
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=READ_TIMEOUT_S) == 0
    assert not (tmp_path / "d.sock").exists() and not (tmp_path / "d.sock.lock").exists()


def test_default_socket_lives_in_a_private_directory(tmp_path):
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = dict(os.environ, XSCHED_LV3_BOARD=str(tmp_path / "board"), XDG_RUNTIME_DIR=str(runtime))
    env.pop("XSCHED_LV3_SOCKET", None)
    proc = start_daemon(tmp_path, env=env)
    folder = runtime / "xsched-lv3"
    assert stat.S_IMODE(folder.lstat().st_mode) == 0o700
    assert stat.S_IMODE((folder / "daemon.sock").lstat().st_mode) == 0o600
    stop_daemon(proc)
    os.chmod(folder, 0o755)                        # a directory others may enter: refused
    result = subprocess.run([sys.executable, "-m", "xsched_lv3", "daemon"], env=env, capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 1 and "mode 0700" in result.stderr and "Traceback" not in result.stderr


def test_only_the_daemons_user_and_root_are_served():
    assert connection_refusal(1000, 1000, 0) is None
    assert connection_refusal(0, 1000, 0) is None
    assert "permission denied" in connection_refusal(1001, 1000, 0)
    assert "too many connections" in connection_refusal(1000, 1000, 10_000)


NOBODY = 65534


@pytest.mark.skipif(os.geteuid() != 0, reason="connecting as another user needs root to switch users")
def test_another_user_cannot_connect_even_through_an_open_socket(tmp_path):
    """The socket is 0600: another user's connect() fails. Were it made 0666 by mistake, in a
    directory others may enter, the daemon still refuses that user (SO_PEERCRED) with one line."""
    shared = Path(tempfile.mkdtemp(prefix="xsched-lv3-test-"))      # /tmp: other users may enter it
    os.chmod(shared, 0o755)
    env = dict(os.environ, XSCHED_LV3_BOARD=str(tmp_path / "board"), XSCHED_LV3_SOCKET=str(shared / "d.sock"))
    proc = start_daemon(tmp_path, env=env)
    probe = ("import socket, sys\n"
             "s = socket.socket(socket.AF_UNIX)\n"
             "try:\n    s.connect(sys.argv[1])\nexcept PermissionError:\n    print('EACCES'); sys.exit()\n"
             "s.settimeout(10); print(s.recv(1000).decode().strip())\n")    # refused at accept: told why
    # the probe needs only the stdlib: a system Python, where ours lives in a folder only root may enter
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    as_nobody = [python, "-c", probe, str(shared / "d.sock")]
    try:
        try:
            first = subprocess.run(as_nobody, user=NOBODY, capture_output=True, text=True, timeout=30)
        except PermissionError:
            pytest.skip(f"user {NOBODY} may not run {python}")
        assert first.stdout.strip() == "EACCES", first
        os.chmod(shared / "d.sock", 0o666)
        second = subprocess.run(as_nobody, user=NOBODY, capture_output=True, text=True, timeout=30)
        assert "permission denied: this daemon serves uid 0" in second.stdout, second
        assert request({"op": "status"}, str(shared / "d.sock"))["clients"] == []
    finally:
        stop_daemon(proc)
        shutil.rmtree(shared)


def test_request_to_a_daemon_that_never_answers_is_one_error(tmp_path):
    mute = socket.socket(socket.AF_UNIX)
    mute.bind(str(tmp_path / "mute.sock"))
    mute.listen(1)
    with pytest.raises(ConnectionError, match="did not answer within 0.3 s"):
        request({"op": "status"}, str(tmp_path / "mute.sock"), timeout=0.3)
    mute.close()


@pytest.mark.parametrize("args,needle", [
    (["--priority", "5.5"], "argument --priority: wants a whole number, got '5.5'"),
    (["--priority", "high"], "argument --priority: wants a whole number"),
    (["--priority", "nan"], "argument --priority: wants a whole number"),
    (["--utilization", "inf"], "must be a finite number"),
    (["--deadline-us", "nan"], "must be a finite number"),
    (["--critical-priority", str(2 ** 40)], "between -1000 and 1000"),
])
def test_cli_hint_values_are_checked_before_anything_is_sent(args, needle):
    result = subprocess.run([sys.executable, "-m", "xsched_lv3", "hint", "--pid", "1", *args, "--socket", "/x"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and needle in result.stderr.strip().splitlines()[-1], result.stderr


def test_status_at_the_daemons_connection_cap_says_why(tmp_path, daemon):
    """Every connection the daemon takes is held open by someone: `status` says the daemon refused and
    why (its cap), then shows the board, instead of "did not answer"."""
    from xsched_lv3.daemon import MAX_CONNECTIONS

    def connect_once_there_is_room(path):
        """A UNIX socket's connect fails with EAGAIN while the daemon's accept backlog is full (a
        busy host): wait for it to accept, as a patient client would."""
        deadline = time.monotonic() + READ_TIMEOUT_S
        while True:
            try:
                return connect(path)
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
    held = [connect_once_there_is_room(daemon) for _ in range(MAX_CONNECTIONS)]
    try:
        assert ask(held[0], STATUS)["clients"] == []         # all taken and served
        env = dict(os.environ, XSCHED_LV3_BOARD=str(tmp_path / "board"), XSCHED_LV3_SOCKET=daemon)
        r = subprocess.run([sys.executable, "-m", "xsched_lv3", "status", "--socket", daemon], env=env,
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        assert "refused" in r.stderr and "too many connections" in r.stderr, r.stderr
    finally:
        for s in held:
            s.close()
    assert_serving(daemon)


def test_a_daemon_leaves_a_live_socket_at_its_wake_name_alone(tmp_path):
    """A daemon whose --socket is another's wake name (PATH.wake) is served by its own lock, not
    ours: before, the second daemon removed the first one's live socket there and bound its wake
    socket in its place. Now it refuses in one line and the first keeps serving."""
    first_socket = wake_path(str(tmp_path / "a.sock"))
    first = start_daemon(tmp_path, env=dict(os.environ, XSCHED_LV3_BOARD=str(tmp_path / "board1"),
                                            XSCHED_LV3_SOCKET=first_socket))
    second = None
    try:
        env = dict(os.environ, XSCHED_LV3_BOARD=str(tmp_path / "board2"), XSCHED_LV3_SOCKET=str(tmp_path / "a.sock"))
        second = start_daemon(tmp_path, env=env, wait_ready=False)
        _, err = second.communicate(timeout=10)
        assert second.returncode == 1 and b"is a socket in use" in err, err
        assert len(err.strip().splitlines()) == 1 and b"Traceback" not in err
        assert not (tmp_path / "a.sock").exists()          # it took nothing back with it either
        assert_serving(first_socket)
    finally:
        if second is not None and second.poll() is None:    # it did start (the defect): not left running
            second.kill()
            second.wait()
        stop_daemon(first)
