"""KFD wire format: ctypes structs, enums and request numbers, with the kernel's own names.

    >>> from kfdtool.ioctls import AMDKFD_IOC_CREATE_QUEUE, kfd_ioctl_create_queue_args
    >>> hex(AMDKFD_IOC_CREATE_QUEUE)
    '0xc0604b02'
"""
from .constants import *  # noqa: F401,F403
from .history import FIELD_RENAMES, KNOWN_MINORS, LAYOUTS, NEWEST, KfdAbi  # noqa: F401
from .requests import (AMDKFD_COMMAND_END, AMDKFD_COMMAND_START, AMDKFD_IOCTL_BASE, BY_NAME,  # noqa: F401
                       BY_NR, IOCTLS, REQUESTS, Ioctl)
from .structs import *  # noqa: F401,F403
from .structs import ALL_STRUCTS, DBG_TRAP_UNION_MEMBERS  # noqa: F401

globals().update(REQUESTS)
