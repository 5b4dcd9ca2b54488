"""Start, find and stop simulated machines. State lives in $KFDTOOL_SIM_DIR/<name> (default: see
default_base_dir()): the sysfs tree under sys/ (see place_sysfs_tree() for where it really
lives), the socket kfd.sock, a log."""
import hashlib
import json
import os
import shutil
import stat
import sys
import time
from pathlib import Path

from ..errors import SimulatorError
from ..sysfs import SysfsRoot
from .control import SimControl
from .machine import PRESETS, PROFILES, find_preset, find_profile, materialize
from .protocol import PROTOCOL

START_TIMEOUT_S = 30


UNIX_PATH_MAX = 108                      # sockaddr_un.sun_path, its NUL included (linux/un.h)


def base_dir():
    return Path(os.environ.get("KFDTOOL_SIM_DIR") or default_base_dir())


def default_base_dir():
    """A memory filesystem where there is one: $XDG_RUNTIME_DIR/kfdtool-sim (the user's own tmpfs),
    else /dev/shm/kfdtool-sim-UID, else the temporary directory. The kernel's sysfs lives in memory,
    and so does the simulated one: a first start creates thousands of files (8267 for mi300x-cpx),
    0.15 s on tmpfs against 0.3-4 s on this sandbox's ext4 disk, depending on other I/O."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime) and os.access(runtime, os.W_OK | os.X_OK):
        return Path(runtime) / "kfdtool-sim"
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK | os.X_OK):
        return Path(f"/dev/shm/kfdtool-sim-{os.getuid()}")
    import tempfile
    return Path(tempfile.gettempdir()) / f"kfdtool-sim-{os.getuid()}"


def _own_base_dir():
    """Create the base directory (0700); a default one already there must be ours."""
    if os.environ.get("KFDTOOL_SIM_DIR"):
        return _create_dir(base_dir())              # the user's own choice
    return _own_default_dir()


def _create_dir(path):
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise SimulatorError(f"cannot create {path}: {e.strerror}") from None
    return path


def _own_default_dir():
    """default_base_dir(), created (0700) if missing. One already there must be the user's own
    directory: in a shared directory such as /dev/shm another user could have planted it, or a
    link to elsewhere."""
    base = _create_dir(default_base_dir())
    st = os.lstat(base)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise SimulatorError(f"{base} is not a directory of yours; remove it or set KFDTOOL_SIM_DIR")
    return base


# --- where a machine's sysfs tree lives -------------------------------------------------------------

MEMORY_FILESYSTEMS = {"tmpfs", "ramfs"}
LINKED_TREES = ".linked-trees"     # under default_base_dir(): trees of machines kept on a disk filesystem
PRUNE_GRACE_S = 60                 # a linked tree this young may be one whose link is being made


def filesystem_type(path):
    """Type of the filesystem that holds `path` (its mount point is the longest one that prefixes
    the real path; of two mounts on one point the later hides the earlier), or None where that
    cannot be told."""
    import psutil                                   # only here: `sim start` on a memory filesystem needs none
    try:
        real = os.path.realpath(path)
        mounts = psutil.disk_partitions(all=True)
    except OSError:
        return None
    best, fstype = -1, None
    for mount in mounts:
        inside = real == mount.mountpoint or real.startswith(mount.mountpoint.rstrip("/") + "/")
        if inside and len(mount.mountpoint) >= best:
            best, fstype = len(mount.mountpoint), mount.fstype
    return fstype


def _memory_home(sim_dir):
    """Where the sysfs tree of the machine in `sim_dir` lives when `sim_dir` is on a disk
    filesystem: a directory of its own under the default base directory, if that is on a memory
    filesystem and the user's own. None where the tree stays in `sim_dir`."""
    if filesystem_type(sim_dir) in MEMORY_FILESYSTEMS:
        return None
    memory = default_base_dir()
    if filesystem_type(memory.parent) not in MEMORY_FILESYSTEMS:
        return None
    try:
        memory = _own_default_dir()
    except SimulatorError:
        return None                                 # not ours: the tree stays on disk, never there
    key = hashlib.sha256(os.fsencode(os.path.realpath(sim_dir))).hexdigest()[:16]
    return Path(os.path.abspath(memory)) / LINKED_TREES / key


