"""xsched_lv3: preemptive GPU scheduling. XQueues over hardware queues with Lv1 progressive
launching everywhere and Lv3 (CWSR queue suspend through KFD) on AMD; policies; an in-process
scheduler, a multi-process daemon, and PyTorch integration without code changes."""
from .levels import HwQueue, Level, LevelUnsupported, pick_level  # noqa: F401
from .policy import (POLICIES, BandwidthPartition, Decision, HighestPriorityFirst,  # noqa: F401
                     KEarliestDeadlineFirst, Laxity, Policy, QueueState, make_policy)
from .scheduler import LocalScheduler  # noqa: F401
from .window import ProgressiveWindow  # noqa: F401
from .xqueue import XQueue  # noqa: F401

__version__ = "0.1.0"
