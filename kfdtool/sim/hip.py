"""A small HIP-like runtime over the simulated KFD: streams, kernel launches that take time on the
simulated GPU (the server's execution model), events, and HIP's stream-to-hardware-queue pooling.

Pooling is modelled from ROCm/clr rocdevice.cpp `Device::acquireQueue` (kfd-abi.md §6.2): per device,
separate pools per priority (low/normal/high); at most GPU_MAX_HW_QUEUES (default 4) queues per pool;
a new stream beyond that shares the pooled queue with the lowest refcount; CU-masked streams always
get their own queue; a queue is acquired lazily, when the stream first launches work (HIP's lazy
stream creation), and destroyed when its last stream goes. KFD priorities: low 0, normal 7, high 11.

A launch writes one AQL packet and rings the queue's doorbell (the simulator's "D" message, no
ioctl); the queue's completion signal counts retired packets, so an event is (queue, the dispatched
count after the stream's last launch). Streams that share a queue run in its order, as on HIP.

    hip = SimHip("mi308x")                   # the running simulated machine
    s = hip.stream(device=0, priority="high")
    hip.launch(s, work_us=35.0, waves=64)    # returns at once
    hip.synchronize(hip.record(s))           # blocks this thread only
"""
import operator
import os
import threading
import time
import weakref
from dataclasses import dataclass

from ..errors import SimulatorError

KFD_PRIORITY = {"low": 0, "normal": 7, "high": 11}
# How long another thread's posted launches may take to reach the server (they were sent already)
RECEIVE_TIMEOUT_S = 5.0


@dataclass(eq=False)
class SimStream:
    name: str
    gpu_id: int
    priority: str = "normal"
    cu_mask: bool = False
    qid: int | None = None        # the KFD queue, acquired at the first launch
    signal: int = 0               # the queue's dispatched count after this stream's last launch

    @property
    def queue_id(self):
        return self.qid


class _ThreadToken(threading.local):
    """`.token`: an object of the calling thread's own (thread ids are reused once a thread exits)."""

    def __init__(self):
        self.token = object()


@dataclass(frozen=True)
class SimEvent:
    """Done when queue `qid` has completed `signal` kernels (nothing launched yet: done)."""
    qid: int | None
    signal: int


