"""Wire protocol between simulated-KFD clients and the server (a unix stream socket).

Every message is a u32 length + payload; the payload's first byte is its kind:
  client: b"O" open /dev/kfd (the process that sends it becomes a KFD process); its body is empty
               or a JSON object {"tid": N}: the id of the thread that opens the connection and makes
               its calls (gettid), which the server takes only once it has found that thread in the
               sender's process (`parse_open`); without it the process stands for its thread
          b"I" ioctl: <request u32, arg len u32, regions u32, made at u64> arg, regions
          b"C" control: a JSON object
          b"B" ioctls made back to back: <count u32> then count x (<length u32> + an "I" body), as
               one thread makes them in a loop: each starts when the one before returned (at most
               MAX_BATCH_CALLS)
          b"D" doorbell: a JSON object {"op": "dispatch" | "query" | "wait", "qid": ...}, on the
               caller's own queues (what user space does without an ioctl: write AQL packets and
               ring the doorbell, read or wait on a completion signal); its "at" is its "made at"
  "made at": CLOCK_MONOTONIC ns when the caller made the call or rang the doorbell; the server
               applies the request then, as far as its model has not been played past it (clock.py);
               0 or absent: when the server handles it
  server: b"R" ioctl reply: <ret i64, out len u32, regions u32, fds u32, returns at u64> out, regions
               (+ SCM_RIGHTS); "returns at": CLOCK_MONOTONIC ns before which the call must not return
               to its caller (the modelled time it sleeps in the kernel), 0 for none
          b"M" the replies to a b"B": <count u32> then count x (<length u32> + an "R" body); fewer
               than asked when the last one slept in the kernel: the caller makes the rest once it
               has returned (one that returns later than now: the server makes the next then, unless
               the caller's process has exited meanwhile)
          b"J" JSON reply
A region is <address u64, length u32> + bytes: the caller's memory behind a pointer argument.
Who the caller is travels outside the payload: the server takes the sender's pid and uid from the
kernel (SCM_CREDENTIALS), which a client cannot forge. The kernel says nothing of the sending thread
(SCM_CREDENTIALS and SO_PEERCRED carry the thread group id): the tid an "O" names is the client's
word, which the server checks against /proc (a thread of the sender's process, in the server's pid
namespace) and knows from then on by its id and start time, so a client can name only a live thread
of its own process, which it could make the call from anyway: once that thread exits, a thread that
gets its id (even another process's) is not it, and the connection's calls are its process's.

Anything else is a `ProtocolError`: the server answers it with one JSON error and closes that
connection (never the server).
"""
import json
import socket
import struct

# Raised whenever a message's layout changes. A server writes it into its machine.json and its
# answer to "O"; a client of another version stops with one line instead of misreading replies.
# 2: the ioctl reply carries "returns at". 3: an ioctl and a dispatch carry "made at". 4: b"B"/b"M".
PROTOCOL = 4

LEN = struct.Struct("<I")
IOCTL = struct.Struct("<IIIQ")
REPLY = struct.Struct("<qIIIQ")
REGION = struct.Struct("<QI")

# The largest payload either side accepts. A real ioctl argument is at most 16 KiB (the 14-bit
# _IOC_SIZE field); the regions are what its pointers cover: the largest legitimate ones are
# WAIT_EVENTS' event array (at most KFD_SIGNAL_EVENT_LIMIT = 4096 events x 32 bytes) and the
# debugger's snapshot buffers, far below this.
MAX_FRAME_BYTES = 4 << 20
# The most ioctls one b"B" may carry: the server makes them in one turn, so this bounds how long one
# client holds everybody else up. A daemon makes one call per client it preempts, and a board has
# 32 slots.
MAX_BATCH_CALLS = 64


class ProtocolError(ValueError):
    """A message that breaks the framing rules above; the text says which rule."""


def pack_regions(regions):
    return b"".join(REGION.pack(addr, len(data)) + bytes(data) for addr, data in regions)


