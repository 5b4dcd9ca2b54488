"""Helpers for tests that talk to a running simulated KFD."""
import ctypes
import os

from kfdtool import errors
from kfdtool.device import KfdDevice
from kfdtool.ioctls import constants as c
from kfdtool.ioctls import structs as s
from kfdtool.sim import runner
from kfdtool.sim.workload import FakeRuntime


def start(name, abi="1.23", **params):
    return runner.start(name, abi, params or None, realtime=False)


class Client:
    """This test process as a GPU process of the simulator: a KfdDevice plus a fake runtime."""

    def __init__(self, sim, runtime_enable=True):
        self.sim = sim
        self.kfd = KfdDevice(sim.open_kfd())
        self.rt = FakeRuntime(self.kfd, sim.sysfs_root, runtime_enable=False)
        if runtime_enable and self.kfd.supports("RUNTIME_ENABLE"):
            try:       # the test process stays a KFD process (and runtime-enabled) across tests
                self.kfd.ioctl("RUNTIME_ENABLE", s.kfd_ioctl_runtime_enable_args(0, 1, 0))
            except errors.Busy:
                pass
        self.gpus = [n.gpu_id for n in self.rt.topology.for_each_gpu()]
        self.ctl = sim.control()

    def close(self):
        try:
            self.dbg("DISABLE")
        except errors.KfdIoctlError:
            pass
        self.rt.close()
        self.kfd.close()
        self.ctl.close()

    def queues(self, pid=None):
        return {q["qid"]: q for q in self.ctl("queues", pid=pid or os.getpid())["queues"]}

    def dbg(self, op, member=None, pid=None, **fields):
        return self.kfd.dbg_trap(op, pid or os.getpid(), member, **fields)

    def enable_debug(self, pid=None):
        return self.dbg("ENABLE", "enable", pid=pid, dbg_fd=self.kfd.fd)

    def snapshot(self, pid=None, n=16, entry_size=64, clear_new=True):
        buf = (ctypes.c_ubyte * (n * entry_size))()
        _, args = self.dbg("GET_QUEUE_SNAPSHOT", "queue_snapshot", pid=pid, snapshot_buf_ptr=ctypes.addressof(buf),
                           num_queues=n, entry_size=entry_size,
                           exception_mask=c.KFD_EC_MASK(c.EC_QUEUE_NEW) if clear_new else 0)
        return args.queue_snapshot, buf

    def suspend(self, qids, pid=None, grace=0, exception_mask=0):
        arr = (ctypes.c_uint32 * len(qids))(*qids)
        ret, _ = self.dbg("SUSPEND_QUEUES", "suspend_queues", pid=pid, queue_array_ptr=ctypes.addressof(arr),
                          num_queues=len(qids), grace_period=grace, exception_mask=exception_mask)
        return ret, list(arr)

    def open_smi(self, gpu, *events):
        """An SMI event fd for `gpu`, non-blocking, subscribed to `events`."""
        import time
        args = s.kfd_ioctl_smi_events_args(gpuid=gpu)
        self.kfd.ioctl("SMI_EVENTS", args)
        os.set_blocking(args.anon_fd, False)
        mask = 0
        for event in events:
            mask |= c.KFD_SMI_EVENT_MASK_FROM_INDEX(event)
        os.write(args.anon_fd, mask.to_bytes(8, "little"))
        time.sleep(0.05)                  # the mask write is asynchronous to the server
        return args.anon_fd

    def resume(self, qids, pid=None):
        arr = (ctypes.c_uint32 * len(qids))(*qids)
        ret, _ = self.dbg("RESUME_QUEUES", "resume_queues", pid=pid, queue_array_ptr=ctypes.addressof(arr),
                          num_queues=len(qids))
        return ret, list(arr)


def in_child(fn, *args):
    """Run fn(*args) in a forked child (a brand-new KFD process); return its result or raise
    AssertionError with the child's exception."""
    import pickle
    import traceback
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            payload = ("ok", fn(*args))
        except BaseException as e:
            payload = ("err", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
        with os.fdopen(w, "wb") as f:
            pickle.dump(payload, f)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    kind, value = pickle.loads(data)
    if kind == "err":
        raise AssertionError(value)
    return value


def errno_of(call):
    """0, or the errno of the KFD ioctl error `call()` raises."""
    try:
        call()
    except errors.KfdIoctlError as e:
        return e.errno
    return 0
