"""SMI event fds (kfd_smi_events.c). Each client is a unix SOCK_SEQPACKET socketpair whose far
end is handed to the caller as `anon_fd`; the near end stays in the simulator. SEQPACKET keeps
each of the caller's write() calls a packet of its own, so the simulator sees every mask write
alone, as the kernel does; the price is on the read side (below).

What follows the kernel, and how:
- kfd_smi_ev_read: an empty fifo gives EAGAIN even on a blocking fd. The caller's end has
  SO_RCVTIMEO of 1 µs, so a blocking read of an empty fd fails with EAGAIN after at most one
  scheduler tick (a socket cannot fail at once while blocking). Approximate: each record is a
  packet, so a read returns one record, not everything the fifo holds, and a read shorter than
  the record loses the rest of it (the kernel leaves it in the fifo).
- kfd_smi_ev_write: each write is seen alone; one shorter than 8 bytes changes nothing (the
  kernel answers EFAULT); a longer one sets the mask from its first 8 bytes, little-endian (the
  kernel consumes 8). The write() call itself returns what a socket returns (the byte count): a
  socket cannot answer EFAULT for a valid buffer or take fewer bytes than it queued.
- add_event_to_kfifo: a record goes to a client only if the whole record fits in its 8 KiB
  fifo, else it is dropped for that client. The fifo's fill is the caller's unread bytes,
  asked from the socket layer (sock_diag, UNIX_DIAG_RQLEN) for the caller's socket.
- kfd_smi_ev_enabled: events of another process only for a client opened with CAP_SYS_ADMIN
  (6.12 also needs ALL_PROCESS in its mask); events without a task (pid 0) for everyone.
- kfd_smi_ev_release: the client is gone when the caller's last fd for it is closed.
- kfd_smi_ev_poll: POLLIN when the fifo is not empty. A socket also reports POLLOUT, which the
  kernel's fd never does.
"""
import os
import select
import socket
import struct

from ..ioctls import constants as c

FIFO_BYTES = 8192                      # MAX_KFIFO_SIZE
MASK_BYTES = 8                         # sizeof(uint64_t events)
EMPTY_READ_TIMEOUT = struct.pack("@ll", 0, 1)      # struct timeval: 1 µs
# room in the socket layer for a full fifo of small records (each costs a few hundred bytes of
# socket overhead); the fifo rule above decides what is dropped, not this buffer
SOCKET_BUFFER = 1 << 20
# mask writes taken per wake-up: a caller writing without pause must not hold the server's one
# thread; the selector wakes it again for the rest, in order
WRITES_PER_WAKE = 64

NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, NLMSG_ERROR = 4, 20, 1, 2
UDIAG_SHOW_RQLEN, UNIX_DIAG_RQLEN = 0x10, 4
NLMSG_HEADER = struct.Struct("=IHHII")
UNIX_DIAG_REQ = struct.Struct("=BBHIIIII")
UNIX_DIAG_MSG_SIZE = 16


class SmiClient:
    def __init__(self, owner_pid, gpu_id, suser, sock, peer_inode):
        self.owner_pid, self.gpu_id, self.suser, self.sock = owner_pid, gpu_id, suser, sock
        self.peer_inode = peer_inode   # the caller's end, for its unread byte count
        self.mask = 0


class UnreadBytes:
    """Unread bytes in a unix socket's receive queue, by inode, without holding it (a held copy
    would keep the caller's end open after the caller closed it)."""

    def __init__(self):
        try:
            self.nl = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)
        except OSError:
            self.nl = None             # no sock_diag here: only the socket buffer limits the fifo

    def __call__(self, inode):
        if self.nl is None:
            return 0
        req = UNIX_DIAG_REQ.pack(socket.AF_UNIX, 0, 0, 0xFFFFFFFF, inode, UDIAG_SHOW_RQLEN, 0xFFFFFFFF, 0xFFFFFFFF)
        try:
            self.nl.send(NLMSG_HEADER.pack(NLMSG_HEADER.size + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 0, 0)
                         + req)
            data = self.nl.recv(4096)
        except OSError:
            return 0
        length, kind = struct.unpack_from("=IH", data)
        offset = NLMSG_HEADER.size + UNIX_DIAG_MSG_SIZE
        while kind != NLMSG_ERROR and offset + 4 <= min(length, len(data)):
            attr_len, attr = struct.unpack_from("=HH", data, offset)
            if attr == UNIX_DIAG_RQLEN:
                return struct.unpack_from("=I", data, offset + 4)[0]
            offset += (attr_len + 3) & ~3
        return 0


