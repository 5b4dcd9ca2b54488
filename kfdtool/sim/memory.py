"""User memory as the simulated kernel sees it: the caller's buffers that the client shipped with
the request (ctypes buffers behind pointer fields) plus the process's GPU buffer objects."""
import errno
from dataclasses import dataclass, field

from .errors import SimErrno

PAGE_SIZE = 4096
USER_SPACE_END = 1 << 47            # x86-64 access_ok() limit


def page_align(n):
    return (n + PAGE_SIZE - 1) // PAGE_SIZE * PAGE_SIZE


def access_ok(addr):
    return 0 <= addr < USER_SPACE_END


@dataclass
class BufferObject:
    handle: int
    va: int
    size: int
    gpu_id: int
    flags: int
    contents: dict = field(default_factory=dict)      # offset -> bytes written by the kernel

    def contains(self, addr):
        return self.va <= addr < self.va + self.size


class UserMemory:
    """Regions shipped by the client: {address: bytearray}. What the kernel writes into them is
    sent back byte-exact (`copied_to_user`), never the whole region: the client writes back only
    what a copy_to_user would have changed."""

    def __init__(self, regions=None):
        self.regions = regions or {}
        self.copied_to_user = {}        # address -> bytes, in the order they were written

    def _find(self, addr, length):
        for base, buf in self.regions.items():
            if base <= addr and addr + length <= base + len(buf):
                return base, buf
        return None, None

    def read(self, addr, length):
        if length == 0 and access_ok(addr):
            return b""                   # a copy of nothing succeeds at any user address
        base, buf = self._find(addr, length)
        if buf is None:
            raise SimErrno(errno.EFAULT, f"copy_from_user({addr:#x}, {length}) outside shipped memory")
        return bytes(buf[addr - base:addr - base + length])

    def write(self, addr, data, bos=()):
        if not data and access_ok(addr):
            return                       # a copy of nothing succeeds at any user address
        base, buf = self._find(addr, len(data))
        if buf is not None:
            buf[addr - base:addr - base + len(data)] = data
            self.copied_to_user.pop(addr, None)
            self.copied_to_user[addr] = bytes(data)
            return
        for bo in bos:           # GPU-visible memory of the process (e.g. the CWSR area)
            if bo.contains(addr) and addr + len(data) <= bo.va + bo.size:
                bo.contents[addr - bo.va] = bytes(data)
                return
        raise SimErrno(errno.EFAULT, f"copy_to_user({addr:#x}, {len(data)}) outside user memory")
