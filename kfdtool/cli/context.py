"""What every command needs: where sysfs is (real, --sysfs-root, or a simulated machine)."""
import os

from ..sysfs import SysfsRoot


class Context:
    def __init__(self, sysfs, sim=None, kernel_release=None):
        self.sysfs = sysfs
        self.sim = sim                           # sim.runner.SimMachine when --sim is given
        self.kernel_release = kernel_release     # of the simulated kernel; None: this host's

    @classmethod
    def from_args(cls, args):
        if args.sim:
            from ..sim import runner
            machine = runner.static_tree(args.sim)
            return cls(SysfsRoot(machine.sysfs_root), machine, machine.kernel_release)
        return cls(SysfsRoot(args.sysfs_root), None, None)

    def require_kfd_process(self, pid, why=None):
        """"No KFD here" before "not a KFD process": a command aimed at one process checks both first."""
        from ..errors import NoSuchProcess
        self.sysfs.require_kfd()
        if not (self.sysfs.proc / str(pid)).is_dir():
            raise NoSuchProcess(pid, why or self.not_kfd_process(pid))

    def not_kfd_process(self, pid):
        """Why `pid` is not a KFD process, naming the sysfs looked in (a simulated machine's, or --sysfs-root)."""
        return f"is not a KFD process (no {self.sysfs.proc / str(pid)})"

    def require_running_sim(self):
        """A simulated machine's sysfs tree can be read while it is stopped; its KFD cannot be used."""
        if self.sim is not None and not self.sim.is_running():
            from ..errors import SimulatorError
            raise SimulatorError(f"simulated {self.sim.name} is not running; start it with "
                                 f"`kfdtool sim start {self.sim.name}`")

    def import_device_modules(self):
        """Import what open_device() and the device's first calls need, before a command arms
        signal handlers that raise: an exception a handler raises while a module is being imported
        can surface inside importlib's module-lock callback, which prints it as "Exception ignored"
        with a traceback and goes on as if no signal had come."""
        from .. import device  # noqa: F401
        if self.sim is not None:
            from ..sim import client  # noqa: F401

    def open_device(self):
        from ..device import KfdDevice
        if self.sim is not None:
            self.require_running_sim()
            return KfdDevice(self.sim.open_kfd())
        return KfdDevice.open(os.environ.get("KFDTOOL_DEVICE", "/dev/kfd"))
