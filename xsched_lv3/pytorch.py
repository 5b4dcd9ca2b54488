"""Schedule PyTorch programs, default stream included, without changing them.

`install()` wraps torch.nn.Module.__call__ once. A thread bound to a client (see `client()`), or
every thread of a process started by `xsched-lv3 run`, then
  * treats each top-level module call as a request: marks its client active when it starts and
    idle once its GPU work completes (an event watched off the hot path), if a lower-priority
    client shares the GPU;
  * while a higher-priority client shares the GPU, asks the gate before every module call and
    after every leaf module (so work a parent launches between its children is gated too) whether
    it may launch now, and keeps its in-flight GPU work within the window.
  * in a client that trains (a backward pass reached one of its outputs), gates the backward the same
    way: the autograd node that made a weighted leaf's output (a convolution's, a linear layer's; and
    any leaf's once MAX_LEAVES_PER_HOOK went by unhooked) gets a pre-hook, which autograd runs on its
    own thread just before that node's backward work (the hook checks the gate and counts the leaves
    since the previous hook toward the window), and the optimizer's step is checked before it
    launches (a global step pre-hook).
The gate throttles the launching thread, not a stream, so it covers the default stream and other
streams alike. Not covered: kernels launched outside any module call and optimizer step (plain
functions on tensors between two model calls, a loss computed with them), a client's first
backward pass after a higher client appears, the backward of the unweighted leaves between two
hooks (at most MAX_LEAVES_PER_HOOK - 1 in a row), the backward of work a parent module launches
itself or of a leaf whose output is not a tensor (an LSTM's tuple; both run between their
neighbours' hooks), the inside of a captured CUDA/HIP graph, which is one launch, and the inside
of a torch.compile'd model, whose modules dynamo runs without calling them: a call is one command
to the window. A client with nobody above it pays one wrapper per module call and one board read
per request.

    import xsched_lv3.pytorch as xt
    xt.install()
    with xt.client(priority=10):      # this thread is latency-critical
        y = model(x)
"""
import os
import sys
import threading
import zlib
from contextlib import contextmanager

from .gate import Gate
from .gil import short_switch
from .runenv import process_gate
from .window import DEFAULT_WINDOW_US

MAX_CACHED_STREAMS = 64                    # TorchRecorder's Stream objects, at most
# In a client that trains, the MAX_LEAVES_PER_HOOK-th guarded leaf in a row without a backward hook gets
# one whatever it owns: between two hooks at most MAX_LEAVES_PER_HOOK - 1 leaves' backward runs unchecked
# (_hook_backward)
MAX_LEAVES_PER_HOOK = 3
_local = threading.local()
_process_gate = None
_Tensor = None                             # torch.Tensor, once installed
_installed = False


