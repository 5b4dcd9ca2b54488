"""The simulator server as any local user can reach it: bytes that break the protocol close only
that connection (with a reason in server.log and one error reply), a client that stops reading or
is stopped mid-reply holds up only itself, and the connection limits are enforced by name."""
import errno
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
from kfdtool.sim.protocol import (IOCTL, LEN, MAX_BATCH_CALLS, MAX_FRAME_BYTES, PROTOCOL, REGION, REPLY, frame,
                                  pack_items, recv_frame)
from kfdtool.ratelog import RateLimitedLog

GET_VERSION = BY_NAME["GET_VERSION"].request()
# A client that never reads may cost the others at most this factor of their request rate. A stalled
# server serves the others nothing (their calls time out); a healthy one on a busy 2-CPU CI host has
# been seen at well under half its rate between two 1 s samples, from load alone.
STALL_FACTOR = 5
# Every client socket of these tests gives up after this long, so that a server stuck on one
# client fails the test (SimulatorError, socket.timeout) instead of hanging it.
CALL_TIMEOUT_S = 10


@pytest.fixture(autouse=True)
def client_call_deadline():
    """Sockets created during the test (SimBackend, SimControl, raw ones) time out on each call."""
    old = socket.getdefaulttimeout()
    socket.setdefaulttimeout(CALL_TIMEOUT_S)
    yield
    socket.setdefaulttimeout(old)


@pytest.fixture
def server(tmp_path):
    """Start a private simulated mi210 (a small preset), with server options such as connection limits."""
    procs = []

    def start(*extra, env=None):
        d = tmp_path / f"machine{len(procs)}"
        proc = subprocess.Popen([sys.executable, "-m", "kfdtool.sim.server", "--preset", "mi210", "--dir", str(d),
                                 "--no-realtime", *extra], stdout=subprocess.DEVNULL,
                                stderr=open(tmp_path / f"server{len(procs)}.log", "wb"),
                                env={**os.environ, **(env or {})})
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
    return (b"I" + IOCTL.pack(GET_VERSION, len(arg) if arg_len is None else arg_len,
                              len(regions) if n_regions is None else n_regions, 0) + arg + packed)