def place_sysfs_tree(sim_dir):
    """Decide where the sysfs tree of the machine in `sim_dir` lives, before it is built
    (machine.materialize at `sim_dir`/sys, by the server or static_tree). Returns `sim_dir`/sys.

    The kernel's sysfs lives in memory, and so does the simulated one: where `sim_dir` is on a disk
    filesystem, sys is a link to a directory of its own on the memory filesystem of
    default_base_dir(). On a disk a first start is mostly creating the tree's inodes (5562 for
    mi308x, 8267 for mi300x-cpx), 30-500 us each of kernel time on this sandbox's ext4, which has
    no journal and so skips every free inode deleted in the last minutes one by one
    (fs/ext4/ialloc.c: find_inode_bit, recently_deleted), against 5-10 us on tmpfs. A tree
    already built in `sim_dir` stays there, and so does one without a memory filesystem of the
    user's own (or where it is full: machine.materialize)."""
    root = Path(sim_dir) / "sys"
    if _is_directory(root):
        return root
    home = _memory_home(sim_dir)
    if home is not None:
        _link(root, home)
    elif root.is_symlink():
        root.unlink()                    # a link of ours, but no memory filesystem now: in place
    return root


def _is_directory(path):
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def _link(root, home):
    """`root` a link to home/sys; home/owner names the link, so a tree whose machine directory
    was deleted or moved can be told (prune_linked_trees)."""
    target = str(home / "sys")
    for directory in (home.parent, home, home / "sys"):
        directory.mkdir(mode=0o700, exist_ok=True)
    if not (home / "owner").exists():
        (home / "owner").write_text(os.path.abspath(root))
    if root.is_symlink():
        if os.readlink(root) == target:
            return
        root.unlink()
    os.symlink(target, root)


def prune_linked_trees():
    """Remove the memory trees no machine directory links to any more (it was deleted or moved)
    and older than PRUNE_GRACE_S, so that machines kept on a disk do not leave their trees in
    memory. Called by stop()."""
    try:
        entries = list(os.scandir(default_base_dir() / LINKED_TREES))
    except OSError:
        return
    for entry in entries:
        try:
            owner = Path(entry.path, "owner").read_text()
            if os.readlink(owner) == os.path.join(entry.path, "sys"):
                continue
        except OSError:
            pass
        try:
            if time.time() - entry.stat(follow_symlinks=False).st_mtime < PRUNE_GRACE_S:
                continue
        except OSError:
            continue
        shutil.rmtree(entry.path, ignore_errors=True)


class SimMachine:
    def __init__(self, name, directory):
        self.name, self.dir = name, Path(directory)

    def __repr__(self):
        return f"SimMachine({self.name!r}, {str(self.dir)!r})"

    @property
    def sysfs_root(self):
        return self.dir / "sys"

    @property
    def socket(self):
        return self.dir / "kfd.sock"

    @property
    def info(self):
        try:
            return json.loads((self.dir / "machine.json").read_text())
        except (OSError, ValueError):
            return {}

    @property
    def kernel_release(self):
        return self.info.get("release") or PROFILES["1.23"].release

    def is_running(self):
        try:
            SimControl(self.socket).close()
            return True
        except SimulatorError:
            return False

    def control(self):
        return SimControl(self.socket)

    def open_kfd(self):
        from .client import SimBackend           # the ioctl tables: not needed by read-only commands
        return SimBackend(self.socket)


def _known(find, key):
    """The preset or profile `key`, or a SimulatorError naming the choices (one line for the CLI)."""
    try:
        return find(key)
    except KeyError as e:
        raise SimulatorError(e.args[0]) from None