class TorchRecorder:
    """Sync points as CUDA/HIP events on the current stream, and the GPU in use."""

    def __init__(self):
        import torch
        self.torch = torch
        # Events the gate dropped once they completed, recorded again: creating and destroying an event
        # per sync point cost a launch-bound ResNet-50 b16 about 4 % on an H100
        # (scripts/bench_gate_overhead.py, results/diagnostics/sync_cost_*.json).
        self._reusable = []
        self._streams = {}                     # (stream id, device index, device type) -> torch.cuda.Stream
        c = getattr(torch, "_C", None)
        # the private calls behind torch.cuda.current_stream(), where this torch has both
        self._current_stream_key = getattr(c, "_cuda_getCurrentStream", None)
        self._current_device = getattr(c, "_cuda_getDevice", None)
        if self._current_device is None:
            self._current_stream_key = None

    def record(self):
        """Sync points and request completions wait by spinning (the event's default): a blocking
        wait sleeps in the driver and wakes up to a millisecond late, which on a request
        completion holds every lower-priority client back that much longer."""
        stream = self._current_stream()
        try:
            event = self._reusable.pop()       # IndexError: none (threads of one process share these)
            event.record(stream)               # RuntimeError: first recorded on another GPU (it keeps it)
        except (IndexError, RuntimeError):
            event = self.torch.cuda.Event()
            event.record(stream)
        return event

    def _current_stream(self):
        """The current stream, as `torch.cuda.current_stream()` (what `Event.record()` uses), without
        its cost: that call finds the device through `torch.cuda.is_available()` (an environment
        lookup) and builds a new Stream object every time. In a profile of a GPU-bound batch job
        (ResNet-50 b64 under `xsched-lv3 run` next to a service, H100, torch 2.11, a sync point after
        nearly every leaf module) it took 6.5 % of the job's samples, four times the record itself.
        The (id, device, type) triple behind it is two C calls; its Stream object is made once.
        Streams are per thread in PyTorch, so the key read here is this thread's."""
        if self._current_stream_key is not None:
            try:
                key = self._current_stream_key(self._current_device())
            except (RuntimeError, TypeError):      # another torch's private API: the public one from now on
                self._current_stream_key = None
            else:
                stream = self._streams.get(key)
                if stream is None:
                    if len(self._streams) >= MAX_CACHED_STREAMS:   # a program that makes streams as it goes
                        self._streams.clear()
                    stream = self._streams[key] = self.torch.cuda.current_stream()
                return stream
        return self.torch.cuda.current_stream()

    def done(self, event):
        """Never blocks. True ends the event's use by the gate (its window drops it): reused."""
        if event.query():
            self._reusable.append(event)
            return True
        return False

    def wait(self, event):
        event.synchronize()         # releases the GIL while it waits

    def device_key(self):
        """A number naming the current GPU the same way in every process (from its UUID, else its PCI
        address; CUDA_VISIBLE_DEVICES renumbers indices), or None while this process has not
        initialised the GPU: a module call then runs on the CPU and there is nothing to schedule."""
        cuda = self.torch.cuda
        if not cuda.is_initialized():
            return None
        props = cuda.get_device_properties(cuda.current_device())
        name = str(getattr(props, "uuid", "") or "")
        if not name:
            name = f"{getattr(props, 'pci_domain_id', 0)}:{getattr(props, 'pci_bus_id', 0)}:" \
                   f"{getattr(props, 'pci_device_id', 0)}:{props.name}"
        return zlib.crc32(name.encode()) or 1


def _hook_backward(gate, module, out):
    """In a client that trains, a guarded leaf's output gets a pre-hook on the node that made it, so
    that its backward is gated too. Not every leaf's: autograd calling into Python is what gating a
    backward costs (a training ResNet-50 b32 on an H100 kept 0.88-0.92 of unscheduled with a hook at
    every leaf, 0.96 with none: docs/measurements.md, *A training batch job*), so only the leaves that own a weight
    matrix or filter (convolutions, linear layers, embeddings: whose backward computes a weight
    gradient, the bulk of a backward pass) get one, and any other leaf that is the
    MAX_LEAVES_PER_HOOK-th in a row (a model with few weighted layers stays covered); `module` None
    (a top-level call with nothing counted inside: a leaf, a compiled model) is always hooked. The
    normalisation, activation and pooling leaves in between launch short elementwise kernels; each
    hook counts the leaves since the previous one toward the window (those after a pass's last hook
    run first in its backward, before any check, and are not counted). Once a node: a leaf that returns its input (Identity, Dropout
    in eval) finds the previous leaf's node hooked already, while an in-place one
    (ReLU(inplace=True)) has made a node of its own. A node pre-hook, not Tensor.register_hook: it
    fires at the same moment (before the leaf's backward) and costs less to register
    (scripts/probes/torch_cpu_checks.py). The node is remembered by id only (a reference would keep
    its saved tensors alive after the graph is freed), and forgotten at each request's start: within
    one forward pass every node is alive, so its id is its own; across passes a freed node's id is
    reused at once."""
    if not (isinstance(out, _Tensor) and out.requires_grad):
        return                      # no backward runs through it (a frozen backbone): nothing to count
    gate.unhooked_leaves = leaves = gate.unhooked_leaves + 1
    if leaves < MAX_LEAVES_PER_HOOK and module is not None and not _owns_weight_matrix(module):
        return
    node = out.grad_fn
    if node is not None and id(node) != gate.hooked_node:   # None: it returned a leaf tensor (a parameter)
        gate.hooked_node = id(node)
        node.register_prehook(gate.backward_hook(leaves))
        gate.unhooked_leaves = 0


def _owns_weight_matrix(module):
    for parameter in getattr(module, "_parameters", {}).values():
        if parameter is not None and parameter.ndim >= 2:
            return True
    return False


