"""Schedule programs written against the simulator's HIP-like runtime (`kfdtool.sim.hip`) the way
`xsched_lv3.pytorch` schedules PyTorch: without changing them, under `xsched-lv3 run`.

`SimModel.__call__` plays `torch.nn.Module.__call__` (a top-level call is one request) and each
`SimHip.launch` inside it is a leaf (gated before, counted by the window after) while the client
is held at Lv1. At Lv3 (the daemon suspends this process's KFD queues) nothing is gated: the
wrappers only mark requests active and idle. This is what the simulated end-to-end benchmark runs.
"""
import os
import threading

from .board import kfd_device_key
from .runenv import process_gate

_local = threading.local()
_process_gate = None
_installed = False


class SimHipRecorder:
    """Sync points as events on the stream this process last launched on, and its GPU."""

    def __init__(self):
        self.hip = None
        self.stream = None

    def record(self):
        if self.stream is None:
            return None
        return self.hip.record(self.stream)

    def done(self, event):
        return event is None or self.hip.query(event)

    def wait(self, event):
        if event is not None:
            self.hip.synchronize(event)

    def device_key(self):
        """Nonzero once this process launched on a GPU, naming it the same way in every process
        (its KFD gpu_id is the machine's name for it)."""
        if self.stream is None:
            return None
        return kfd_device_key(self.stream.gpu_id)


def install():
    """Wrap SimModel.__call__ (requests) and SimHip.launch (leaves) once."""
    global _installed
    if _installed:
        return
    from kfdtool.sim import hip as sim_hip
    call, launch = sim_hip.SimModel.__call__, sim_hip.SimHip.launch

    def scheduled_call(model, *args, **kwargs):
        gate = _process_gate
        if gate is None or getattr(_local, "inside", False):
            return call(model, *args, **kwargs)
        gate.begin_request()
        _local.inside = True
        try:
            if gate.guarded:
                gate.check()
            return call(model, *args, **kwargs)
        finally:
            _local.inside = False
            gate.end_request()              # also when the request raised: never left active

    def scheduled_launch(hip, stream, *args, **kwargs):
        gate = _process_gate
        if gate is None:
            return launch(hip, stream, *args, **kwargs)
        recorder = gate.recorder
        if recorder.stream is not stream:
            recorder.hip, recorder.stream = hip, stream
            gate.notice_device()            # its first launch names its GPU: gated from this one on
        if not gate.guarded:
            return launch(hip, stream, *args, **kwargs)
        if gate.board_generation[0] != gate.seen_generation or not gate.clear_to_run:
            gate.check()
        out = launch(hip, stream, *args, **kwargs)
        if gate.guarded:
            gate.after_leaf()
        return out

    sim_hip.SimModel.__call__ = scheduled_call
    sim_hip.SimHip.launch = scheduled_launch
    os.register_at_fork(after_in_child=_forget_gate_in_forked_child)
    _installed = True


def _forget_gate_in_forked_child():
    """A forked child runs unscheduled, as under PyTorch (pytorch._forget_gates_in_forked_child): the
    gate, its board slot and its watcher are the parent's, and the child's requests marked the
    parent active with no watcher to mark it idle, so lower clients stayed held or suspended until
    the parent exited. A child started anew under `xsched-lv3 run` is a client of its own."""
    global _process_gate
    _process_gate = None
    _local.__dict__.clear()


def enable_for_process():
    """What `xsched-lv3 run` does once `kfdtool.sim.hip` is imported: the whole process is one
    client with the priority and hints from the environment (as for PyTorch)."""
    global _process_gate
    install()
    _process_gate = process_gate(SimHipRecorder())
    return _process_gate
