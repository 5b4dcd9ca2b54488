"""The simulator's control channel: simulation-only operations (status, adopt, waves, eviction,
parameters) as JSON over the server's unix socket. Kept apart from the ioctl client so that
read-only commands (`kfdtool --sim NAME queues`) can ask "is it running?" without loading the
ioctl tables."""
import json
import socket

from ..errors import SimulatorError
from .protocol import LEN, frame, recv_frame


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
        """Send one request, return the server's JSON reply; an error reply raises SimulatorError."""
        try:
            self.sock.sendall(frame(payload))
            reply, _ = recv_frame(self.sock)
        except OSError as e:
            raise SimulatorError(self._last_words() or f"simulated KFD server went away: {e}") from None
        try:
            reply = json.loads(reply[1:])
        except ValueError:
            raise SimulatorError("simulated KFD server sent a reply that is not JSON") from None
        if "error" in reply:
            raise SimulatorError(reply["error"])
        return reply

    def _last_words(self):
        """The error the server sent before closing this connection (a refusal), if any."""
        try:
            self.sock.setblocking(False)
            data = self.sock.recv(1 << 16)
            return json.loads(data[LEN.size + 1:])["error"]
        except (OSError, ValueError, KeyError, TypeError):
            return None


class SimControl(Channel):
    """Simulation-only operations: status, bulk workloads, waves, eviction, parameters."""

    def __call__(self, op, **fields):
        return self.call_json(b"C" + json.dumps({"op": op, **fields}).encode())
