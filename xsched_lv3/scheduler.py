"""LocalScheduler: schedules this process's XQueues with a policy, on one thread that wakes on
queue state changes, hint changes and the policy's timers."""
import threading
import time

from .policy import QueueState, check_hint, make_policy


class LocalScheduler:
    def __init__(self, policy="hpf", **policy_args):
        self.policy = make_policy(policy, **policy_args) if isinstance(policy, str) else policy
        self.queues = {}
        self._cv = threading.Condition()
        self._dirty = True
        self._stop = False
        self.decisions = 0
        self._thread = threading.Thread(target=self._loop, name="xsched-scheduler", daemon=True)
        self._thread.start()

    def add(self, xq, device=0):
        xq.device = device
        xq.on_state = self._poke
        with self._cv:
            self.queues[xq.id] = xq
        self._poke()
        return xq

    def remove(self, xq):
        with self._cv:
            self.queues.pop(xq.id, None)
        xq.resume()
        self._poke()

    def hint(self, xq, name, value):
        xq.hints[name] = check_hint(name, value)
        self._poke()

    def _poke(self, *_):
        with self._cv:
            self._dirty = True
            self._cv.notify()

    def schedule_now(self):
        queues = list(self.queues.values())
        now = time.monotonic()
        states = [QueueState(q.id, getattr(q, "device", 0), q.ready, q.ready_since, dict(q.hints)) for q in queues]
        decision = self.policy.decide(states, now)
        for q in queues:
            if q.id in decision.run:
                q.resume()
            else:
                q.suspend()
        self.decisions += 1
        return decision

    def _loop(self):
        wake_at = None
        while True:
            with self._cv:
                timeout = None if wake_at is None else max(0.0, wake_at - time.monotonic())
                if not self._dirty and not self._stop:
                    self._cv.wait(timeout)
                if self._stop:
                    return
                self._dirty = False
            wake_at = self.schedule_now().wake_at

    def close(self):
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join()
        for q in list(self.queues.values()):
            q.resume()
