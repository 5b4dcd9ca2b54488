"""SMI event fds (kfd_smi_events.c): each client is a socketpair whose far end is handed to the
caller as `anon_fd`. Reads return whole records ("<event hex> " + the event's format), possibly
several at once, EAGAIN when empty; an 8-byte little-endian write replaces the event mask."""
import socket

from ..ioctls import constants as c

FIFO_BYTES = 8192


class SmiClient:
    def __init__(self, owner_pid, gpu_id, suser, sock):
        self.owner_pid, self.gpu_id, self.suser, self.sock = owner_pid, gpu_id, suser, sock
        self.mask = 0


class SmiHub:
    def __init__(self, profile):
        self.profile = profile
        self.clients = {}              # server-side fileno -> SmiClient
        self.pending_fds = []          # client ends to hand over with the current reply
        self.on_close = lambda sock: None   # the server unregisters the socket from its selector

    def open_client(self, pid, gpu_id, suser):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ours.setblocking(False)
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, FIFO_BYTES)
        self.clients[ours.fileno()] = SmiClient(pid, gpu_id, suser, ours)
        self.pending_fds.append(theirs)
        return 0xFFFFFFFF              # the client library patches in the fd number it received

    def on_readable(self, fileno):
        """A mask write (or the client closed its end)."""
        client = self.clients.get(fileno)
        if client is None:
            return
        try:
            data = client.sock.recv(64)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close(fileno)
        elif len(data) >= 8:           # shorter writes fail with EFAULT in the kernel
            client.mask = int.from_bytes(data[-8:], "little")

    def _close(self, fileno):
        client = self.clients.pop(fileno, None)
        if client:
            self.on_close(client.sock)
            client.sock.close()

    def drop_owner(self, pid):
        for fileno, client in list(self.clients.items()):
            if client.owner_pid == pid:
                self._close(fileno)

    def emit(self, event, pid, text, gpu_ids):
        """Deliver one event. pid 0 = no task (reset, thermal, process start/end): every client
        that enabled it. Otherwise the owner, or a client opened with CAP_SYS_ADMIN (6.12 also
        requires ALL_PROCESS in its mask)."""
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
            try:
                client.sock.send(record)
            except (BlockingIOError, OSError):
                pass                   # fifo full: dropped for this client, like the kernel
