"""A virtual GPU for tests and simulations. One device thread per SimGPU executes the commands of
all its hardware queues one at a time, oldest launch first (a GPU without queue priorities); a
command is a duration in µs. Lv3: interrupt stops a queue mid-command and restore continues it
where it stopped, like a CWSR save and restore; the device meanwhile runs other queues."""
import itertools
import threading
import time
from collections import deque

from ..levels import HwQueue, Level

SLICE_S = 0.0002


class SimGPU:
    def __init__(self, time_scale=1.0):
        self.time_scale = time_scale
        self.cv = threading.Condition()
        self.queues = []
        self.order = itertools.count()
        self.busy_queue = None
        threading.Thread(target=self._device, name="simgpu", daemon=True).start()

    def _pick(self):
        ready = [q for q in self.queues if q._ring and not q._stopped]
        return min(ready, key=lambda q: q._ring[0][0]) if ready else None

    def _device(self):
        while True:
            with self.cv:
                q = self._pick()
                while q is None:
                    self.cv.wait()
                    q = self._pick()
                order, payload, remaining = q._ring[0]
                self.busy_queue = q
            step = min(remaining, SLICE_S) if remaining > 0 else 0.0
            if step:
                end = time.perf_counter() + step
                while time.perf_counter() < end:          # precise short waits
                    time.sleep(0)
            with self.cv:
                self.busy_queue = None
                if q._ring and q._ring[0][0] == order:
                    remaining -= step
                    if remaining <= 1e-9:
                        q._ring.popleft()
                        q.executed.append(payload)
                        q._completed += 1
                    else:
                        q._ring[0] = (order, payload, remaining)   # preempted mid-command: resumes here
                self.cv.notify_all()


class SimHwQueue(HwQueue):
    def __init__(self, level=Level.INTERRUPT, time_scale=1.0, name="simq", gpu=None):
        self.max_level = Level(level)
        self.why = ("simulated: interrupt/restore model CWSR save/restore" if self.max_level >= Level.INTERRUPT
                    else "simulated Lv1 device")
        self.gpu = gpu or SimGPU(time_scale)
        self.name = name
        self.executed = []                 # payloads in execution order
        self._ring = deque()               # (launch order, payload, seconds left)
        self._stopped = False
        self._launched = 0
        self._completed = 0
        with self.gpu.cv:
            self.gpu.queues.append(self)

    def launch(self, payload):
        with self.gpu.cv:
            self._ring.append((next(self.gpu.order), payload, _duration(payload) * self.gpu.time_scale / 1e6))
            self._launched += 1
            self.gpu.cv.notify_all()

    def record_sync_point(self):
        with self.gpu.cv:
            return self._launched

    def sync_point_done(self, handle):
        with self.gpu.cv:
            return self._completed >= handle

    def wait_sync_point(self, handle):
        with self.gpu.cv:
            while self._completed < handle:
                self.gpu.cv.wait()


    def synchronize(self):
        self.wait_sync_point(self.record_sync_point())

    def idle(self):
        with self.gpu.cv:
            return self.gpu.busy_queue is not self and (self._stopped or not self._ring)

    def _stop(self, stopped):
        with self.gpu.cv:
            self._stopped = stopped
            if stopped:
                while self.gpu.busy_queue is self:     # the slice in progress is the save point
                    self.gpu.cv.wait()
            self.gpu.cv.notify_all()

    def interrupt(self):
        if self.max_level < Level.INTERRUPT:
            return super().interrupt()
        self._stop(True)

    def restore(self):
        if self.max_level < Level.INTERRUPT:
            return super().restore()
        self._stop(False)

    def deactivate(self):
        if self.max_level < Level.DEACTIVATE:
            return super().deactivate()
        self._stop(True)

    def reactivate(self):
        if self.max_level < Level.DEACTIVATE:
            return super().reactivate()
        self._stop(False)


def _duration(payload):
    if isinstance(payload, (int, float)):
        return payload
    if isinstance(payload, tuple):
        return payload[1]
    return getattr(payload, "duration_us", 0)
