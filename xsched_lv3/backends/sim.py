"""A virtual GPU for tests and simulations: one device thread per hardware queue executes commands
(durations in µs) in order, and records what ran. Lv3: interrupt stops the device mid-command and
restore continues it, like a CWSR save and restore."""
import threading
import time
from collections import deque

from ..levels import HwQueue, Level


class SimHwQueue(HwQueue):
    def __init__(self, level=Level.INTERRUPT, time_scale=1.0, name="simq"):
        self.max_level = Level(level)
        self.why = ("simulated: interrupt/restore model CWSR save/restore" if self.max_level >= Level.INTERRUPT
                    else "simulated Lv1 device")
        self.time_scale = time_scale
        self.name = name
        self.executed = []                 # payloads in execution order
        self._ring = deque()
        self._cv = threading.Condition()
        self._stopped = False              # interrupted (Lv3) or deactivated (Lv2)
        self._busy = False
        self._launched = 0
        self._completed = 0
        self._thread = threading.Thread(target=self._device, name=f"simgpu-{name}", daemon=True)
        self._thread.start()

    def _device(self):
        while True:
            with self._cv:
                while not self._ring or self._stopped:
                    self._cv.wait()
                payload = self._ring[0]
                self._busy = True
            remaining = _duration(payload) * self.time_scale / 1e6
            while remaining > 0:                      # runs in slices so an interrupt can cut in
                step = min(remaining, 0.0005)
                time.sleep(step)
                remaining -= step
                with self._cv:
                    while self._stopped:             # saved: resume exactly where it stopped
                        self._busy = False
                        self._cv.wait()
                    self._busy = True
            with self._cv:
                self._ring.popleft()
                self.executed.append(payload)
                self._completed += 1
                self._busy = False
                self._cv.notify_all()

    def launch(self, payload):
        with self._cv:
            self._ring.append(payload)
            self._launched += 1
            self._cv.notify_all()

    def record_sync_point(self):
        with self._cv:
            return self._launched

    def wait_sync_point(self, handle):
        with self._cv:
            while self._completed < handle:
                self._cv.wait()

    def synchronize(self):
        self.wait_sync_point(self.record_sync_point())

    def idle(self):
        with self._cv:
            return not self._busy and (self._stopped or not self._ring)

    def _stop(self, stopped):
        with self._cv:
            self._stopped = stopped
            self._cv.notify_all()

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
    return getattr(payload, "duration_us", 0) or (payload[1] if isinstance(payload, tuple) else 0)
