"""ABI versions as first-class values: which ioctls a minor supports and which layouts it uses.

Sources (see ../shared/reference/kfd-abi.md §1.1): CREATE_QUEUE grew from 88 to 96 bytes at 1.17
(sdma_engine_id + pad, the pad renamed metadata_ring_size at 1.22); kfd_dbg_device_info_entry grew
from 120 to 128 bytes (capability2 + pad) between 1.17 (Linux 6.12: 120) and 1.23 (Linux 7.2: 128).
The exact bump for the latter is UNVERIFIED; we gate it at 1.20, the expert-scheduling bump whose
capability capability2 reports.
"""
import ctypes
from dataclasses import dataclass
from functools import cached_property

from . import structs as s
from .requests import AMDKFD_COMMAND_START, BY_NAME, IOCTLS


class kfd_ioctl_create_queue_args_1_16(s.KfdStruct):
    """CREATE_QUEUE arguments up to KFD 1.16 (88 bytes)."""
    _fields_ = s.kfd_ioctl_create_queue_args._fields_[:-2]


class kfd_dbg_device_info_entry_1_17(s.KfdStruct):
    """Device snapshot entry before capability2 (120 bytes)."""
    _fields_ = s.kfd_dbg_device_info_entry._fields_[:-2]


# struct name -> [(first minor, layout)], newest first
LAYOUTS = {
    "kfd_ioctl_create_queue_args": [(17, s.kfd_ioctl_create_queue_args), (1, kfd_ioctl_create_queue_args_1_16)],
    "kfd_dbg_device_info_entry": [(20, s.kfd_dbg_device_info_entry), (1, kfd_dbg_device_info_entry_1_17)],
}
# (struct, newest field name) -> (older name, first minor with the newer name)
FIELD_RENAMES = {
    ("kfd_ioctl_set_memory_policy_args", "misc_process_flag"): ("pad", 18),
    ("kfd_ioctl_create_queue_args", "metadata_ring_size"): ("pad", 22),
}
KNOWN_MINORS = (11, 13, 15, 17, 18, 23)     # versions we have header evidence for


@dataclass(frozen=True)
class KfdAbi:
    """One KFD ABI version (major is always 1)."""
    minor: int
    major: int = 1

    def __str__(self):
        return f"{self.major}.{self.minor}"

    @classmethod
    def parse(cls, text):
        major, _, minor = str(text).partition(".")
        if major != "1" or not minor.isdigit():
            raise ValueError(f"not a KFD ABI version: {text!r} (expected 1.N, e.g. 1.17)")
        return cls(int(minor))

    def supports(self, name):
        return BY_NAME[name].since_minor <= self.minor

    @cached_property
    def command_end(self):
        return max(i.nr for i in IOCTLS if self.supports(i.name)) + 1

    def supported_ioctls(self):
        return [i for i in IOCTLS if i.since_minor <= self.minor and AMDKFD_COMMAND_START <= i.nr]

    def layout(self, struct_name):
        for first_minor, layout in LAYOUTS.get(struct_name, ()):
            if self.minor >= first_minor:
                return layout
        return getattr(s, struct_name)

    def request(self, name):
        """The request number a program built against this ABI's header would pass."""
        entry = BY_NAME[name]
        return entry.request(self.layout(entry.struct.__name__) if entry.struct else None)

    def struct_size(self, struct_name):
        return ctypes.sizeof(self.layout(struct_name))


NEWEST = KfdAbi(23)
