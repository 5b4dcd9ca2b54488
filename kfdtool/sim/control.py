"""The simulator's control channel: simulation-only operations (status, adopt, waves, eviction,
parameters) as JSON over the server's unix socket. Kept apart from the ioctl client so that
read-only commands (`kfdtool --sim NAME queues`) can ask "is it running?" without loading the
ioctl tables."""
import json
import socket

from ..errors import SimulatorError
from .protocol import LEN, frame, recv_frame


class Channel:
    # posted requests whose replies are not read yet: past this many, a post reads them first, so
    # the server (which takes a connection's next request only once its last reply is sent) and
    # this client never wait on each other
    MAX_UNANSWERED = 256

    def __init__(self, socket_path):
        self.unanswered = 0
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
        self.collect()
        self._send(payload)
        reply = self._receive()
        if "error" in reply:
            raise SimulatorError(reply["error"])
        return reply

    def post_json(self, payload):
        """Send a request without waiting for its reply (a doorbell write goes on at once); the
        reply is read by the next call on this channel, which raises the first refusal."""
        if self.unanswered >= self.MAX_UNANSWERED:
            self.collect()
        self._send(payload)
        self.unanswered += 1

    def collect(self):
        """Read the replies of posted requests; SimulatorError with the first refusal among them."""
        refusal = None
        while self.unanswered:
            reply = self._receive()
            self.unanswered -= 1
            refusal = refusal or reply.get("error")
        if refusal:
            raise SimulatorError(refusal)

    def _send(self, payload):
        """`payload`: the bytes, or a function that makes them right before the write (a message
        that says when it was sent, a dispatch's "at", is stamped after any wait for replies)."""
        if callable(payload):
            payload = payload()
        try:
            self.sock.sendall(frame(payload))
        except OSError as e:
            raise SimulatorError(self._last_words() or f"simulated KFD server went away: {e}") from None

    def _receive(self):
        try:
            reply, _ = recv_frame(self.sock)
        except OSError as e:
            raise SimulatorError(self._last_words() or f"simulated KFD server went away: {e}") from None
        try:
            reply = json.loads(reply[1:])
        except ValueError:
            raise SimulatorError("simulated KFD server sent a reply that is not JSON") from None
        if not isinstance(reply, dict):
            raise SimulatorError("simulated KFD server sent a reply that is not a JSON object")
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
