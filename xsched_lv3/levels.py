"""Preemption levels and the hardware-queue interface (XSched's HwQueue, paper Table 2).

Lv1 BLOCK      launch / synchronize: the scheduler can only stop *new* commands; in-flight work
               drains (bounded by progressive launching).
Lv2 DEACTIVATE deactivate / reactivate: the queue stops fetching (e.g. KFD UPDATE_QUEUE 0%).
Lv3 INTERRUPT  interrupt / restore: running waves are stopped and saved (KFD CWSR via DBG_TRAP).
"""
import enum
from abc import ABC, abstractmethod


class Level(enum.IntEnum):
    BLOCK = 1
    DEACTIVATE = 2
    INTERRUPT = 3


class HwQueue(ABC):
    """One hardware queue. Lv1 methods are mandatory; higher levels are optional."""
    max_level = Level.BLOCK
    why = "Lv1 only: commands are held back, in-flight work drains"

    @abstractmethod
    def launch(self, command):
        """Submit one command; must not block on the GPU."""

    @abstractmethod
    def synchronize(self):
        """Wait until every launched command has completed."""

    @abstractmethod
    def record_sync_point(self):
        """Return a handle whose completion can be waited on (an event after the last launch)."""

    @abstractmethod
    def wait_sync_point(self, handle):
        """Block until `handle` completed."""

    @abstractmethod
    def sync_point_done(self, handle):
        """Whether `handle` completed; never blocks."""


    def deactivate(self):
        raise LevelUnsupported(self, Level.DEACTIVATE)

    def reactivate(self):
        raise LevelUnsupported(self, Level.DEACTIVATE)

    def interrupt(self):
        raise LevelUnsupported(self, Level.INTERRUPT)

    def restore(self):
        raise LevelUnsupported(self, Level.INTERRUPT)


class LevelUnsupported(RuntimeError):
    def __init__(self, queue, level):
        super().__init__(f"{type(queue).__name__} supports up to Lv{int(queue.max_level)}, not Lv{int(level)}")


def pick_level(queue, wanted=None):
    """The highest level this queue supports (or `wanted`, if it is supported), with the reason."""
    level = queue.max_level if wanted is None else Level(wanted)
    if level > queue.max_level:
        raise LevelUnsupported(queue, level)
    return level, queue.why
