"""The simulator server as any local user can reach it: bytes that break the protocol close only
that connection (with a reason in server.log and one error reply), a client that stops reading or
is stopped mid-reply holds up only itself, and the connection limits are enforced by name."""
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

import pytest

from kfdtool.errors import SimulatorError
from kfdtool.ioctls import structs as s
from kfdtool.ioctls.requests import BY_NAME
from kfdtool.sim.client import SimBackend
from kfdtool.sim.control import SimControl
from kfdtool.sim.protocol import IOCTL, LEN, MAX_FRAME_BYTES, REGION, frame, recv_frame
from kfdtool.sim.server import RateLimitedLog

GET_VERSION = BY_NAME["GET_VERSION"].request()
# A client that never reads may cost the others at most this factor of their request rate: the
# server stops reading from it, so what is left is scheduling noise on a small CI box.
STALL_FACTOR = 2


@pytest.fixture
def server(tmp_path):
    """Start a private simulated mi210 (a small preset), with server options such as connection limits."""
    procs = []

    def start(*extra):
        d = tmp_path / f"machine{len(procs)}"
        proc = subprocess.Popen([sys.executable, "-m", "kfdtool.sim.server", "--preset", "mi210", "--dir", str(d),
                                 "--no-realtime", *extra], stdout=subprocess.DEVNULL,
                                stderr=open(tmp_path / f"server{len(procs)}.log", "wb"))
        procs.append(proc)
        deadline = time.monotonic() + 30
        while not (d / "ready").exists():
            assert proc.poll() is None, (tmp_path / f"server{len(procs) - 1}.log").read_text()
            assert time.monotonic() < deadline
            time.sleep(0.02)
        return Server(d / "kfd.sock", tmp_path / f"server{len(procs) - 1}.log", proc)
    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


class Server:
    def __init__(self, socket_path, log_path, proc):
        self.socket, self.log_path, self.proc = socket_path, log_path, proc

    def log(self):
        return self.log_path.read_text()

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(self.socket))
        sock.settimeout(10)
        return sock

    def get_version(self):
        """One GET_VERSION round trip through the real client: the simulated KFD answers."""
        backend = SimBackend(self.socket)
        try:
            args = s.kfd_ioctl_get_version_args()
            assert backend.ioctl(GET_VERSION, args) == 0
            return args.major_version, args.minor_version
        finally:
            backend.close()


def read_until_closed(sock):
    """Everything the server sends before it closes the connection (a timeout fails the test)."""
    data = b""
    while chunk := sock.recv(1 << 16):
        data += chunk
    return data


def ioctl_body(arg=b"", regions=(), n_regions=None, arg_len=None):
    packed = b"".join(REGION.pack(addr, length) + data for addr, length, data in regions)
    return (b"I" + IOCTL.pack(GET_VERSION, os.getpid(), len(arg) if arg_len is None else arg_len,
                              len(regions) if n_regions is None else n_regions) + arg + packed)


MALFORMED = {
    "ioctl-header-cut": frame(b"I" + b"\x01\x02\x03"),
    "ioctl-arg-longer-than-frame": frame(ioctl_body(b"\0" * 8, arg_len=4096)),
    "region-longer-than-frame": frame(ioctl_body(b"\0" * 8, [(0x1000, 1 << 20, b"abc")])),
    "region-count-absurd": frame(ioctl_body(b"\0" * 8, n_regions=0xFFFFFFFF)),
    "bytes-after-regions": frame(ioctl_body(b"\0" * 8) + b"junk"),
    "empty-message": frame(b""),
    "unknown-kind": frame(b"Zhello"),
    "oversized-frame": LEN.pack(MAX_FRAME_BYTES + 1) + b"C",
    "control-not-json": frame(b'C{"op": "status"'),
    "control-not-utf8": frame(b"C\xff\xfe\x00"),
    "control-json-array": frame(b'C["status"]'),
    "control-nested-too-deep": frame(b"C" + b"[" * 200_000),
}


