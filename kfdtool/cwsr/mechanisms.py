"""One interface over every way to preempt GPU queues.

    mech = DebugTrapSuspend(kfd, pid)            # or UpdateQueueSuspend / PatchedIoctlSuspend
    result = mech.suspend([0, 1], grace_period=100)
    result.outcomes, result.notes                # per queue; what the caller should know
    ...
    mech.resume([0, 1])
    mech.close()                                 # always: it resumes whatever is still suspended
"""
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field


@dataclass
class Availability:
    mechanism: str
    available: bool
    why: str
    notes: list = field(default_factory=list)

    def to_dict(self):
        return asdict(self)


@dataclass
class QueueOutcome:
    qid: int
    outcome: str                  # suspended | resumed | already | new-queue | not-found | error
    gpu_id: int | None = None
    ctl_stack_bytes: int | None = None
    save_area_bytes: int | None = None
    detail: str = ""

    @property
    def ok(self):
        return self.outcome in ("suspended", "resumed", "already")

    def to_dict(self):
        return asdict(self)


@dataclass
class MechanismResult:
    """What one suspend or resume did: an outcome per queue, and notes such as "the MES scheduler
    ignores the grace period" that hold for the whole call."""
    outcomes: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    @property
    def ok(self):
        return all(o.ok for o in self.outcomes)

    @property
    def failed(self):
        return [o for o in self.outcomes if not o.ok]


class Mechanism(ABC):
    """Suspend/resume a set of queues of one target process."""
    name = "abstract"

    def __init__(self):
        self._held = set()

    @abstractmethod
    def suspend(self, qids=None, grace_period=None):
        """Suspend `qids` (None: all), letting running waves finish for `grace_period` (units of
        1K GPU clocks; None: the driver's default) where the mechanism has one, and saying so in
        the notes where it has none. Returns a MechanismResult."""

    @abstractmethod
    def resume(self, qids=None):
        """Resume `qids` (None: every queue we hold). Returns a MechanismResult."""

    @abstractmethod
    def close(self):
        """Resume everything still held and release the target. Safe to call twice."""

    def suspended(self):
        """Queue ids this mechanism holds suspended right now."""
        return set(self._held)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
