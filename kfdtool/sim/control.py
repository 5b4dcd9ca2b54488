"""The simulator's control channel: simulation-only operations (status, adopt, waves, eviction,
parameters) as JSON over the server's unix socket. Kept apart from the ioctl client so that
read-only commands (`kfdtool --sim NAME queues`) can ask "is it running?" without loading the
ioctl tables."""
import json
import socket

from ..errors import SimulatorError
from .protocol import frame, recv_frame


class Channel:
    def __init__(self, socket_path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.connect(str(socket_path))
        except OSError as e:
            self.sock.close()
            raise SimulatorError(f"simulated KFD not reachable at {socket_path}: {e.strerror}") from None

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def call_json(self, payload):
        try:
            self.sock.sendall(frame(payload))
            reply, _ = recv_frame(self.sock)
        except OSError as e:
            raise SimulatorError(f"simulated KFD server went away: {e}") from None
        return json.loads(reply[1:])


class SimControl(Channel):
    """Simulation-only operations: status, bulk workloads, waves, eviction, parameters."""

    def __call__(self, op, **fields):
        reply = self.call_json(b"C" + json.dumps({"op": op, **fields}).encode())
        if "error" in reply:
            raise SimulatorError(reply["error"])
        return reply


