"""Wire protocol between simulated-KFD clients and the server (a unix stream socket).

Every message is a u32 length + payload; the payload's first byte is its kind:
  client: b"O" open /dev/kfd (the connecting process becomes a KFD process)
          b"I" ioctl: <request u32, caller pid i32, arg len u32, regions u32> arg, regions
          b"C" control: JSON
  server: b"R" ioctl reply: <ret i64, out len u32, regions u32, fds u32> out, regions (+ SCM_RIGHTS)
          b"J" JSON reply
A region is <address u64, length u32> + bytes: the caller's memory behind a pointer argument.
"""
import json
import socket
import struct

LEN = struct.Struct("<I")
IOCTL = struct.Struct("<IiII")
REPLY = struct.Struct("<qIII")
REGION = struct.Struct("<QI")


def pack_regions(regions):
    return b"".join(REGION.pack(addr, len(data)) + bytes(data) for addr, data in regions)


def unpack_regions(buf, offset, count):
    regions = {}
    for _ in range(count):
        addr, length = REGION.unpack_from(buf, offset)
        offset += REGION.size
        regions[addr] = bytearray(buf[offset:offset + length])
        offset += length
    return regions, offset


def frame(payload):
    return LEN.pack(len(payload)) + payload


def send_json(sock, obj):
    sock.sendall(frame(b"J" + json.dumps(obj).encode()))


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