@pytest.mark.parametrize("name", MALFORMED)
def test_malformed_message_closes_only_its_connection_with_a_reason(server, name):
    srv = server()
    bystander = SimBackend(srv.socket)            # opened before: must keep working
    bad = srv.connect()
    bad.sendall(MALFORMED[name])
    reply = read_until_closed(bad)                # the server closes it, after one error reply
    (length,) = LEN.unpack_from(reply)
    error = json.loads(reply[LEN.size + 1:LEN.size + length])["error"]
    assert error.startswith("protocol error: ")
    assert f"closed connection fd" in srv.log() and error in srv.log()
    args = s.kfd_ioctl_get_version_args()
    assert bystander.ioctl(GET_VERSION, args) == 0 and args.major_version == 1
    assert srv.get_version()[0] == 1 and srv.proc.poll() is None
    assert "Traceback" not in srv.log()
    bystander.close()


@pytest.mark.parametrize("msg,needle", [
    ({"op": "adopt", "pid": [1]}, "control op 'adopt'"),
    ({"op": "adopt", "pid": 10 ** 30}, "control op 'adopt'"),
    ({"op": "adopt", "pid": os.getpid(), "queues": ["x"]}, "control op 'adopt'"),
    ({"op": "adopt", "pid": os.getpid(), "vram": [1, 2]}, "control op 'adopt'"),
    ({"op": "set_waves", "pid": "me"}, "control op 'set_waves'"),
    ({"op": "adopt", "pid": os.getpid(), "queues": [{"gpu_id": 0}]}, "control op 'adopt'"),
    ({"op": "evict"}, "control op 'evict': missing field 'pid'"),
    ({"op": ["status"]}, "unknown control op"),
    ({}, "unknown control op None"),
])
def test_control_fields_of_the_wrong_kind_are_an_error_reply_not_a_crash(server, msg, needle):
    """Well-formed JSON with bad fields is the caller's error: one error reply, the connection stays."""
    srv = server()
    with SimControl(srv.socket) as ctl:
        with pytest.raises(SimulatorError, match=needle.replace("(", r"\(")):
            ctl.call_json(b"C" + json.dumps(msg).encode())
        assert ctl("status")["preset"] == "mi210"           # same connection, still served
    assert "Traceback" not in srv.log()


def test_fuzzed_framing_from_several_connections_leaves_the_server_serving(server):
    """Random, truncated, oversized and mutated frames from 8 connections at once, then a
    well-formed GET_VERSION on a new connection is answered."""
    srv = server()
    rng = random.Random(9)
    valid = [frame(ioctl_body(bytes(8))), frame(b"O"), frame(b'C{"op": "status"}')]

    def fuzz_frame():
        choice = rng.randrange(6)
        if choice == 0:                                      # random bytes
            return rng.randbytes(rng.randrange(1, 200))
        if choice == 1:                                      # a valid frame cut short
            f = rng.choice(valid)
            return f[:rng.randrange(1, len(f))]
        if choice == 2:                                      # a valid frame with bytes flipped
            f = bytearray(rng.choice(valid))
            for _ in range(rng.randrange(1, 4)):
                f[rng.randrange(len(f))] = rng.randrange(256)
            return bytes(f)
        if choice == 3:                                      # a length header out of range
            return LEN.pack(rng.randrange(MAX_FRAME_BYTES, 1 << 32)) + rng.randbytes(16)
        if choice == 4:                                      # a valid header, a random payload
            payload = rng.choice([b"I", b"C", b"O", b"R", b"J"]) + rng.randbytes(rng.randrange(0, 64))
            return frame(payload)
        return rng.choice(valid)                             # well-formed, amid the noise

    for _round in range(6):
        socks = [srv.connect() for _ in range(8)]
        for sock in socks:
            sock.setblocking(False)
            for _ in range(rng.randrange(1, 20)):
                try:
                    sock.send(fuzz_frame())
                except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                    break
        for sock in socks:
            if rng.random() < 0.5:
                sock.shutdown(socket.SHUT_WR)               # some hang up at once, some linger
            else:
                sock.close()
        assert srv.get_version()[0] == 1
        for sock in socks:
            sock.close()
    assert srv.proc.poll() is None and srv.get_version()[0] == 1
    assert "protocol error" in srv.log() and "Traceback" not in srv.log()