def unpack_regions(buf, offset, count):
    """`count` regions from `buf` at `offset`: ({address: bytearray}, offset after them)."""
    regions = {}
    for i in range(count):
        if offset + REGION.size > len(buf):
            raise ProtocolError(f"region {i} of {count}: header cut short")
        addr, length = REGION.unpack_from(buf, offset)
        offset += REGION.size
        if offset + length > len(buf):
            raise ProtocolError(f"region {i} of {count} at {addr:#x}: {length} bytes announced, "
                                f"{len(buf) - offset} sent")
        regions[addr] = bytearray(buf[offset:offset + length])
        offset += length
    return regions, offset


def parse_ioctl(body):
    """An ioctl request's body (after the kind byte): (request, arg, regions, made at)."""
    if len(body) < IOCTL.size:
        raise ProtocolError(f"ioctl header cut short: {len(body)} of {IOCTL.size} bytes")
    request, arg_len, n_regions, made_at = IOCTL.unpack_from(body)
    offset = IOCTL.size
    if offset + arg_len > len(body):
        raise ProtocolError(f"ioctl argument of {arg_len} bytes announced, {len(body) - offset} sent")
    arg = body[offset:offset + arg_len]
    regions, end = unpack_regions(body, offset + arg_len, n_regions)
    if end != len(body):
        raise ProtocolError(f"{len(body) - end} bytes after the ioctl's last region")
    return request, arg, regions, made_at


def pack_items(bodies):
    """<count u32> then each body with its length: a b"B" request's or a b"M" reply's payload."""
    return LEN.pack(len(bodies)) + b"".join(LEN.pack(len(b)) + b for b in bodies)


def unpack_items(body, what, most):
    """The bodies `pack_items` packed, at least one and at most `most`."""
    if len(body) < LEN.size:
        raise ProtocolError(f"{what} without its count")
    (count,) = LEN.unpack_from(body)
    if not 0 < count <= most:
        raise ProtocolError(f"{what} of {count} items (1 to {most})")
    items, offset = [], LEN.size
    for i in range(count):
        if offset + LEN.size > len(body):
            raise ProtocolError(f"{what}: item {i} of {count} is missing")
        (length,) = LEN.unpack_from(body, offset)
        offset += LEN.size
        if offset + length > len(body):
            raise ProtocolError(f"{what}: item {i} of {count} announces {length} bytes, {len(body) - offset} sent")
        items.append(body[offset:offset + length])
        offset += length
    if offset != len(body):
        raise ProtocolError(f"{len(body) - offset} bytes after the last item of a {what}")
    return items


def parse_batch(body):
    """A b"B" request's body: [(request, arg, regions, made at)], each checked as parse_ioctl does."""
    return [parse_ioctl(item) for item in unpack_items(body, "batch of ioctls", MAX_BATCH_CALLS)]


def parse_json_object(body, what):
    """A control or doorbell request's body: one JSON object."""
    try:
        msg = json.loads(body)
    except (ValueError, RecursionError) as e:          # UnicodeDecodeError is a ValueError
        raise ProtocolError(f"{what} message is not JSON: {e}") from None
    if not isinstance(msg, dict):
        raise ProtocolError(f"{what} message is a JSON {type(msg).__name__}, not an object")
    return msg


def parse_open(body):
    """An open request's body: the opening thread's id, or None where the body is empty (a client
    from before threads were named)."""
    if not body:
        return None
    tid = parse_json_object(body, "open").get("tid")
    if tid is not None and (type(tid) is not int or tid <= 0):
        raise ProtocolError(f"open message's tid is {tid!r:.30}, not a thread id")
    return tid


def parse_control(body):
    """A control request's body: the JSON object with its "op"."""
    return parse_json_object(body, "control")


def frame(payload):
    return LEN.pack(len(payload)) + payload


def json_frame(obj):
    return frame(b"J" + json.dumps(obj).encode())


def recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("simulated KFD server closed the connection")
        buf += chunk
    return bytes(buf)


def recv_frame(sock, with_fds=False):
    """One message (and any fds passed with it)."""
    fds = []
    if with_fds:
        data, fds, _flags, _addr = socket.recv_fds(sock, LEN.size, 16)
        if not data:
            raise ConnectionError("simulated KFD server closed the connection")
        head = data + recv_exact(sock, LEN.size - len(data)) if len(data) < LEN.size else data
    else:
        head = recv_exact(sock, LEN.size)
    (length,) = LEN.unpack(head)
    return recv_exact(sock, length), fds