class SimHipRuntime:
    """Streams, launches and events of this process, over a FakeRuntime (sim.workload) whose
    KfdDevice talks to the simulator. Thread-safe: one thread may launch while others wait."""

    def __init__(self, runtime, max_hw_queues=None):
        self.rt = runtime
        self.doorbell = runtime.kfd.backend.doorbell
        self.post_doorbell = runtime.kfd.backend.post_doorbell
        self.flush = runtime.kfd.backend.flush
        env = os.environ.get("GPU_MAX_HW_QUEUES")
        self.max_hw_queues = max_hw_queues or (int(env) if env and env.isdigit() else 4)
        self.pools = {}                   # (gpu_id, priority) -> {qid: refcount}
        self._lock = threading.Lock()     # pools, queue creation, stream signals
        self._dispatched = {}             # qid -> kernels this process dispatched to it
        self._launcher = {}               # qid -> the one thread that launched on it so far (None: several)
        self._thread = _ThreadToken()
        _runtimes.add(self)

    def create_stream(self, name, gpu_id, priority="normal", cu_mask=False):
        if priority not in KFD_PRIORITY:
            raise ValueError(f"priority must be one of {', '.join(KFD_PRIORITY)}, got {priority!r}")
        return SimStream(name, gpu_id, priority, cu_mask)

    def _acquire(self, stream):
        pool = self.pools.setdefault((stream.gpu_id, stream.priority), {})
        if stream.cu_mask:
            return self.rt.create_queue(stream.gpu_id, priority=KFD_PRIORITY[stream.priority])
        if len(pool) < self.max_hw_queues:
            qid = self.rt.create_queue(stream.gpu_id, priority=KFD_PRIORITY[stream.priority])
            pool[qid] = 1
            return qid
        qid = min(pool, key=pool.get)
        pool[qid] += 1
        return qid

    def _after_fork_in_child(self):
        """A child forked while another thread held the lock would wait on it for good."""
        self._lock = threading.Lock()

    def launch(self, stream, work_us, waves=64):
        """Launch one kernel on `stream`: `work_us` of work at full device speed, occupying
        `waves` wave slots. Returns once the packet is in the queue, not when it is done."""
        kernel = [float(work_us), operator.index(waves)]
        me = self._thread.token
        with self._lock:
            if stream.qid is None:
                stream.qid = self._acquire(stream)
            qid = stream.qid
            shared = self._launcher.setdefault(qid, me) != me
            if shared and self._launcher[qid] is not None:
                # a second thread on this queue: each thread has its own connection, and the server
                # reads connections in no set order, so from now on every launch on it is answered
                # before the next (a real ring's write index orders them), after what was posted
                self._launcher[qid] = None
                self._received(qid, self._dispatched.get(qid, 0))
            if shared:
                self.doorbell("dispatch", qid=qid, kernels=[kernel])
            else:
                # Posted, not waited for: a real launch writes the packet and the doorbell and goes
                # on. Our queues are ours alone, so we count what we dispatched (its signal) ourselves.
                self.post_doorbell("dispatch", qid=qid, kernels=[kernel])
            self._dispatched[qid] = self._dispatched.get(qid, 0) + 1
            stream.signal = self._dispatched[qid]

    def _received(self, qid, count):
        """Wait until the server has taken `count` kernels for `qid` (posted from any thread: sent,
        but perhaps not yet read; a refused one is raised in the thread that posted it)."""
        deadline = time.monotonic() + RECEIVE_TIMEOUT_S
        while self.doorbell("query", qid=qid)["dispatched"] < count:
            if time.monotonic() > deadline:
                raise SimulatorError(f"launches on queue {qid} did not reach the simulator within "
                                     f"{RECEIVE_TIMEOUT_S:g} s (one was refused?)")
            time.sleep(0)

    def record(self, stream):
        """An event covering everything launched on `stream` so far, from any thread. It waits until
        the server has taken those launches, so that any thread may wait on the event."""
        self.flush()
        with self._lock:
            event = SimEvent(stream.qid, stream.signal)
            others = event.qid is not None and self._launcher.get(event.qid) not in (None, self._thread.token)
        if others:                               # another thread's launches: posted, perhaps not yet read
            self._received(event.qid, event.signal)         # (not under the lock: other streams launch on)
        return event

    def query(self, event):
        """True if everything the event covers is done (never blocks)."""
        if event.qid is None or not event.signal:
            return True
        return self.doorbell("query", qid=event.qid)["completed"] >= event.signal

    def synchronize(self, event):
        """Block this thread until the event is done; SimulatorError if its queue is destroyed first.
        Returns when its work completed on the simulated GPU (CLOCK_MONOTONIC ns; None for an event
        that covers nothing, or one done so long ago the simulator no longer knows): this returns
        later, by however long the simulator's one thread took to answer."""
        if event.qid is not None and event.signal:
            return self.doorbell("wait", qid=event.qid, count=event.signal).get("completed_at")
        return None

    def stream_synchronize(self, stream):
        self.synchronize(self.record(stream))

    def destroy_stream(self, stream):
        with self._lock:
            if stream.qid is None:
                return
            pool = self.pools.get((stream.gpu_id, stream.priority), {})
            if stream.qid in pool:
                pool[stream.qid] -= 1
                if pool[stream.qid] == 0:
                    del pool[stream.qid]
                    self._destroy_queue(stream.qid)
            else:
                self._destroy_queue(stream.qid)
            stream.qid = None

    def _destroy_queue(self, qid):
        """Under self._lock. The kernel may give its id to the next queue: that one counts from 0."""
        self.rt.destroy_queue(qid)
        self._dispatched.pop(qid, None)
        self._launcher.pop(qid, None)


