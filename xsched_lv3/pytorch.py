"""Schedule PyTorch programs, default stream included, without changing them.

`install()` wraps torch.nn.Module.__call__ once. A thread bound to a client (see `client()`), or
every thread of a process started by `xsched-lv3 run`, then
  * marks its client active when a top-level module call starts, and idle once that call's GPU
    work completes (an event watched off the hot path);
  * before every leaf module (conv, linear, norm, ...) asks the gate whether it may launch now
    (the policy on the shared board) and keeps its in-flight GPU work within the window.
The gate throttles the launching thread, not a stream, so it covers the default stream, other
streams and CUDA graphs launched from modules alike. Cost: one wrapper per module call.

    import xsched_lv3.pytorch as xt
    xt.install()
    with xt.client(priority=10):      # this thread is latency-critical
        y = model(x)
"""
import os
import threading
from contextlib import contextmanager

from .gate import Gate

_local = threading.local()
_process_gate = None
_installed = False


class TorchRecorder:
    """Sync points as CUDA/HIP events on the current stream."""

    def __init__(self):
        import torch
        self.torch = torch

    def record(self, blocking=False):
        """blocking=True for waits off the hot path (request completion): the waiting thread then
        sleeps instead of spinning in the driver next to the launching thread. Window sync points
        stay spinning, because their wake-up latency is launch latency. On an H200, spinning
        everywhere cost LP-alone b16 26 % of its throughput and blocking everywhere cost the
        cross-process LP more (results/bench_two_models_overhead.json, ..._b16_blocking.json);
        this split was chosen from those two runs and has not been measured itself."""
        event = self.torch.cuda.Event(blocking=blocking)
        event.record()
        return event

    def wait(self, event):
        event.synchronize()         # releases the GIL while it waits


def _gate():
    return getattr(_local, "gate", None) or _process_gate


def install():
    """Wrap nn.Module.__call__ (idempotent)."""
    global _installed
    if _installed:
        return
    import torch
    original = torch.nn.Module.__call__

    def scheduled_call(module, *args, **kwargs):
        state = _local.__dict__
        gate = state.get("gate") or _process_gate
        if gate is None:
            return original(module, *args, **kwargs)
        depth = state.get("depth", 0)
        if depth == 0:
            gate.begin_request()
        leaf = not module._modules
        if leaf:
            gate.before_launch()
        _local.depth = depth + 1
        try:
            out = original(module, *args, **kwargs)
        finally:
            _local.depth = depth
        if leaf:
            gate.after_launch()
        if depth == 0:
            gate.end_request()
        return out

    torch.nn.Module.__call__ = scheduled_call
    _installed = True


@contextmanager
def client(priority=0, policy="hpf", window_us=300.0, **hints):
    """Bind the current thread to a scheduled client for the duration of the block."""
    install()
    gate = Gate(TorchRecorder(), priority, policy, window_us, name=f"tid{threading.get_native_id()}", **hints)
    previous = getattr(_local, "gate", None)
    _local.gate = gate
    try:
        yield gate
    finally:
        _local.gate = previous
        gate.close()


def scheduled(priority=0, **kwargs):
    """Decorator form of `client()`."""
    def wrap(fn):
        def inner(*a, **k):
            with client(priority, **kwargs):
                return fn(*a, **k)
        inner.__name__, inner.__doc__ = fn.__name__, fn.__doc__
        return inner
    return wrap


def enable_for_process():
    """What `xsched-lv3 run` does inside the child once torch is imported: every thread of this
    process is one client with the priority and hints from the environment."""
    global _process_gate
    install()
    hints = {}
    for env, name in (("XSCHED_LV3_UTILIZATION", "utilization"), ("XSCHED_LV3_DEADLINE_US", "deadline_us"),
                      ("XSCHED_LV3_LAXITY_US", "laxity_us")):
        if os.environ.get(env):
            hints[name] = float(os.environ[env])
    _process_gate = Gate(TorchRecorder(), int(os.environ.get("XSCHED_LV3_PRIORITY", "0")),
                         os.environ.get("XSCHED_LV3_POLICY", "hpf"),
                         float(os.environ.get("XSCHED_LV3_WINDOW_US", "300")) or None, **hints)
    return _process_gate