def machine(name):
    _known(find_preset, name)
    return SimMachine(name, base_dir() / name)


def start(name, abi="1.23", params=None, realtime=True, patched_preempt=False):
    """Start the simulator for `name` (no-op if it already runs). Returns the SimMachine."""
    sim = machine(name)
    _known(find_profile, abi)
    if sim.is_running():
        running = sim.info.get("protocol", 1)       # before 2: not written
        if running != PROTOCOL:
            raise SimulatorError(f"simulated {name} runs a simulator of another version (protocol {running}, "
                                 f"this kfdtool {PROTOCOL}); stop it first (`kfdtool sim stop {name}`)")
        running_abi = sim.info.get("abi")
        if running_abi != abi:
            raise SimulatorError(f"simulated {name} already runs with KFD ABI {running_abi}; "
                                 f"stop it first (`kfdtool sim stop {name}`)")
        for param, wanted in (params or {}).items():      # as its sysfs shows them now
            try:
                now = (SysfsRoot(sim.sysfs_root).amdgpu_parameters / param).read_text().strip()
            except OSError:
                now = None
            if now != str(wanted):
                raise SimulatorError(f"simulated {name} already runs with {param}={now}; "
                                     f"stop it first (`kfdtool sim stop {name}`)")
        return sim
    if len(os.fsencode(sim.socket)) > UNIX_PATH_MAX - 1:      # before anything is made there
        raise SimulatorError(f"{sim.socket} is too long for a unix socket ({UNIX_PATH_MAX - 1} bytes at most): "
                             f"choose a shorter KFDTOOL_SIM_DIR")
    _own_base_dir()
    sim.dir.mkdir(exist_ok=True)
    (sim.dir / "ready").unlink(missing_ok=True)
    place_sysfs_tree(sim.dir)
    cmd = [sys.executable, "-m", "kfdtool.sim.server", "--preset", name, "--dir", str(sim.dir), "--abi", abi]
    cmd += [f"--param={k}={v}" for k, v in (params or {}).items()]
    if not realtime:
        cmd.append("--no-realtime")
    if patched_preempt:
        cmd.append("--patched-preempt")
    log = open(sim.dir / "server.log", "ab")
    import subprocess                      # only starting a simulator needs it
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not (sim.dir / "ready").exists():
        if proc.poll() is not None:
            raise SimulatorError(f"simulator for {name} exited at start{_last_words(sim.dir / 'server.log')}; "
                                 f"see {sim.dir / 'server.log'}")
        if time.monotonic() > deadline:
            proc.kill()
            raise SimulatorError(f"simulator for {name} did not start within {START_TIMEOUT_S}s")
        time.sleep(0.02)
    return sim


def _last_words(log_path):
    """The last line the server wrote (its error, where it raised one), as ': LINE', or ''."""
    try:
        lines = log_path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return f": {lines[-1][:200]}" if lines else ""


def stop(name):
    sim = machine(name)
    if not sim.is_running():
        return False
    with sim.control() as ctl:
        ctl("shutdown")
    deadline = time.monotonic() + 10
    while sim.socket.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    prune_linked_trees()
    return True


def static_tree(name, abi="1.23"):
    """The sysfs tree of a machine whose simulator is not running (topology only, no processes)."""
    sim = machine(name)
    if sim.is_running():
        return sim
    profile = _known(find_profile, abi)
    _own_base_dir()
    sim.dir.mkdir(exist_ok=True)
    materialize(name, place_sysfs_tree(sim.dir), profile)      # kept from the last run where it is current
    info = {**sim.info, "preset": name, "abi": abi, "release": profile.release}
    (sim.dir / "machine.json").write_text(json.dumps(info))
    return sim


__all__ = ["PRESETS", "SimMachine", "machine", "start", "stop", "static_tree"]
