"""Start, find and stop simulated machines. State lives in $KFDTOOL_SIM_DIR/<name> (default: see
default_base_dir()): the sysfs tree under sys/, the socket kfd.sock, a log."""
import json
import os
import stat
import sys
import time
from pathlib import Path

from ..errors import SimulatorError
from .control import SimControl
from .machine import PRESETS, PROFILES, find_preset, find_profile, materialize

START_TIMEOUT_S = 30


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
    """Create the base directory (0700); a default one already there must be ours: in a shared
    directory such as /dev/shm another user could have planted it, or a link to elsewhere."""
    base = base_dir()
    try:
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(base)
    except OSError as e:
        raise SimulatorError(f"cannot create {base}: {e.strerror}") from None
    if os.environ.get("KFDTOOL_SIM_DIR"):
        return base                                 # the user's own choice
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise SimulatorError(f"{base} is not a directory of yours; remove it or set KFDTOOL_SIM_DIR")
    return base


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
        running_abi = sim.info.get("abi")
        if running_abi != abi:
            raise SimulatorError(f"simulated {name} already runs with KFD ABI {running_abi}; "
                                 f"stop it first (`kfdtool sim stop {name}`)")
        return sim
    _own_base_dir()
    sim.dir.mkdir(exist_ok=True)
    (sim.dir / "ready").unlink(missing_ok=True)
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
            raise SimulatorError(f"simulator for {name} exited at start; see {sim.dir / 'server.log'}")
        if time.monotonic() > deadline:
            proc.kill()
            raise SimulatorError(f"simulator for {name} did not start within {START_TIMEOUT_S}s")
        time.sleep(0.02)
    return sim


def stop(name):
    sim = machine(name)
    if not sim.is_running():
        return False
    with sim.control() as ctl:
        ctl("shutdown")
    deadline = time.monotonic() + 10
    while sim.socket.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return True


def static_tree(name, abi="1.23"):
    """The sysfs tree of a machine whose simulator is not running (topology only, no processes)."""
    sim = machine(name)
    if sim.is_running():
        return sim
    profile = _known(find_profile, abi)
    _own_base_dir()
    sim.dir.mkdir(exist_ok=True)
    materialize(name, sim.sysfs_root, profile)        # kept from the last run where it is current
    info = {**sim.info, "preset": name, "abi": abi, "release": profile.release}
    (sim.dir / "machine.json").write_text(json.dumps(info))
    return sim


__all__ = ["PRESETS", "SimMachine", "machine", "start", "stop", "static_tree"]