MALFORMED = {
    "ioctl-header-cut": frame(b"I" + b"\x01\x02\x03"),
    "ioctl-arg-longer-than-frame": frame(ioctl_body(b"\0" * 8, arg_len=4096)),
    "region-longer-than-frame": frame(ioctl_body(b"\0" * 8, [(0x1000, 1 << 20, b"abc")])),
    "region-count-absurd": frame(ioctl_body(b"\0" * 8, n_regions=0xFFFFFFFF)),
    "bytes-after-regions": frame(ioctl_body(b"\0" * 8) + b"junk"),
    "batch-of-none": frame(b"B" + LEN.pack(0)),
    "batch-over-its-limit": frame(b"B" + pack_items([ioctl_body(b"\0" * 8)[1:]] * (MAX_BATCH_CALLS + 1))),
    "batch-count-absurd": frame(b"B" + LEN.pack(0xFFFFFFFF)),
    "batch-item-cut": frame(b"B" + pack_items([ioctl_body(b"\0" * 8)[1:]])[:-3]),
    "batch-item-malformed": frame(b"B" + pack_items([ioctl_body(b"\0" * 8)[1:], b"\x01\x02"])),
    "batch-bytes-after-items": frame(b"B" + pack_items([ioctl_body(b"\0" * 8)[1:]]) + b"junk"),
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
    assert "closed connection fd" in srv.log() and error in srv.log()
    args = s.kfd_ioctl_get_version_args()
    assert bystander.ioctl(GET_VERSION, args) == 0 and args.major_version == 1
    assert srv.get_version()[0] == 1 and srv.proc.poll() is None
    assert "Traceback" not in srv.log()
    bystander.close()


INTS = [("010", 8), ("0x1000", 4096), ("-0x10", -16), ("+7", 7), ("12\n", 12),      # kstrtoint(s, 0) takes these
        ("08", None), (" 1", None), ("+-1", None), ("1e3", None), ("0x", None), ("1\n\n", None)]   # and not these
BOOLS = [("t", "Y"), ("enable", "Y"), ("on", "Y"), ("onx", "Y"), ("1", "Y"), ("f", "N"), ("disable", "N"),
         ("of", "N"), ("0", "N"), ("n", "N"), ("o", None), ("", None), ("maybe", None)]           # kstrtobool


@pytest.mark.parametrize("name,text,expected", [("noretry", *case) for case in INTS] +
                         [("debug_evictions", *case) for case in BOOLS])
def test_module_parameters_read_as_the_kernel_reads_them(name, text, expected):
    from kfdtool.sim.machine import parse_parameter
    if expected is None:
        with pytest.raises(ValueError, match="wants an integer|wants a boolean"):
            parse_parameter(name, text)
    else:
        assert parse_parameter(name, text) == (name, expected)


@pytest.mark.parametrize("msg,needle", [
    ({"op": "adopt", "pid": [1]}, "control op 'adopt'"),
    ({"op": "adopt", "pid": 10 ** 30}, "control op 'adopt'"),
    ({"op": "adopt", "pid": os.getpid(), "queues": ["x"]}, "control op 'adopt'"),
    ({"op": "adopt", "pid": os.getpid(), "vram": [1, 2]}, "control op 'adopt'"),
    ({"op": "set_waves", "pid": "me"}, "control op 'set_waves'"),
    ({"op": "set_waves", "pid": os.getpid(), "waves": -1}, "waves must be a whole number >= 0"),
    ({"op": "set_waves", "pid": os.getpid(), "waves": 1.5}, "waves must be a whole number >= 0"),
    ({"op": "adopt", "pid": os.getpid(), "vram": {"1": -5}}, "vram must be a whole number >= 0"),
    ({"op": "set_param", "name": "sched_policy", "value": 3}, "sched_policy must be in 0..2"),
    ({"op": "set_param", "name": "cwsr_enable", "value": 2 ** 40}, "cwsr_enable must fit an int"),
    ({"op": "set_param", "name": "debug_evictions", "value": "maybe"}, "debug_evictions wants a boolean"),
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
    valid = [frame(ioctl_body(bytes(8))), frame(b"O"), frame(b'C{"op": "status"}'),
             frame(b"B" + pack_items([ioctl_body(bytes(8))[1:]] * 3))]

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
            payload = rng.choice([b"I", b"B", b"C", b"O", b"R", b"M", b"J"]) + rng.randbytes(rng.randrange(0, 64))
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


def round_trips_per_second(backend, seconds):
    """GET_VERSION calls per second on an opened backend (its setup is not what is measured)."""
    args = s.kfd_ioctl_get_version_args()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        backend.ioctl(GET_VERSION, args)
        n += 1
    return n / (time.perf_counter() - t0)


HOG = r"""
import os, socket, time
from kfdtool.sim.protocol import IOCTL, frame
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect({path!r})
sock.sendall(frame(b"O"))
request = frame(b"I" + IOCTL.pack({request}, 8, 0, 0) + bytes(8))
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
    backend = SimBackend(srv.socket)               # opened before the hog: only calls are timed
    alone = round_trips_per_second(backend, 1.0)
    hog = subprocess.Popen([sys.executable, "-c", HOG.format(path=str(srv.socket),
                                                             request=GET_VERSION)],
                           stdout=subprocess.PIPE, text=True)
    try:
        assert int(hog.stdout.readline()) > 0      # its requests and replies fill both socket buffers
        beside_hog = round_trips_per_second(backend, 1.0)
        assert srv.get_version()[0] == 1           # and a client that connects now is served too
    finally:
        hog.kill()
        hog.wait()
        backend.close()
    assert beside_hog > alone / STALL_FACTOR, (alone, beside_hog)


def test_connections_take_turns_so_a_call_waits_for_one_request_of_a_batch_not_the_batch(server):
    """Another process's posted batch (doorbells, here queue reads) does not delay a call for its
    whole length: with both written while the server was stopped, the call (an adopt that gives a
    process a queue) is handled after one request of the batch, as the batch's replies show."""
    srv = server()
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    batch, call = srv.connect(), srv.connect()
    try:
        with SimControl(srv.socket) as ctl:
            gpu = ctl("status")["gpus"][0]
            ctl("adopt", pid=target.pid, queues=[])        # a KFD process with no queue yet
        n = 200
        read = frame(b"C" + json.dumps({"op": "queues", "pid": target.pid}).encode())
        os.kill(srv.proc.pid, signal.SIGSTOP)
        try:
            batch.sendall(read * n)
            call.sendall(frame(b"C" + json.dumps({"op": "adopt", "pid": target.pid,
                                                  "queues": [{"gpu_id": gpu}]}).encode()))
        finally:
            os.kill(srv.proc.pid, signal.SIGCONT)
        assert "error" not in json.loads(recv_frame(call)[0][1:])
        seen = [len(json.loads(recv_frame(batch)[0][1:])["queues"]) for _ in range(n)]
        assert seen.count(0) <= 2 and seen[-1] == 1, seen[:10]
    finally:
        target.kill()
        target.wait()
        batch.close()
        call.close()


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


def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_an_ioctl_from_a_process_holding_anothers_connection_is_ebadf(server):
    """kfd_chardev.c: kfd_ioctl refuses a caller that is not the fd's opener (`current`, EBADF).
    The caller is who wrote the request, as the kernel tells the server: a forked child writing on
    its parent's opened connection cannot pass for the parent."""
    from simhelpers import in_child
    srv = server()
    backend = SimBackend(srv.socket)              # this process opens /dev/kfd on it
    sock = backend.sock
    request = frame(ioctl_body(bytes(s.kfd_ioctl_get_version_args())))

    def get_version_on_inherited_connection():
        sock.sendall(request)
        reply, _fds = recv_frame(sock)
        return REPLY.unpack_from(reply, 1)[0]

    assert in_child(get_version_on_inherited_connection) == -errno.EBADF
    args = s.kfd_ioctl_get_version_args()
    assert backend.ioctl(GET_VERSION, args) == 0 and args.major_version == 1     # the opener still may
    backend.close()


def test_a_request_written_by_two_processes_closes_the_connection(server):
    """One ioctl is one process's syscall: bytes of one request from two writers break the protocol."""
    from simhelpers import in_child
    srv = server()
    sock = srv.connect()
    request = frame(ioctl_body(bytes(s.kfd_ioctl_get_version_args())))
    sock.sendall(request[:10])
    in_child(sock.sendall, request[10:])
    (length,) = LEN.unpack_from(reply := read_until_closed(sock))
    assert "written by several processes" in json.loads(reply[LEN.size + 1:LEN.size + length])["error"]
    assert srv.get_version()[0] == 1


def test_fds_sent_to_the_server_are_not_kept(server):
    """SCM_RIGHTS from a client: the server passes fds, it never takes any (each would cost it one)."""
    srv = server()
    sock = srv.connect()
    request = frame(ioctl_body(bytes(s.kfd_ioctl_get_version_args())))
    sock.sendall(request)
    recv_frame(sock)                                  # accepted and served: its fd is counted
    with open(os.devnull) as f:
        before = open_fds(srv.proc.pid)
        for _ in range(20):
            socket.send_fds(sock, [request], [f.fileno()] * 8)
            reply, _ = recv_frame(sock)
            assert REPLY.unpack_from(reply, 1)[0] == -errno.EBADF       # served; never opened
    assert open_fds(srv.proc.pid) == before


OPENER = r"""
import json, socket, sys
from kfdtool.sim.protocol import frame, recv_frame
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect({path!r})
print("connected", flush=True)
sys.stdin.readline()                                  # the server has no fd left to watch us with
sock.sendall(frame(b"O"))
print(json.dumps(json.loads(recv_frame(sock)[0][1:])), flush=True)
"""


def test_an_open_the_server_cannot_watch_is_refused_not_leaked(server):
    """A KFD process lives until its OS process exits, which the server learns from a pidfd. Out
    of fds, it cannot watch the opener: the open fails (as kfd_open fails when kfd_create_process
    does) with a logged reason, instead of a KFD process that is never released."""
    import resource
    srv = server()
    ctl = SimControl(srv.socket)
    child = subprocess.Popen([sys.executable, "-c", OPENER.format(path=str(srv.socket))],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "connected\n"
        assert ctl("status")["processes"] == []             # its connection is accepted by now
        fds = {int(fd) for fd in os.listdir(f"/proc/{srv.proc.pid}/fd")}
        lowest_free = min(set(range(len(fds) + 1)) - fds)
        soft, hard = resource.prlimit(srv.proc.pid, resource.RLIMIT_NOFILE)
        resource.prlimit(srv.proc.pid, resource.RLIMIT_NOFILE, (lowest_free, hard))     # no new fd
        try:
            child.stdin.write("go\n")
            child.stdin.flush()
            reply = json.loads(child.stdout.readline())
        finally:
            resource.prlimit(srv.proc.pid, resource.RLIMIT_NOFILE, (soft, hard))
        processes = ctl("status")["processes"]            # (status itself opens a file)
        assert "cannot watch pid" in reply["error"] and "out of file descriptors" in reply["error"]
        assert child.pid not in processes
        assert child.wait(timeout=10) == 0
        assert ctl("status")["processes"] == []
        assert f"cannot watch pid {child.pid}" in srv.log()
    finally:
        child.kill()
        child.wait()
        ctl.close()
    assert srv.get_version()[0] == 1                         # with fds again, opens work


def in_process_server(tmp_path, monkeypatch, record):
    """A SimServer in this process whose requests go to `record(conn, payload)` instead of being handled."""
    from kfdtool.sim.server import SimServer
    srv = SimServer(tmp_path, "mi210", realtime=False)
    monkeypatch.setattr(srv, "_handle", lambda conn, payload, sender: record(conn, payload))
    return srv


def admitted(srv, data):
    """A client of `srv` (the other end of a socketpair it admitted) that has sent `data`."""
    server_end, client_end = socket.socketpair()
    srv._watch(srv._admit(server_end))
    client_end.sendall(data)
    return client_end


def test_requests_read_together_are_handled_in_the_order_they_were_made(tmp_path, monkeypatch):
    """The server applies each request as of when its caller made it and never plays its model back,
    so requests waiting together are handled in that order, whatever order they were read in (a
    later-made one handled first would make an earlier one take effect late). A connection whose
    next request was made before every other one waiting goes on (a doorbell posted right after
    another); an unstamped request (a control op) counts as made when read. Sleepers are looked at
    no later than the earliest stamped request still waiting."""
    handled = []
    srv = in_process_server(tmp_path, monkeypatch, lambda conn, payload: handled.append(payload))
    now = time.monotonic_ns()

    def doorbell(at):
        return frame(b"D" + json.dumps({"op": "dispatch", "qid": 0, "kernels": [[1.0, 1]], "at": at}).encode())

    def call(at):
        return frame(b"I" + IOCTL.pack(GET_VERSION, 8, 0, at) + bytes(8))
    def made(payload):
        kind = payload[:1]
        return json.loads(payload[1:])["at"] if kind == b"D" else IOCTL.unpack_from(payload, 1)[3] if kind == b"I" \
            else "status"
    # written in this order, one connection each but the third
    ms = 1_000_000
    clients = [admitted(srv, data) for data in (frame(b'C{"op": "status"}'), call(now - 4 * ms),
                                          doorbell(now - 6 * ms) + doorbell(now - 5 * ms), doorbell(now - 3 * ms))]
    polled = srv._poll(timeout=0)
    assert srv._horizon_ns(polled) == now - 6 * ms            # not past the earliest one waiting
    srv._take_turns()
    assert [made(p) for p in handled] == [now - 6 * ms, now - 5 * ms, now - 4 * ms, now - 3 * ms, "status"]
    # two processes posting doorbells at the same time: interleaved as made, across rounds too
    handled.clear()
    clients += [admitted(srv, b"".join(doorbell(now - k * ms) for k in (10, 8, 6))),
                admitted(srv, b"".join(doorbell(now - k * ms) for k in (9, 7, 5)))]
    for _ in range(6):                                        # rounds, as the serve loop makes them
        srv._poll(timeout=0)
        srv._take_turns()
    assert [made(p) for p in handled] == [now - k * ms for k in (10, 9, 8, 7, 6, 5)]
    for c in clients:
        c.close()


def test_a_round_stays_bounded_however_many_connect_meanwhile(tmp_path, monkeypatch):
    """Connections that send their first request while a round is under way join it, but a round
    takes at most MAX_BATCH_CALLS requests: a client that keeps connecting cannot keep one round, and
    with it the sleepers' checks, going for good."""
    handled = []
    srv = in_process_server(tmp_path, monkeypatch, lambda conn, payload: handled.append(conn))
    status = frame(b'C{"op": "status"}')
    sockets = [admitted(srv, status)]
    poll = srv._poll

    def poll_while_others_connect(timeout):
        if len(sockets) < 1000:
            sockets.append(admitted(srv, status))
        return poll(timeout)
    monkeypatch.setattr(srv, "_poll", poll_while_others_connect)
    poll(timeout=0)
    srv._take_turns()
    assert len(handled) <= MAX_BATCH_CALLS and srv.backlog      # the round ended; the rest waits for the next
    for c in sockets:
        c.close()


def test_a_batch_deferred_while_its_process_exits_makes_no_more_calls_even_for_a_process_with_its_pid(tmp_path):
    """A b"B"'s next call is made when the one before returns (deferred meanwhile). If the caller's
    process exits meanwhile and a new process gets its pid, the rest is not made: the reply carries
    the calls made before (found by a hostile review: the leftover calls were made as the new
    process, and a DESTROY_QUEUE among them destroyed its queue). Without the exit, all are made."""
    import collections
    from kfdtool.sim.protocol import parse_ioctl, unpack_items
    from kfdtool.sim.server import Batch, Connection, SimServer, _reply_body
    srv = SimServer(tmp_path, "mi210")                        # realtime: a call may return in the future
    me, uid = os.getpid(), os.getuid()
    get_version = parse_ioctl(ioctl_body(bytes(s.kfd_ioctl_get_version_args()))[1:])
    for pid_reused in (False, True):
        server_end, client_end = socket.socketpair()
        conn = Connection(server_end)
        conn.opener = me
        srv.kfd.open_process(me, uid)
        batch = Batch((me, uid), srv.kfd.processes[me], collections.deque([get_version] * 2))
        batch.replies.append(_reply_body(0, b"", {}, 0, 0))   # a first call made, returning in 20 ms
        batch.returned_at = time.monotonic_ns() + 20_000_000
        srv._ioctls(conn, batch)
        assert srv.returning == {conn: batch.returned_at} and conn.batch is batch and conn.sleeping
        if pid_reused:
            srv.kfd.release_process(me)                       # its exit ...
            srv.kfd.open_process(me, uid)                     # ... and another process under its pid
        time.sleep(0.03)
        srv._take_turns()
        assert len(unpack_items(recv_frame(client_end)[0][1:], "batch reply", 3)) == (1 if pid_reused else 3)
        assert not srv.returning and conn.batch is None and not conn.sleeping
        srv._forget(server_end)
        server_end.close()
        client_end.close()


def test_a_simulator_bug_is_logged_through_the_rate_limit_and_answered_eio(tmp_path, monkeypatch, capsys):
    """An exception inside the simulated kernel or a control op is a simulator bug: the call gets
    EIO (or an error reply), and its traceback goes to server.log through the rate limit, so a
    client repeating the call cannot fill the disk."""
    import io
    from kfdtool.sim.server import Connection, SimServer
    srv = SimServer(tmp_path, "mi210", realtime=False)
    srv.log = RateLimitedLog("kfdtool-sim", per_minute=2, stream=io.StringIO())

    def bug(*args, **kwargs):
        raise RuntimeError("a simulator bug")
    monkeypatch.setattr(srv.kfd, "ioctl", bug)
    monkeypatch.setattr(srv, "ctl_status", bug)
    server_end, client_end = socket.socketpair()
    conn = Connection(server_end)
    me = (os.getpid(), os.getuid())
    for _ in range(3):
        srv._handle(conn, ioctl_body(bytes(s.kfd_ioctl_get_version_args())), me)
        assert REPLY.unpack_from(recv_frame(client_end)[0], 1)[0] == -errno.EIO
        srv._handle(conn, b'C{"op": "status"}', me)
        assert "internal simulator error" in json.loads(recv_frame(client_end)[0][1:])["error"]
    log = srv.log.stream.getvalue()
    assert log.count("RuntimeError: a simulator bug") == 2 and srv.log.dropped == 4
    assert "simulator bug in ioctl" in log and "simulator bug in control op 'status'" in log
    assert "Traceback" not in capsys.readouterr().err          # nothing around the log
    server_end.close()
    client_end.close()


def test_a_simulator_exits_with_the_process_named_by_kfdtool_sim_exit_with(server):
    """The suite sets KFDTOOL_SIM_EXIT_WITH to its own pid: killed (-9 included), it leaves no server."""
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    srv = server(env={"KFDTOOL_SIM_EXIT_WITH": str(owner.pid)})
    assert srv.get_version()[0] == 1
    owner.kill()
    owner.wait()
    assert srv.proc.wait(timeout=10) == 0
    assert not srv.socket.exists() and f"pid {owner.pid} exited; stopping" in srv.log()


@pytest.mark.parametrize("value,message", [("soon", "wants a whole number, got 'soon'"), ("99999999999999999999", "no pid is above"),
                                           ("dead", "cannot watch pid")])
def test_a_bad_kfdtool_sim_exit_with_is_one_line_at_start(tmp_path, value, message):
    if value == "dead":
        gone = subprocess.Popen([sys.executable, "-c", ""])
        gone.wait()
        value = str(gone.pid)
    result = subprocess.run([sys.executable, "-m", "kfdtool.sim.server", "--preset", "mi210", "--dir",
                             str(tmp_path / "m")], env={**os.environ, "KFDTOOL_SIM_EXIT_WITH": value},
                            capture_output=True, text=True, timeout=30)
    assert result.returncode != 0 and message in result.stderr.strip().splitlines()[-1]
    assert "Traceback" not in result.stderr


STUCK = r"""
import socket
from kfdtool.sim.client import SimBackend

def test_stuck(tmp_path):
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "kfd.sock"))
    listener.listen()                  # a simulator that accepts, and never answers
    SimBackend(tmp_path / "kfd.sock")
"""


def test_a_stuck_test_fails_at_its_time_limit_instead_of_hanging_the_suite(tmp_path):
    (tmp_path / "test_stuck.py").write_text(STUCK)
    t0 = time.monotonic()
    # a basetemp of its own: pytest's default one prunes every earlier run's directories (slow on a busy host)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
                             "--basetemp", str(tmp_path / "inner"), "test_stuck.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "KFDTOOL_TEST_TIME_LIMIT_S": "1",
                                 "PYTHONPATH": os.path.dirname(__file__)})
    assert result.returncode == 1, result.stdout + result.stderr
    assert "ran past its time limit of 1 s" in result.stdout and "1 failed" in result.stdout
    assert time.monotonic() - t0 < 30


def test_the_log_keeps_a_bounded_rate_and_says_how_much_it_dropped(monkeypatch):
    """A client reconnecting in a loop cannot fill the disk through server.log."""
    import io
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    log = RateLimitedLog("kfdtool-sim", per_minute=3, stream=out)
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


@pytest.mark.parametrize("capture", ["k8sdp-mi210-8x-xgmi", "k8sdp-vega10-1gpu", "rocprofsdk-composite"])
def test_capture_extraction_equals_tarfiles_data_filter(tmp_path, capture):
    """The fast extractor writes what tarfile.extractall(filter="data") writes: names, modes, bytes."""
    import io
    import tarfile
    from kfdtool.sim.machine import _capture_archive, extract_capture
    with tarfile.open(fileobj=io.BytesIO(_capture_archive(capture))) as tar:
        tar.extractall(tmp_path / "tarfile", filter="data")
    extract_capture(capture, tmp_path / "ours")
    assert tree_contents(tmp_path / "ours") == tree_contents(tmp_path / "tarfile")


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
    monkeypatch.setattr(machine, "code_version", lambda: "another kfdtool")  # kfdtool changed: rebuilt
    machine.materialize("mi210", root, machine.PROFILES["1.23"])
    assert props.stat().st_ino != inode and tree_contents(root) == fresh


def _one_call_server(tmp_path, open_reply, reply_to_ioctl):
    """A fake simulated KFD for one client: answers "O" with `open_reply` and one ioctl with
    `reply_to_ioctl()` (a frame). Returns the socket path."""
    import threading
    from kfdtool.sim.protocol import json_frame
    path = tmp_path / "kfd.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)

    def serve():
        with listener:
            conn, _ = listener.accept()
            with conn:
                recv_frame(conn)                           # "O": this process opens /dev/kfd
                conn.sendall(json_frame(open_reply))
                try:
                    recv_frame(conn)                       # the ioctl, unless the client gave up
                except ConnectionError:
                    return
                conn.sendall(reply_to_ioctl())
    threading.Thread(target=serve, daemon=True).start()
    return path


def test_a_call_returns_no_sooner_than_the_moment_its_reply_names(tmp_path):
    """The server answers a call with a modelled cost at once, naming when the call returns (the
    time it sleeps in the kernel); the caller's side sleeps until then, whatever the reply's own
    delay."""
    returns_at = []

    def reply():
        returns_at.append(time.monotonic_ns() + 50_000_000)
        return frame(b"R" + REPLY.pack(0, 0, 0, 0, returns_at[0]))
    kfd = SimBackend(_one_call_server(tmp_path, {"ok": True, "protocol": PROTOCOL}, reply))
    try:
        kfd.ioctl(GET_VERSION, s.kfd_ioctl_get_version_args())
        assert time.monotonic_ns() >= returns_at[0]
    finally:
        kfd.close()


def test_a_reply_naming_a_return_hours_away_is_an_error_not_a_hang(tmp_path):
    hours = time.monotonic_ns() + 3600 * 10**9
    kfd = SimBackend(_one_call_server(tmp_path, {"ok": True, "protocol": PROTOCOL},
                                      lambda: frame(b"R" + REPLY.pack(0, 0, 0, 0, hours))))
    try:
        with pytest.raises(SimulatorError, match="a simulator bug"):
            kfd.ioctl(GET_VERSION, s.kfd_ioctl_get_version_args())
    finally:
        kfd.close()


def test_a_simulator_of_another_protocol_is_refused_with_one_line(tmp_path):
    """An older server (no protocol in its answer to "O") would have its replies misread."""
    with pytest.raises(SimulatorError, match="speaks protocol 1, this kfdtool"):
        SimBackend(_one_call_server(tmp_path, {"ok": True, "pid": 1}, lambda: b""))


def test_starting_a_machine_that_another_simulator_version_runs_says_to_stop_it(tmp_path, monkeypatch):
    from kfdtool.sim import runner
    monkeypatch.setenv("KFDTOOL_SIM_DIR", str(tmp_path))
    sim = runner.start("mi210", realtime=False)
    try:
        info = sim.info
        del info["protocol"]                               # what a server before protocol 2 wrote
        (sim.dir / "machine.json").write_text(json.dumps(info))
        with pytest.raises(SimulatorError, match=rf"another version \(protocol 1, this kfdtool {PROTOCOL}\).*kfdtool sim stop mi210"):
            runner.start("mi210", realtime=False)
    finally:
        runner.stop("mi210")


@pytest.mark.parametrize("module,args,message", [
    ("kfdtool.sim.server", ["--preset", "mi210", "--param", "x"], "wants NAME=VALUE"),
    ("kfdtool.sim.server", ["--preset", "mi210", "--param", "cwsr_enable=on"], "cwsr_enable wants an integer"),
    ("kfdtool.sim.server", ["--preset", "mi210", "--max-connections", "0"], "must be at least 1"),
    ("kfdtool.sim.server", ["--preset", "mi210", "--dir", "/etc/hostname"], "cannot use /etc/hostname"),
    ("kfdtool.sim.workload", ["--sim", "nosuch"], "unknown simulated machine 'nosuch'"),
    ("kfdtool.sim.workload", ["--sim", "vega10"], "simulated vega10 is not running"),
    ("kfdtool.sim.workload", ["--sim", "mi210", "--vram-gib", "nan"], "must be between 0 and"),
    ("kfdtool.sim.workload", ["--sim", "mi210", "--first-gpu", "-1"], "must be at least 0"),
])
def test_the_simulators_own_entry_points_answer_bad_input_in_one_line(tmp_path, module, args, message):
    if module.endswith("server") and "--dir" not in args:
        args = args + ["--dir", str(tmp_path / "m")]
    env = {**os.environ, "KFDTOOL_SIM_DIR": str(tmp_path / "sims")}    # no machine runs there
    result = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=30,
                            env=env)
    assert result.returncode != 0 and message in result.stderr.strip().splitlines()[-1], result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("item", [b"abc", REPLY.pack(0, 0, 5, 0, 0)], ids=["cut-short", "regions-missing"])
def test_a_malformed_batch_reply_is_one_simulator_error(tmp_path, item):
    """A b"M" whose item is cut short or announces regions it lacks is the simulator's fault:
    SimulatorError, never a struct or protocol exception escaping to the caller (found in review)."""
    from kfdtool.sim.protocol import pack_items
    backend = SimBackend(_one_call_server(tmp_path, {"ok": True, "protocol": PROTOCOL},
                                          lambda: frame(b"M" + pack_items([item]))))
    try:
        with pytest.raises(SimulatorError, match="answered a batch of ioctls wrongly"):
            backend.ioctls([(GET_VERSION, s.kfd_ioctl_get_version_args())])
    finally:
        backend.close()