def round_trips_per_second(srv, seconds):
    backend = SimBackend(srv.socket)
    args = s.kfd_ioctl_get_version_args()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        backend.ioctl(GET_VERSION, args)
        n += 1
    backend.close()
    return n / (time.perf_counter() - t0)


HOG = r"""
import os, socket, time
from kfdtool.sim.protocol import IOCTL, frame
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect({path!r})
sock.sendall(frame(b"O"))
request = frame(b"I" + IOCTL.pack({request}, os.getpid(), 8, 0) + bytes(8))
sock.setblocking(False)
sent = 0
while True:                       # pipeline requests, never read a reply, until nothing more fits
    try:
        sent += sock.send(request * 64)
    except BlockingIOError:
        break
print(sent, flush=True)
time.sleep(60)
"""


def test_a_client_that_never_reads_leaves_the_others_their_request_rate(server):
    srv = server()
    alone = round_trips_per_second(srv, 1.0)
    hog = subprocess.Popen([sys.executable, "-c", HOG.format(path=str(srv.socket),
                                                             request=GET_VERSION)],
                           stdout=subprocess.PIPE, text=True)
    try:
        assert int(hog.stdout.readline()) > 0      # its requests and replies fill both socket buffers
        beside_hog = round_trips_per_second(srv, 1.0)
    finally:
        hog.kill()
        hog.wait()
    assert beside_hog > alone / STALL_FACTOR, (alone, beside_hog)


STOPPED = r"""
import json, os, signal, socket, sys
from kfdtool.sim.protocol import LEN, frame, recv_exact
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect({path!r})
sys.stdin.readline()                                  # adopted, with many queues
sock.sendall(frame(b"C" + json.dumps({{"op": "queues", "pid": os.getpid()}}).encode()))
(length,) = LEN.unpack(recv_exact(sock, LEN.size))
first = recv_exact(sock, 100)
os.kill(os.getpid(), signal.SIGSTOP)                   # stopped in the middle of the reply
reply = json.loads((first + recv_exact(sock, length - 100))[1:])
print(length, len(reply["queues"]), flush=True)
"""


