"""The policy API: what scheduling policies import.

A policy sees the state of every queue it schedules and answers which may run now, and when it
wants to be asked again (a timer). The same policies drive in-process XQueues (LocalScheduler),
the multi-process daemon, and the PyTorch gates, which evaluate them on a shared board.

    class MyPolicy(Policy):
        def decide(self, queues, now):
            return Decision(run={q.id for q in queues if q.hints.get("priority", 0) >= 0})
"""
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field


@dataclass
class QueueState:
    id: object
    device: object = 0
    ready: bool = False                   # has work (buffered, in flight, or a request in progress)
    ready_since: float | None = None      # when it became ready (deadlines count from here)
    hints: dict = field(default_factory=dict)   # priority, utilization, deadline_us, laxity_us, ...
    pid: int = 0                          # the process it belongs to, where known (0: not known)


@dataclass
class Decision:
    run: set
    wake_at: float | None = None          # call decide() again at this monotonic time


class Policy(ABC):
    name = "abstract"
    # True when a queue is held back only by queues of higher priority on its device: then the top
    # priority is never held and a queue with nobody above it needs no gating at all
    strict_priority = False

    @abstractmethod
    def decide(self, queues, now):
        """queues: [QueueState]; returns a Decision. Queues not in `run` are suspended."""


GAP_HISTORY = 16               # the recent idle gaps that choose a hysteresis (hold_for)


def hold_for(switch_s, gaps):
    """How long to keep lower clients held (or suspended) once the clients above them go idle: 0
    (release now) or `switch_s`, the ski-rental choice. Releasing now costs a switch (what the release
    and the next hold cost: about `switch_s`) after every gap; waiting costs the time waited, min(gap,
    switch_s), plus a switch after each gap longer than that. Over the recent `gaps`, the cheaper of
    the two; with none yet, wait (never worse than twice the best choice in hindsight). The Lv3 daemon
    keeps a lower client suspended by it (lv3.py); a guarded client's gate keeps its busy period open
    across the short gaps between its requests by it (gate.py)."""
    if not gaps:
        return switch_s
    waiting = sum(min(g, switch_s) + (switch_s if g > switch_s else 0.0) for g in gaps)
    return switch_s if waiting < switch_s * len(gaps) else 0.0


def shares_device(a, b):
    """Two queues' devices may be the same GPU: equal, or either not known yet (0)."""
    return a == b or not a or not b


class HighestPriorityFirst(Policy):
    """Per device: run the queues at or above the highest ready priority on their device (a queue
    whose device is not known, 0, counts on every device). Idle queues below it are held too: they
    have nothing in flight, and their next command waits."""
    name = "hpf"
    strict_priority = True

    def decide(self, queues, now):
        ready = [q for q in queues if q.ready]

        def bar(q):
            return max((r.hints.get("priority", 0) for r in ready if shares_device(r.device, q.device)),
                       default=-math.inf)
        return Decision({q.id for q in queues if q.hints.get("priority", 0) >= bar(q)})


class BandwidthPartition(Policy):
    """Round-robin time slices proportional to each ready queue's `utilization` hint (XSched's UP);
    queues without a share never run while others are ready."""
    name = "bandwidth"

    def __init__(self, timeslice_us=5000):
        self.timeslice_us = timeslice_us

    def decide(self, queues, now):
        shares = [(q, q.hints.get("utilization", 0)) for q in queues if q.ready and q.hints.get("utilization", 0) > 0]
        if not shares:
            return Decision({q.id for q in queues})
        total = sum(u for _, u in shares)
        period = self.timeslice_us / 1e6
        t = now % period
        start = 0.0
        for q, u in sorted(shares, key=lambda x: str(x[0].id)):
            span = period * u / total
            if start <= t < start + span:
                idle = {x.id for x in queues if not x.ready}
                return Decision({q.id} | idle, wake_at=now - t + start + span)
            start += span
        return Decision({shares[-1][0].id}, wake_at=now - t + period)


class KEarliestDeadlineFirst(Policy):
    """Run the K ready queues whose deadline (ready_since + deadline_us hint) comes first."""
    name = "kedf"

    def __init__(self, k=1):
        self.k = k

    def decide(self, queues, now):
        def deadline(q):
            d = q.hints.get("deadline_us")
            return (q.ready_since or now) + d / 1e6 if d is not None else math.inf
        ready = sorted((q for q in queues if q.ready), key=deadline)
        return Decision({q.id for q in ready[:self.k]} | {q.id for q in queues if not q.ready})


class Laxity(Policy):
    """XSched's LAX: a queue runs at `priority` until its laxity (ready_since + laxity_us) expires,
    then at `critical_priority`; highest effective priority wins, per device."""
    name = "laxity"

    def decide(self, queues, now):
        effective, wake = [], None
        for q in queues:
            prio = q.hints.get("priority", 0)
            lax = q.hints.get("laxity_us")
            if lax is not None and q.ready and q.ready_since is not None:
                expiry = q.ready_since + lax / 1e6
                if now >= expiry:
                    prio = q.hints.get("critical_priority", prio + 100)
                else:
                    wake = expiry if wake is None else min(wake, expiry)
            effective.append(QueueState(q.id, q.device, q.ready, q.ready_since, {"priority": prio}))
        return Decision(HighestPriorityFirst().decide(effective, now).run, wake_at=wake)


POLICIES = {p.name: p for p in (HighestPriorityFirst, BandwidthPartition, KEarliestDeadlineFirst, Laxity)}


def make_policy(name, **kwargs):
    try:
        return POLICIES[name](**kwargs)
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None


HINTS = {"priority": int, "utilization": float, "deadline_us": float, "laxity_us": float,
         "critical_priority": int}


HINT_PRIORITY_RANGE = (-1000, 1000)     # priority and critical_priority (the board stores an int32)


def check_hint(name, value):
    """A hint as its proper type, or ValueError with a one-line reason. The one place hints are
    validated: for the daemon's socket (any JSON a local user sends), the CLI and the library.
    A number only: a bool, a string (text is parsed by whoever reads it), NaN or an infinity is
    refused, and so is a fraction for an integer hint."""
    if not isinstance(name, str) or name not in HINTS:
        raise ValueError(f"unknown hint {short_repr(name)}; choose one of {', '.join(HINTS)}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"hint {name} wants a number, got {short_repr(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"hint {name} must be a finite number, got {value!r}")
    if HINTS[name] is int:
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(f"hint {name} wants a whole number, got {value!r}")
        low, high = HINT_PRIORITY_RANGE
        if not low <= value <= high:
            raise ValueError(f"{name} must be between {low} and {high}, got {short_repr(value)}")
        return int(value)
    if name == "utilization" and not 0 <= value <= 100:
        raise ValueError(f"utilization must be a share between 0 and 100 (percent), got {short_repr(value)}")
    if name in ("deadline_us", "laxity_us") and value < 0:
        raise ValueError(f"{name} must be >= 0, got {short_repr(value)}")
    try:
        return float(value)
    except OverflowError:                  # an int beyond any double
        raise ValueError(f"hint {name} must be a finite number, got {short_repr(value)}") from None


def short_repr(value, limit=40):
    """repr() of a value from outside, cut to `limit` characters for an error line."""
    try:
        text = repr(value)
    except ValueError:                     # an int too long to print (sys.set_int_max_str_digits)
        return f"an integer of {value.bit_length()} bits"
    return text if len(text) <= limit else text[:limit - 3] + "..."