# Every runtime of this process, for the fork handler below
_runtimes = weakref.WeakSet()


def _after_fork_in_child():
    for runtime in list(_runtimes):
        runtime._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)

# The GPU runtime is per process (ROCr's): pid -> (SimHips open, whether one of them turned it on)
_process_runtime = {}
_process_runtime_lock = threading.Lock()


class SimHip(SimHipRuntime):
    """This process as a HIP program on the running simulated machine `machine_name`: opens its
    KFD (RUNTIME_ENABLE, as ROCr does at init) and numbers its GPUs in topology order."""

    def __init__(self, machine_name, max_hw_queues=None):
        from ..device import KfdDevice
        from ..errors import Busy
        from ..ioctls.constants import KFD_RUNTIME_ENABLE_MODE_ENABLE_MASK
        from ..ioctls.structs import kfd_ioctl_runtime_enable_args
        from . import runner
        from .workload import FakeRuntime
        sim = runner.machine(machine_name)
        if not sim.is_running():
            raise SimulatorError(f"simulated {machine_name} is not running (start it: kfdtool sim start {machine_name})")
        self.machine_name = machine_name
        self._kfd = KfdDevice(sim.open_kfd())
        runtime = FakeRuntime(self._kfd, sim.sysfs_root, runtime_enable=False)
        try:
            self._kfd.ioctl("RUNTIME_ENABLE", kfd_ioctl_runtime_enable_args(0, KFD_RUNTIME_ENABLE_MODE_ENABLE_MASK, 0))
            enabled = True
        except Busy:           # a second SimHip in one process: the process is runtime-enabled once
            enabled = False
        with _process_runtime_lock:
            users, ours = _process_runtime.get(os.getpid(), (0, False))
            _process_runtime[os.getpid()] = (users + 1, ours or enabled)
        super().__init__(runtime, max_hw_queues)
        self.gpus = [node.gpu_id for node in self.rt.topology.for_each_gpu()]
        self._streams = 0
        self._closed = False

    def device_count(self):
        return len(self.gpus)

    def _gpu(self, device):
        if isinstance(device, bool) or not isinstance(device, int) or not 0 <= device < len(self.gpus):
            raise ValueError(f"device {device!r}: simulated {self.machine_name} has devices 0..{len(self.gpus) - 1}")
        return self.gpus[device]

    def device_key(self, device=0):
        """A stable nonzero number naming the GPU across processes: its KFD gpu_id."""
        return self._gpu(device)

    def stream(self, device=0, priority="normal", cu_mask=False):
        gpu_id = self._gpu(device)
        with self._lock:
            self._streams += 1
            name = f"stream{self._streams}"
        return self.create_stream(name, gpu_id, priority, cu_mask)

    def close(self):
        """Destroy our queues and free our memory (the simulator also does it when we exit)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.pools.clear()
        with _process_runtime_lock:
            users, ours = _process_runtime.get(os.getpid(), (1, False))
            _process_runtime[os.getpid()] = (users - 1, ours)
        # the last SimHip of a process whose runtime a SimHip turned on turns it off (hsa_shut_down)
        self.rt.runtime_enabled = users == 1 and ours
        self.rt.close()
        self._kfd.close()


class SimModel:
    """A "module": a fixed list of kernels [(work_us, waves)]. Calling it launches them one by one
    through `hip.launch` (so a scheduler that wraps SimHip.launch sees every kernel) and returns
    the event of the last one."""

    def __init__(self, hip, kernels, name="model"):
        self.hip = hip
        self.kernels = [(float(work_us), operator.index(waves)) for work_us, waves in kernels]
        self.name = name

    def __repr__(self):
        return f"SimModel({self.name!r}, {len(self.kernels)} kernels)"

    def __call__(self, stream):
        for work_us, waves in self.kernels:
            self.hip.launch(stream, work_us=work_us, waves=waves)
        return self.hip.record(stream)