def test_a_client_stopped_mid_large_reply_does_not_stall_others_and_gets_it_whole_later(server):
    srv = server()
    child = subprocess.Popen([sys.executable, "-c", STOPPED.format(path=str(srv.socket))],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        with SimControl(srv.socket) as ctl:
            gpu = ctl("status")["gpus"][0]
            ctl("adopt", pid=child.pid, queues=[{"gpu_id": gpu}] * 1024)
        child.stdin.write("go\n")
        child.stdin.flush()
        _, status = os.waitpid(child.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status)
        t0 = time.monotonic()
        for _ in range(200):                        # the reply it is stopped in is larger than a socket buffer
            assert srv.get_version()[0] == 1
        assert time.monotonic() - t0 < 10
        os.kill(child.pid, signal.SIGCONT)
        length, queues = map(int, child.stdout.readline().split())
        with open("/proc/sys/net/core/wmem_default") as f:
            assert length > int(f.read())            # more than the server's socket buffer takes at once
        assert queues == 1024
    finally:
        child.kill()
        child.wait()


def test_a_client_closing_mid_reply_is_logged_and_forgotten(server):
    srv = server()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with SimControl(srv.socket) as ctl:
            gpu = ctl("status")["gpus"][0]
            ctl("adopt", pid=child.pid, queues=[{"gpu_id": gpu}] * 1024)
        sock = srv.connect()
        sock.sendall(frame(b"C" + json.dumps({"op": "queues", "pid": child.pid}).encode()))
        assert len(sock.recv(100)) > 0              # the reply has begun
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
        sock.close()
        assert srv.get_version()[0] == 1
        deadline = time.monotonic() + 5
        while "went away mid-reply" not in srv.log():
            assert time.monotonic() < deadline, srv.log()
            time.sleep(0.05)
    finally:
        child.kill()
        child.wait()


def test_connection_limits_refuse_with_the_limits_name(server):
    srv = server("--max-connections-per-uid", "3", "--max-connections", "5")
    held = [srv.connect() for _ in range(3)]
    for sock in held:
        sock.sendall(frame(b"O"))
        assert json.loads(recv_frame(sock)[0][1:])["ok"]
    with pytest.raises(SimulatorError, match="MAX_CONNECTIONS_PER_UID"):
        srv.get_version()
    assert "MAX_CONNECTIONS_PER_UID" in srv.log()
    held.pop().close()
    time.sleep(0.1)                                  # the server sees the close
    assert srv.get_version()[0] == 1                 # a freed slot is usable again
    for sock in held:
        sock.close()


def test_the_total_connection_limit_covers_every_user(server):
    srv = server("--max-connections", "2")
    held = [srv.connect() for _ in range(2)]
    for sock in held:
        sock.sendall(frame(b"O"))
        recv_frame(sock)
    with pytest.raises(SimulatorError, match=r"too many connections \(2, the server's MAX_CONNECTIONS\)"):
        SimControl(srv.socket)("status")
    for sock in held:
        sock.close()


def test_the_log_keeps_a_bounded_rate_and_says_how_much_it_dropped(monkeypatch):
    """A client reconnecting in a loop cannot fill the disk through server.log."""
    import io
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    log = RateLimitedLog(per_minute=3, stream=out)
    for i in range(10):
        log(f"line {i}")
    assert out.getvalue().count("kfdtool-sim: line") == 3
    clock[0] += 61
    log("later")
    assert "(7 log lines dropped in the last minute)" in out.getvalue() and "later" in out.getvalue()



# --- `kfdtool sim start`: the sysfs tree is built once per preset, ABI and code version -------------

def tree_contents(root):
    """{relative path: (permission bits, bytes or None for a directory)} of everything under root
    but the stamp saying what the tree was built from."""
    from kfdtool.sim.machine import TREE_STAMP
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(dirpath, name)
            if os.path.relpath(path, root) == TREE_STAMP:
                continue
            st = os.lstat(path)
            data = None
            if not os.path.isdir(path):
                with open(path, "rb") as f:
                    data = f.read()
            out[os.path.relpath(path, root)] = (st.st_mode, data)
    return out


# (the extractor against tarfile's data filter, every capture: tests/test_sim_start.py)


def test_materialize_keeps_a_current_tree_and_rebuilds_a_changed_or_stale_one(tmp_path, monkeypatch):
    from kfdtool.sim import machine
    root = tmp_path / "sys"
    topo = machine.materialize("mi210", root, machine.PROFILES["1.23"])
    fresh = tree_contents(root)
    props = next(p for p in sorted(topo.glob("nodes/*/properties")) if b"simd_count 0" not in p.read_bytes())
    inode = props.stat().st_ino
    (topo.parent / "proc" / "4242").mkdir()                                 # a process of the last run
    (root / "module" / "amdgpu" / "parameters" / "sched_policy").write_text("2\n")   # its --param
    machine.materialize("mi210", root, machine.PROFILES["1.23"])
    assert props.stat().st_ino == inode                                     # kept, not rewritten
    assert tree_contents(root) == fresh                                     # and a fresh boot all the same

    props.write_text("simd_count 0\n")                                      # changed by hand: rebuilt
    machine.materialize("mi210", root, machine.PROFILES["1.23"])
    assert tree_contents(root) == fresh

    machine.materialize("mi210", root, machine.PROFILES["1.17"])          # another kernel profile
    assert b"cwsr_size" not in props.read_bytes()
    machine.materialize("mi210", root, machine.PROFILES["1.23"])
    assert tree_contents(root) == fresh

    inode = props.stat().st_ino
    monkeypatch.setattr(machine, "tree_source_digest", lambda capture: "other")  # its code changed: rebuilt
    machine.materialize("mi210", root, machine.PROFILES["1.23"])
    assert props.stat().st_ino != inode and tree_contents(root) == fresh