def _watch_for_backward(gate, out):
    """A guarded client is found to train when a backward pass reaches the output of one of its
    requests: a pre-hook on the node that made it (the first tensor of a tuple, list or dict output,
    a Hugging Face ModelOutput included) says so. Until then its leaves get no backward hooks, so a
    job that runs forward passes with autograd on and never a backward (an eval() model without
    no_grad) registers one hook a request, not one a leaf; its first backward pass is not gated."""
    if isinstance(out, dict):
        out = next(iter(out.values()), None)
    elif isinstance(out, (tuple, list)):
        out = out[0] if out else None
    if isinstance(out, _Tensor) and out.requires_grad and out.grad_fn is not None:
        out.grad_fn.register_prehook(gate.backward_reached)


def _update_dynamos_record(scheduled_call):
    """Dynamo inlines a compiled model's modules (never calling them) only while nn.Module.__call__
    is the one it saw at its own import (torch/_dynamo/utils.py: unpatched_nn_module_call, imported
    by name into variables/nn_module.py); one patched later is traced, and the gate's board reads
    break the graph at every module. `xsched-lv3 run` installs at torch's import, before dynamo's;
    a program that compiled something before `install()` gets dynamo's record updated, so compiled
    models behave alike either way (dynamo's private names: where they are missing, nothing)."""
    for name in ("torch._dynamo.utils", "torch._dynamo.variables.nn_module"):
        module = sys.modules.get(name)
        if module is not None and getattr(module, "unpatched_nn_module_call", None) is not None:
            module.unpatched_nn_module_call = scheduled_call


def _forget_gates_in_forked_child():
    """A forked child (a DataLoader worker, whose transforms may be modules) runs unscheduled: the
    gates, their board slots and watcher threads are the parent's, and a CUDA event recorded in it
    raises ("Cannot re-initialize CUDA in forked subprocess"). A spawned child under `xsched-lv3 run`
    is a client of its own."""
    global _process_gate
    _process_gate = None
    _local.__dict__.clear()


def _direct_forward_test(torch, original):
    """What Module.__call__ as torch ships it tests before it runs a module's `forward` directly
    (torch/nn/modules/module.py, 2.1 to 2.14 alike: Module._wrapped_call_impl, no compiled call; then
    Module._call_impl, no hook of the module's own, no global one, not tracing): (the module that holds
    the four global hook dicts, read at each call as torch reads them, since code outside torch rebinds
    them; torch's own _call_impl; the tracing test), or None where this torch lacks one of those names,
    or where Module.__call__ or Module._call_impl is no longer torch's own (another wrapper: calls must
    go through it). A nested module call that passes the same test, whose class keeps torch's
    _call_impl, outside any profiler (torch's finds module calls by their frames), runs its `forward`
    from the wrapper: one Python frame, the wrapper's, instead of torch's two plus it."""
    holder = getattr(getattr(getattr(torch, "nn", None), "modules", None), "module", None)
    call_impl = getattr(torch.nn.Module, "_call_impl", None)
    tracing = getattr(getattr(torch, "_C", None), "_get_tracing_state", None)
    hook_dicts = ("_global_forward_pre_hooks", "_global_forward_hooks", "_global_backward_pre_hooks",
                  "_global_backward_hooks")
    if holder is None or tracing is None or not all(isinstance(getattr(holder, n, None), dict) for n in hook_dicts):
        return None
    if not getattr(original, "__qualname__", "").endswith("Module._wrapped_call_impl") or \
            not getattr(call_impl, "__qualname__", "").endswith("Module._call_impl"):
        return None
    return holder, call_impl, tracing


