"""The injectable sysfs root (like psutil's PROCFS_PATH) and tolerant low-level readers.

Everything kfdtool reads from sysfs goes through `SysfsRoot`: topology, proc and module
parameters. ``KFDTOOL_SYSFS_ROOT`` (or an explicit argument) replaces ``/sys``.
"""
import errno
import os
from pathlib import Path

from .errors import SysfsError

ENV_VAR = "KFDTOOL_SYSFS_ROOT"


class SysfsRoot:
    def __init__(self, root=None):
        self.root = Path(root or os.environ.get(ENV_VAR) or "/sys")

    def __repr__(self):
        return f"SysfsRoot({str(self.root)!r})"

    @property
    def kfd(self):
        return self.root / "class" / "kfd" / "kfd"

    @property
    def topology(self):
        return self.kfd / "topology"

    @property
    def proc(self):
        return self.kfd / "proc"

    @property
    def amdgpu_parameters(self):
        return self.root / "module" / "amdgpu" / "parameters"

    def require_kfd(self):
        if not self.root.exists():
            raise SysfsError(f"sysfs root {self.root} does not exist")
        if not self.root.is_dir():
            raise SysfsError(f"sysfs root {self.root} is not a directory")
        if not self.kfd.is_dir():
            raise SysfsError(f"no KFD under {self.root} ({self.kfd} missing): is the amdgpu driver "
                             f"loaded? (use --sim NAME for a simulated GPU)")
        return self


# A kernel sysfs attribute is at most one page; a file larger than this is not one (a /dev/zero
# or a runaway file in a capture), and reading it whole would exhaust memory.
MAX_ATTRIBUTE_BYTES = 1 << 16


def read_bytes(path):
    """Contents of a sysfs file, or None if it is missing. Never blocks: opened non-blocking, so a
    FIFO where an attribute should be reads as empty. A file over MAX_ATTRIBUTE_BYTES or a symbolic
    link loop is a SysfsError. PermissionError propagates."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise SysfsError(f"{path}: symbolic link loop") from None
        raise
    try:
        data = b""
        while len(data) <= MAX_ATTRIBUTE_BYTES:
            chunk = os.read(fd, MAX_ATTRIBUTE_BYTES + 1 - len(data))
            if not chunk:
                return data
            data += chunk
        raise SysfsError(f"{path}: over {MAX_ATTRIBUTE_BYTES} bytes, not a sysfs attribute")
    except BlockingIOError:
        return b""                          # a FIFO with a writer that wrote nothing
    except IsADirectoryError:
        return None
    finally:
        os.close(fd)


def read_text(path):
    data = read_bytes(path)
    return None if data is None else data.decode("ascii", "replace")


def read_int(path):
    """An integer file ("%u\\n" or "%d" without newline); None if missing or not a number."""
    data = read_bytes(path)
    if data is None:
        return None
    try:
        return int(data.strip() or b"x")
    except ValueError:
        return None


def parse_properties(text):
    """Parse a KFD ``properties`` file: lines of ``name value``. Unknown keys are kept; values that
    are not integers (templated, truncated) are kept as strings; junk lines are skipped."""
    props = {}
    for line in text.splitlines():
        name, _, value = line.strip().partition(" ")
        if not name or not value:
            continue
        value = value.strip()
        try:
            props[name] = int(value)
        except ValueError:
            props[name] = value
    return props


def malformed_property_lines(text):
    """Lines of a ``properties`` file that are not ``name number``: the kernel writes no others, so
    any is corruption (random bytes, a line cut short). `parse_properties` skips or keeps them."""
    count = 0
    for line in text.splitlines():
        name, _, value = line.strip().partition(" ")
        if name and not (name.replace("_", "").isalnum() and name.isascii()
                         and value.strip().lstrip("-").isdigit() and value.strip().isascii()):
            count += 1
    return count


def numbered_dirs(path):
    """Sorted integer-named entries of a directory ([] if missing)."""
    try:
        names = os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(int(n) for n in names if n.isdigit())
