"""LocalScheduler: schedules this process's XQueues with a policy, on one thread that wakes on
queue state changes, hint changes and the policy's timers.

With a board (`LocalScheduler(board=Board())`) the XQueues are clients of the same registry as
every program under `xsched-lv3 run` and every `xt.client` (one board slot each, registered through
the daemon when one runs, so the daemon sees and may preempt them too): each queue's activity is
marked on it, and the policy decides over every client there, so a high-priority program elsewhere
suspends this process's low-priority queues and is suspended by its high-priority ones. Without one,
the decisions weigh this process's queues only."""
import os
import threading
import time

from .board import excuse, register_client, set_client_hint, stopped_activations
from .policy import QueueState, check_hint, make_policy

BOARD_POLL_S = 1e-3            # with a board: how often other clients' changes are looked for (while ours have work)
REAP_EVERY_S = 0.05            # ... and dead clients released (they must not hold our queues)


class LocalScheduler:
    def __init__(self, policy="hpf", board=None, **policy_args):
        self.policy = make_policy(policy, **policy_args) if isinstance(policy, str) else policy
        self.board = board
        self.queues = {}
        self._slots = {}                   # XQueue id -> its board slot (with a board)
        self._seen_generation = None
        self._reaped_at = 0.0
        # (slot, ready_since) of activations whose process is stopped (SIGSTOP, a debugger): they hold
        # nobody, as in the gate (gate.py: _excused)
        self._excused = set()
        self._cv = threading.Condition()
        self._dirty = True
        self._stop = False
        self.decisions = 0
        self._thread = threading.Thread(target=self._loop, name="xsched-scheduler", daemon=True)
        self._thread.start()

    def add(self, xq, device=0):
        xq.device = device
        if self.board is not None:
            # the slot binds the queue's launch worker, the thread its commands run from
            self._slots[xq.id] = register_client(self.board, xq.hints.get("priority", 0), xq.worker_tid,
                                                 {k: v for k, v in xq.hints.items() if k != "priority"}, device)
        xq.on_state = self._state_changed
        with self._cv:
            self.queues[xq.id] = xq
        self._state_changed(xq)
        return xq

    def remove(self, xq):
        with self._cv:
            self.queues.pop(xq.id, None)
            slot = self._slots.pop(xq.id, None)
        if slot is not None:
            self.board.release(slot, os.getpid())
        xq.resume()
        self._poke()

    def hint(self, xq, name, value):
        xq.hints[name] = check_hint(name, value)
        slot = self._slots.get(xq.id)
        if slot is not None:
            set_client_hint(self.board, slot, name, xq.hints[name])
        self._poke()

    def _state_changed(self, xq):
        slot = self._slots.get(xq.id)
        if slot is not None:
            self.board.set_active(slot, xq.ready)
        self._poke()

    def _poke(self, *_):
        with self._cv:
            self._dirty = True
            self._cv.notify()

    def schedule_now(self):
        now = time.monotonic()
        if self.board is None:
            queues = list(self.queues.values())
            states = [QueueState(q.id, getattr(q, "device", 0), q.ready, q.ready_since, dict(q.hints)) for q in queues]
            ours = [(q.id, q) for q in queues]
        else:
            reap = now - self._reaped_at > REAP_EVERY_S
            if reap:
                self._reaped_at = now
                self.board.reap()
            self._seen_generation = self.board.generation[0]    # before the read: a write during it shows next time
            states = self.board.states()
            if reap:
                self._excused = stopped_activations(states)
            states = excuse(states, self._excused)
            by_id = dict(self.queues)
            ours = [(slot, by_id[qid]) for qid, slot in list(self._slots.items()) if qid in by_id]
        decision = self.policy.decide(states, now)
        for key, q in ours:
            if key in decision.run:
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
                if self.board is not None and any(q.ready or q.suspended for q in self.queues.values()):
                    # others' changes matter to a queue with work or one held back; an idle one learns
                    # them when it next has work (its state change wakes us)
                    timeout = BOARD_POLL_S if timeout is None else min(timeout, BOARD_POLL_S)
                if not self._dirty and not self._stop:
                    self._cv.wait(timeout)
                if self._stop:
                    return
                now = time.monotonic()
                changed = self.board is not None and (
                    self.board.generation[0] != self._seen_generation
                    # held back: a dead or stopped client above must not keep us so (schedule_now reaps)
                    or now - self._reaped_at > REAP_EVERY_S and any(q.suspended for q in self.queues.values()))
                if not (self._dirty or changed or (wake_at is not None and now >= wake_at)):
                    continue               # a poll that found nothing new
                self._dirty = False
            wake_at = self.schedule_now().wake_at

    def close(self):
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join()
        for q in list(self.queues.values()):
            q.resume()
        for slot in self._slots.values():
            self.board.release(slot, os.getpid())
        self._slots.clear()