class SmiHub:
    def __init__(self, profile):
        self.profile = profile
        self.clients = {}              # server-side fileno -> SmiClient
        self.pending_fds = []          # client ends to hand over with the current reply
        self.on_close = lambda sock: None   # the server unregisters the socket from its selector
        self.unread = UnreadBytes()

    def open_client(self, pid, gpu_id, suser):
        """kfd_smi_event_open: mask 0, pid = the opener's tgid, suser = CAP_SYS_ADMIN at open."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setblocking(False)
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, EMPTY_READ_TIMEOUT)
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, EMPTY_READ_TIMEOUT)
        self.clients[ours.fileno()] = SmiClient(pid, gpu_id, suser, ours, os.fstat(theirs.fileno()).st_ino)
        self.pending_fds.append(theirs)
        return 0xFFFFFFFF              # the client library patches in the fd number it received

    def on_readable(self, fileno):
        """Mask writes (kfd_smi_ev_write), one packet per write() of the caller, in order; or the
        caller closed its last fd (kfd_smi_ev_release)."""
        client = self.clients.get(fileno)
        if client is None:
            return
        for _ in range(WRITES_PER_WAKE):
            try:
                write = client.sock.recv(MASK_BYTES)    # a packet's first 8 bytes; the rest is dropped
            except BlockingIOError:
                return
            except OSError:
                self._close(fileno)
                return
            if not write and self._caller_closed(client.sock):
                self._close(fileno)
                return
            if len(write) == MASK_BYTES:          # a write of 8 bytes or more
                client.mask = int.from_bytes(write[:MASK_BYTES], "little")

    @staticmethod
    def _caller_closed(sock):
        """An empty packet is a write() of 0 bytes or the end of the stream; only the peer's
        close sets POLLHUP on a SEQPACKET socket."""
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return any(events & select.POLLHUP for _, events in poller.poll(0))

    def _close(self, fileno):
        client = self.clients.pop(fileno, None)
        if client:
            self.on_close(client.sock)
            client.sock.close()

    def emit(self, event, pid, text, gpu_ids):
        """kfd_smi_event_add: one record, "<event hex> " + text, cut to KFD_SMI_EVENT_MSG_SIZE,
        to every client of these GPUs that kfd_smi_ev_enabled lets see it and whose fifo has
        room for all of it."""
        if event in (c.KFD_SMI_EVENT_PROCESS_START, c.KFD_SMI_EVENT_PROCESS_END) \
                and not self.profile.smi_process_events:
            return
        bit = c.KFD_SMI_EVENT_MASK_FROM_INDEX(event)
        all_bit = c.KFD_SMI_EVENT_MASK_FROM_INDEX(c.KFD_SMI_EVENT_ALL_PROCESS)
        record = (f"{int(event):x} " + text).encode()[:c.KFD_SMI_EVENT_MSG_SIZE]
        gpu_ids = set(gpu_ids)
        for client in list(self.clients.values()):
            if not client.mask & bit or client.gpu_id not in gpu_ids:
                continue
            if pid and pid != client.owner_pid:
                if not client.suser or (self.profile.smi_all_process_bit_checked and not client.mask & all_bit):
                    continue
            if self.unread(client.peer_inode) + len(record) > FIFO_BYTES:
                continue               # kfifo_avail < len: dropped for this client
            try:
                client.sock.send(record)   # a record this small is queued whole or not at all
            except OSError:
                pass
