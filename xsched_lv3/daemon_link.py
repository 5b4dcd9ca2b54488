"""How clients reach the daemon: its socket's path, one request, and a wake-up poke. Kept apart from
the daemon so that a scheduled program (`import torch` under `xsched-lv3 run`) loads only this."""
import json
import os
import socket

REPLY_TIMEOUT_S = 10.0              # request(): a daemon that does not answer within this is an error
MAX_REPLY_BYTES = 1 << 20           # request(): a reply longer than this is not from our daemon


def default_socket():
    """$XSCHED_LV3_SOCKET, else daemon.sock in a directory only we may enter: $XDG_RUNTIME_DIR
    (0700, ours) or /tmp/xsched-lv3-<uid> (created 0700 by the daemon, and refused if it is not)."""
    explicit = os.environ.get("XSCHED_LV3_SOCKET")
    if explicit:
        return explicit
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    folder = f"{runtime}/xsched-lv3" if runtime else f"/tmp/xsched-lv3-{os.getuid()}"
    return f"{folder}/daemon.sock"


def wake_path(socket_path):
    """The daemon's datagram socket, next to its stream socket: a client sends it an empty datagram
    whenever its activity changes, so Lv3 suspends and resumes at once instead of at the next
    periodic look at the board. A datagram carries no data the daemon trusts: it only re-reads the
    board."""
    return f"{socket_path}.wake"


def poke(path):
    """Wake the daemon at `path` (wake_path); never blocks, never fails the caller."""
    sock = _poke_socket()
    try:
        sock.sendto(b"", path)
    except OSError:
        pass                           # no daemon, or its queue is full: it reads the board anyway


_poke_sock = None


def _poke_socket():
    global _poke_sock
    if _poke_sock is None:
        _poke_sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
    return _poke_sock


def request(msg, socket_path=None, timeout=REPLY_TIMEOUT_S):
    """One request to the daemon; raises ConnectionError with a one-line reason if there is no
    daemon of ours (or root's) at the path, or it does not answer properly."""
    path = socket_path or default_socket()
    try:
        owner = os.stat(path).st_uid
    except OSError:
        owner = None                           # connect() below says what is wrong
    if owner is not None and owner not in (0, os.geteuid()):
        raise ConnectionError(f"{path} belongs to uid {owner}: not a daemon of yours or root's")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
    except OSError as e:
        sock.close()
        raise ConnectionError(f"no xsched-lv3 daemon at {path} ({e.strerror or e}); "
                              "start one with `xsched-lv3 daemon`") from None
    buf = bytearray()
    with sock:
        try:
            try:
                sock.sendall(json.dumps(msg).encode() + b"\n")
            except (BrokenPipeError, ConnectionResetError):
                pass                           # it may have closed after saying why (a refusal): read on
            while not buf.endswith(b"\n") and len(buf) <= MAX_REPLY_BYTES:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                buf += chunk
        except TimeoutError:
            raise ConnectionError(f"the daemon at {path} did not answer within {timeout:g} s") from None
        except OSError as e:
            raise ConnectionError(f"the daemon at {path} dropped the connection ({e.strerror or e})") from None
    try:
        reply = json.loads(buf)
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        raise ConnectionError(f"no proper reply from the daemon at {path}")
    return reply