def install():
    """Wrap nn.Module.__call__ (idempotent) and hook every optimizer's step."""
    global _installed, _Tensor
    if _installed:
        return
    import torch
    original = torch.nn.Module.__call__
    _Tensor = torch.Tensor
    direct = _direct_forward_test(torch, original)
    hooks, call_impl, tracing = direct or (None, None, None)
    getprofile = sys.getprofile

    # `self` is the module called, named as in torch's: torch's profiler (with_stack) reads the local of
    # that name from what it takes for Module.__call__'s frame, and crashed the process otherwise
    def scheduled_call(self, *args, **kwargs):
        state = _local.__dict__
        gate = state.get("inside")          # the gate of the request this thread is in, if any
        if gate is not None:                # a nested module call, the common case: kept short
            if gate.guarded:
                if gate.board_generation[0] != gate.seen_generation or not gate.clear_to_run:
                    gate.check()            # only while a higher-priority client shares the GPU
            elif gate.awaiting_device:      # a higher client is there: has this call's parent just begun using a GPU?
                gate.notice_device()        # (and held here if so)
            # torch's own fast path, without its two frames (see _direct_forward_test)
            if direct is not None and self._compiled_call_impl is None and type(self)._call_impl is call_impl \
                    and not (self._forward_pre_hooks or self._forward_hooks or self._backward_pre_hooks
                             or self._backward_hooks or hooks._global_forward_pre_hooks
                             or hooks._global_forward_hooks or hooks._global_backward_pre_hooks
                             or hooks._global_backward_hooks or tracing() or getprofile()):
                out = self.forward(*args, **kwargs)
            else:
                out = original(self, *args, **kwargs)
            if gate.guarded and not self._modules:
                gate.after_leaf()
                if gate.trains:
                    _hook_backward(gate, self, out)     # its backward is gated too
            return out
        gate = state.get("gate") or _process_gate
        if gate is None:
            return original(self, *args, **kwargs)
        gate.begin_request()                # a top-level call: one request
        state["inside"] = gate
        counted = gate.leaves_counted() if gate.guarded else None
        try:
            if gate.guarded:
                gate.check()                # inside the try: interrupted while held, the request still ends
            out = original(self, *args, **kwargs)
        finally:
            state["inside"] = None
            gate.end_request()              # also when the request raised: never left active
        if gate.guarded and (counted is None or gate.leaves_counted() == counted):
            # No module inside was called through us: a leaf, or a compiled model (dynamo runs the
            # forward of the modules inside it without calling them), which is then one command to
            # the window: at most about one call stays in flight beyond it
            gate.after_leaf()
            if gate.trains:
                # hooked whatever it owns: a compiled model's parameters are its inner module's, and its
                # one backward node holds the whole model's backward
                _hook_backward(gate, None, out)
        if gate.guarded and not gate.trains:
            _watch_for_backward(gate, out)
        return out

    def before_optimizer_step(optimizer, args, kwargs):
        gate = _local.__dict__.get("gate") or _process_gate
        if gate is not None and gate.guarded:
            gate.after_leaf()               # the backward's last segment is in flight: a sync point, a check
        return None

    torch.nn.Module.__call__ = scheduled_call
    _update_dynamos_record(scheduled_call)
    os.register_at_fork(after_in_child=_forget_gates_in_forked_child)
    optim = getattr(getattr(torch, "optim", None), "optimizer", None)
    register_step_hook = getattr(optim, "register_optimizer_step_pre_hook", None)   # torch >= 2.0
    if register_step_hook is not None:
        register_step_hook(before_optimizer_step)   # for the life of the process: it finds no gate once closed
    _installed = True


@contextmanager
def client(priority=0, policy="hpf", window_us=DEFAULT_WINDOW_US, **hints):
    """Bind the current thread to a scheduled client for the duration of the block."""
    install()
    gate = Gate(TorchRecorder(), priority, policy, window_us, **hints)
    previous = getattr(_local, "gate", None)
    _local.gate = gate
    _thread_clients(+1)
    try:
        yield gate
    finally:
        _thread_clients(-1)
        _local.gate = previous
        gate.close()


_clients_lock = threading.Lock()
_clients = {"n": 0}
# With two scheduled threads in one process, a high-priority thread that wakes up for a request needs
# the GIL while a batch thread is launching. PyTorch's op bindings release it around every op, but a
# thread that releases and retakes it at once usually wins the race against a waiter that has to be
# woken, so the waiter gets it once the switch interval (5 ms by default) forces a hand-over: while two
# clients share the process, it is short (gil.short_switch). Measured both ways
# (scripts/probes/threads_b16.py; results/diagnostics/threads_b16_probe_*.txt and
# bench_two_models_threads_switch_ab_h200_68b3ae5.json): short probes favoured the default interval for
# a ResNet-50 b16 batch thread (ahead in 4 of 5 pairs, by 12-31 %; 12 s runs, noise ~20 %), a full run
# did not (0.67 of alone against 0.69 with 0.5 ms), and there the transformer service's P99 went from
# 0.93x to 1.56x of alone.


def _thread_clients(delta):
    with _clients_lock:
        before = _clients["n"]
        _clients["n"] = after = before + delta
        if before < 2 <= after:
            short_switch.hold()
        elif after < 2 <= before:
            short_switch.release()


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
    _process_gate = process_gate(TorchRecorder())
    return _process_gate
