"""The simulated KFD server: one process owns the simulated kernel and the sysfs tree; GPU
processes connect over a unix socket. The peer's pid and uid come from SO_PEERCRED, and the
process lives until the OS process exits (watched with a pidfd), like the kernel's kfd_process,
which outlives close() and dies with the mm — kill -9 included.

    python -m kfdtool.sim.server --preset mi308x --dir /tmp/kfdtool-sim-0/mi308x
"""
import argparse
import errno
import json
import os
import selectors
import signal
import socket
import struct
import sys
import traceback
from pathlib import Path

from ..pids import ExitWatch
from .errors import Blocked, SimErrno
from .kernel import SimKfd
from .machine import DEFAULT_PARAMETERS, find_profile, materialize
from .memory import UserMemory
from .protocol import IOCTL, REPLY, frame, pack_regions, send_json, unpack_regions
from .state import SimQueue
from .timing import max_waves

CRED = struct.Struct("3i")


class Connection:
    def __init__(self, sock):
        self.sock = sock
        self.buf = bytearray()
        self.pid, self.uid, _gid = CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, CRED.size))
        self.kfd_open = False


class SimServer:
    def __init__(self, state_dir, preset, abi="1.23", parameters=None, realtime=True, patched_preempt=False):
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.sysfs_root = self.dir / "sys"
        self.profile = find_profile(abi)
        self.params = {**DEFAULT_PARAMETERS, **(parameters or {})}
        materialize(preset, self.sysfs_root, self.profile, self.params)
        (self.dir / "machine.json").write_text(json.dumps(
            {"preset": preset, "abi": abi, "release": self.profile.release, "pid": os.getpid()}))
        self.kfd = SimKfd(self.sysfs_root, self.profile, self.params)
        self.kfd.patched_preempt = patched_preempt
        self.kfd.timing.realtime = realtime
        self.kfd.smi.on_close = self._forget
        self.sel = selectors.DefaultSelector()
        self.exits = ExitWatch(self.sel)   # a KFD process lives until its OS process exits
        self.blocked = []             # (conn, Blocked, out bytes)
        self.running = True
        self.opens = 0                # /dev/kfd opens since start (read-only tools must not add any)
        self.socket_path = self.dir / "kfd.sock"

    # --- main loop --------------------------------------------------------------------------------
    def serve(self):
        if self.socket_path.exists():
            self.socket_path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.socket_path))
        os.chmod(self.socket_path, 0o666)      # like /dev/kfd: any user may open it
        listener.listen(256)
        listener.setblocking(False)
        self.sel.register(listener, selectors.EVENT_READ, ("listen", None))
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "running", False))
        (self.dir / "ready").write_text(str(os.getpid()))
        while self.running:
            for key, _ in self.sel.select(timeout=0.5):
                kind, obj = key.data
                if kind == "listen":
                    self._accept(listener)
                elif kind == "conn":
                    self._on_data(obj)
                elif kind == "pidfd":
                    self._on_exit(obj)
                elif kind == "smi":
                    self.kfd.smi.on_readable(obj)
            self._retry_blocked()
            self._register_smi()
        for path in (self.dir / "ready", self.socket_path):     # `stop` waits for the socket to go
            path.unlink(missing_ok=True)

    def _accept(self, listener):
        try:
            sock, _ = listener.accept()
        except BlockingIOError:
            return
        sock.setblocking(True)
        self.sel.register(sock, selectors.EVENT_READ, ("conn", Connection(sock)))

    def _on_data(self, conn):
        try:
            data = conn.sock.recv(1 << 20)
        except OSError:
            data = b""
        if not data:
            self.sel.unregister(conn.sock)
            conn.sock.close()
            self.blocked = [b for b in self.blocked if b[0] is not conn]
            return
        conn.buf += data
        while len(conn.buf) >= 4:
            length = int.from_bytes(conn.buf[:4], "little")
            if len(conn.buf) < 4 + length:
                break
            payload, conn.buf = bytes(conn.buf[4:4 + length]), conn.buf[4 + length:]
            self._handle(conn, payload)

    def _handle(self, conn, payload):
        kind, body = payload[:1], payload[1:]
        try:
            if kind == b"O":
                self._open(conn)
                send_json(conn.sock, {"ok": True, "pid": conn.pid})
            elif kind == b"I":
                self._ioctl(conn, body)
            elif kind == b"C":
                send_json(conn.sock, self._control(conn, json.loads(body)))
            else:
                send_json(conn.sock, {"error": f"unknown message kind {kind!r}"})
        except (BrokenPipeError, ConnectionResetError):
            pass

    # --- /dev/kfd -------------------------------------------------------------------------------
    def _open(self, conn):
        if conn.kfd_open:
            return
        conn.kfd_open = True
        self.opens += 1
        self.exits.watch(conn.pid)
        self.kfd.open_process(conn.pid, conn.uid)

    def _on_exit(self, pid):
        self.exits.exited(pid)
        self.kfd.release_process(pid)
        self.kfd.timing.settle()

    def _ioctl(self, conn, body):
        request, caller_pid, arg_len, n_regions = IOCTL.unpack_from(body)
        offset = IOCTL.size
        arg = body[offset:offset + arg_len]
        regions, _ = unpack_regions(body, offset + arg_len, n_regions)
        # no KFD process behind a connection that never opened: the kernel decides (nr, then EBADF)
        proc = self.kfd.processes.get(conn.pid) if conn.kfd_open else None
        mem = UserMemory(regions)
        try:
            ret, out = self.kfd.ioctl(proc, caller_pid, request, arg, mem, conn.uid)
        except Blocked as blocked:
            self.blocked.append((conn, blocked, bytes(arg)))
            return
        except Exception:                      # a simulator bug must not take the machine down
            traceback.print_exc()
            ret, out = -errno.EIO, b""
        self.kfd.timing.settle()
        self._reply(conn, ret, out, mem.copied_to_user)

    def _reply(self, conn, ret, out, regions):
        fds = self.kfd.smi.pending_fds
        self.kfd.smi.pending_fds = []
        msg = frame(b"R" + REPLY.pack(ret, len(out), len(regions), len(fds)) + out + pack_regions(regions.items()))
        if fds:
            socket.send_fds(conn.sock, [msg[:1]], [f.fileno() for f in fds])
            conn.sock.sendall(msg[1:])
            for f in fds:
                f.close()
        else:
            conn.sock.sendall(msg)

    def _retry_blocked(self):
        while True:
            ready = [b for b in self.blocked if b[1].ready()]
            if not ready:
                return
            for entry in ready:
                self.blocked.remove(entry)
                conn, blocked, out = entry
                try:
                    ret = blocked.finish()
                except SimErrno as e:
                    ret = -e.errno
                self.kfd.timing.settle()
                try:
                    self._reply(conn, ret, out, {})
                except OSError:
                    pass

    def _forget(self, sock):
        try:
            self.sel.unregister(sock)
        except (KeyError, ValueError):
            pass

    def _register_smi(self):
        for fileno, client in self.kfd.smi.clients.items():
            try:
                self.sel.get_key(fileno)
            except KeyError:
                self.sel.register(client.sock, selectors.EVENT_READ, ("smi", fileno))

    # --- control (simulation-only operations, never part of the KFD ABI) ----------------------
    def _control(self, conn, msg):
        # /dev/kfd is open to every user, the simulation's own levers are not: only the user who
        # started this machine (or root) may adopt, evict, change waves or parameters, or stop it
        if conn.uid not in (0, os.getuid()):
            return {"error": f"permission denied: simulated {self.dir.name} belongs to uid {os.getuid()}; "
                             f"its control channel is the owner's (or root's)"}
        op = msg.get("op")
        handler = getattr(self, f"ctl_{op}", None)
        if handler is None:
            return {"error": f"unknown control op {op!r}"}
        try:
            return {"ok": True, **(handler(conn, msg) or {})}
        except (KeyError, ValueError, SimErrno) as e:
            return {"error": str(e) or type(e).__name__}

    def _proc(self, msg):
        proc = self.kfd.processes.get(int(msg["pid"]))
        if proc is None:
            raise ValueError(f"pid {msg['pid']} is not a simulated KFD process")
        return proc

    def ctl_status(self, conn, msg):
        return {"preset": json.loads((self.dir / "machine.json").read_text())["preset"],
                "abi": str(self.kfd.abi), "release": self.profile.release, "sysfs_root": str(self.sysfs_root),
                "gpus": list(self.kfd.devices), "processes": sorted(self.kfd.processes),
                "queues": sum(len(p.queues) for p in self.kfd.processes.values()), "opens": self.opens}

    def ctl_adopt(self, conn, msg):
        """Make an existing OS process a KFD process with queues, without it speaking the
        protocol (cheap bulk workloads for benchmarks); it is released when it exits."""
        pid = int(msg["pid"])
        uid = int(msg.get("uid", conn.uid))
        if conn.uid != 0:                          # a user adopts only its own processes, as itself
            try:
                owner = os.stat(f"/proc/{pid}").st_uid
            except OSError:
                raise ValueError(f"pid {pid} does not exist") from None
            if uid != conn.uid or owner != conn.uid:
                raise ValueError(f"permission denied: uid {conn.uid} may adopt only its own processes, as itself")
        if not self.exits.watch(pid):
            raise ValueError(f"pid {pid} does not exist")
        proc = self.kfd.open_process(pid, uid)
        proc.runtime_state = 1
        for spec in msg.get("queues", []):
            gpu = int(spec["gpu_id"])
            self.kfd.device(gpu)
            qid = proc.lowest_free_qid()
            q = SimQueue(qid, gpu, int(spec.get("type", 2)), 0x7F00_0000_0000 + qid * 0x10_0000,
                         int(spec.get("ring_size", 1 << 20)), 0, 0, 0, 0, 0, 100, int(spec.get("priority", 7)))
            q.exception_status = 0
            proc.queues = {qid: q, **proc.queues}
            self.kfd.sysfs.add_queue(pid, qid, q.ring_size, self.kfd._sysfs_type(q.queue_type), gpu)
        for gpu, size in msg.get("vram", {}).items():
            proc.vram[int(gpu)] = int(size)
            self.kfd.sysfs.set(pid, f"vram_{gpu}", size)
        return {"queues": len(proc.queues)}

    def ctl_set_waves(self, conn, msg):
        proc = self._proc(msg)
        for q in proc.queues.values():
            if msg.get("qid") is None or q.qid == int(msg["qid"]):
                q.sync_progress()
                q.resident_waves = min(int(msg["waves"]), max_waves(self.kfd.devices[q.gpu_id].node))
                q.sync_progress()
        self._refresh_occupancy(proc)
        return {}

    def _refresh_occupancy(self, proc):
        """cu_occupancy = ceil(waves in flight / wave slots per CU), at most the CU count."""
        for gpu in {q.gpu_id for q in proc.queues.values()}:
            node = self.kfd.devices[gpu].node
            per_cu = node.props.get("max_waves_per_simd", 8) * node.props.get("simd_per_cu", 4)
            waves = sum(q.resident_waves for q in proc.queues_on(gpu) if q.is_active)
            self.kfd.sysfs.set(proc.pid, f"stats_{gpu}/cu_occupancy", min(node.cu_count, -(-waves // per_cu)))

    def ctl_queues(self, conn, msg):
        proc = self._proc(msg)
        out = []
        for q in proc.queues.values():
            q.sync_progress()
            out.append({"qid": q.qid, "gpu_id": q.gpu_id, "active": q.is_active, "suspended": q.is_suspended,
                        "evicted": q.is_evicted, "percent": q.percent, "progress_ns": q.progress_ns,
                        "resident_waves": q.resident_waves, "saved_wave_bytes": q.saved_wave_bytes,
                        "ring_base": q.ring_base, "ring_size": q.ring_size,
                        "debugger": proc.debugger.pid if proc.debugger else None})
        return {"queues": out}

    def ctl_read_memory(self, conn, msg):
        """Stand-in for /proc/<pid>/mem on GPU-visible buffers: what the kernel wrote there."""
        proc = self._proc(msg)
        addr, length = int(msg["addr"]), int(msg["length"])
        for bo in proc.bos.values():
            if bo.contains(addr):
                data = bo.contents.get(addr - bo.va)
                return {"data": data[:length].hex() if data and len(data) >= length else None}
        raise ValueError(f"{addr:#x} is not mapped in pid {proc.pid}")

    def ctl_evict(self, conn, msg):
        self.kfd.evict_process(self._proc(msg), int(msg.get("trigger", 2)))
        self.kfd.timing.settle()
        return {}

    def ctl_restore(self, conn, msg):
        self.kfd.restore_process(self._proc(msg))
        self.kfd.timing.settle()
        return {}

    def ctl_last_cost(self, conn, msg):
        cost = self.kfd.timing.last
        return {"remap_s": cost.remap_s, "grace_s": cost.grace_s, "save_s": cost.save_s,
                "restore_s": cost.restore_s, "saved_bytes": cost.saved_bytes}

    def ctl_set_param(self, conn, msg):
        name, value = msg["name"], msg["value"]
        if name not in DEFAULT_PARAMETERS:
            raise ValueError(f"unknown amdgpu parameter {name!r}")
        self.params[name] = value
        (self.sysfs_root / "module" / "amdgpu" / "parameters" / name).write_text(f"{value}\n")
        return {}

    def ctl_shutdown(self, conn, msg):
        self.running = False
        return {}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m kfdtool.sim.server", description=__doc__.splitlines()[0])
    parser.add_argument("--preset", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--abi", default="1.23")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--no-realtime", action="store_true", help="do not sleep for modelled latencies")
    parser.add_argument("--patched-preempt", action="store_true",
                        help="emulate a patched kernel with the non-upstream PREEMPT_QUEUE/RESUME_QUEUE 0x87/0x88")
    args = parser.parse_args(argv)
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)    # one pidfd per simulated process
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    params = {}
    for item in args.param:
        name, _, value = item.partition("=")
        params[name] = int(value) if value.lstrip("-").isdigit() else value
    try:
        server = SimServer(args.dir, args.preset, args.abi, params, realtime=not args.no_realtime,
                           patched_preempt=args.patched_preempt)
    except KeyError as e:
        print(f"kfdtool-sim: {e.args[0]}", file=sys.stderr)
        return 2
    server.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
