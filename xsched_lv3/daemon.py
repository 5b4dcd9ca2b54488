"""The multi-process scheduler daemon: `xsched-lv3 daemon --policy hpf`.

Processes register over a unix socket (no TCP listener); the peer's pid and uid come from
SO_PEERCRED, never from the message. The daemon owns the board's policy, gives each client a slot,
applies hints (only root or the owner of the target process may change its hints), and notices dead
clients through pidfds, releasing their slots so nobody waits on them.
Protocol: one JSON object per line, one reply per request.
"""
import json
import os
import selectors
import signal
import socket
import struct

from kfdtool.pids import ExitWatch

from .board import Board, default_path
from .policy import POLICIES, check_hint

CRED = struct.Struct("3i")


def default_socket():
    base = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    return os.environ.get("XSCHED_LV3_SOCKET") or f"{base}/xsched-lv3-{os.getuid()}.sock"


def may_change(peer_uid, target_pid):
    """Only root or the owner of the target process may change its hints."""
    if peer_uid == 0:
        return True
    try:
        return os.stat(f"/proc/{target_pid}").st_uid == peer_uid
    except OSError:
        return False


class Daemon:
    def __init__(self, policy="hpf", socket_path=None, board_path=None):
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
        self.socket_path = socket_path or default_socket()
        self.board = Board(board_path or default_path())
        self.board.set_policy(policy)
        self.sel = selectors.DefaultSelector()
        self.exits = ExitWatch(self.sel)
        self.running = True

    def serve(self, ready=None):
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.socket_path)
        os.chmod(self.socket_path, 0o666)
        listener.listen(64)
        self.sel.register(listener, selectors.EVENT_READ, ("listen", None))
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "running", False))
        for _, pid, *_rest in self.board.clients():
            self._watch(pid)
        if ready:
            ready()
        while self.running:
            for key, _ in self.sel.select(timeout=0.5):
                kind, obj = key.data
                if kind == "listen":
                    conn, _ = listener.accept()
                    pid, uid, _gid = CRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, CRED.size))
                    self.sel.register(conn, selectors.EVENT_READ, ("conn", [conn, pid, uid, b""]))
                elif kind == "conn":
                    self._on_data(obj)
                else:
                    self._on_exit(obj)
        listener.close()
        os.unlink(self.socket_path)

    def _on_data(self, state):
        conn, pid, uid, buf = state
        data = conn.recv(65536)
        if not data:
            self.sel.unregister(conn)
            conn.close()
            return
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            try:
                reply = self.handle(json.loads(line), pid, uid)
            except (ValueError, KeyError, TypeError) as e:
                reply = {"error": str(e) if str(e) else type(e).__name__}
            conn.sendall(json.dumps(reply).encode() + b"\n")
        state[3] = buf

    def handle(self, msg, peer_pid, peer_uid):
        op = msg.get("op")
        if op == "register":
            slot = self.board.allocate(peer_pid, check_hint("priority", msg.get("priority", 0)))
            self._watch(peer_pid)
            return {"ok": True, "slot": slot}
        if op == "status":
            return {"ok": True, "policy": self.board.policy(), "clients": [
                {"slot": s, "pid": p, "tid": t, "priority": prio, "active": a, "device": d}
                for s, p, t, prio, a, d in self.board.clients()]}
        if op == "hint":
            target = int(msg["pid"])
            value = check_hint(msg["name"], msg["value"])
            if not may_change(peer_uid, target):
                return {"error": f"permission denied: only root or the owner of pid {target} may change its hints"}
            slots = [s for s, p, *_ in self.board.clients() if p == target]
            if not slots:
                return {"error": f"pid {target} is not scheduled"}
            for s in slots:
                self.board.set_hint(s, msg["name"], value)
            return {"ok": True, "slots": slots}
        if op == "policy":
            if peer_uid not in (0, os.getuid()):
                return {"error": "permission denied: only root or the daemon's user may change the policy"}
            if msg.get("name") not in POLICIES:
                return {"error": f"unknown policy {msg.get('name')!r}; choose one of {', '.join(POLICIES)}"}
            self.board.set_policy(msg["name"])
            return {"ok": True}
        return {"error": f"unknown op {op!r}; one of register, status, hint, policy"}

    def _watch(self, pid):
        if not self.exits.watch(pid):
            self.board.reap()              # already gone: release its slots now

    def _on_exit(self, pid):
        self.exits.exited(pid)
        for slot, owner, *_ in self.board.clients():
            if owner == pid:
                self.board.release(slot)


def request(msg, socket_path=None):
    """One request to the daemon; raises ConnectionError if it is not running."""
    path = socket_path or default_socket()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as e:
        sock.close()
        raise ConnectionError(f"no xsched-lv3 daemon at {path} ({e.strerror}); start one with `xsched-lv3 daemon`")
    with sock:
        sock.sendall(json.dumps(msg).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            buf += chunk
    return json.loads(buf)
