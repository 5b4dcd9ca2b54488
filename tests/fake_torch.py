"""A minimal stand-in for the parts of torch that xsched_lv3 touches: nn.Module.__call__, CUDA
events and streams. Kernels are (duration) items on a fake GPU timeline; events complete when the
timeline passes them. Lets the integration logic run on CI without a GPU."""
import threading
import time
import types
from contextlib import contextmanager


class FakeGPU:
    def __init__(self):
        self.lock = threading.Lock()
        self.busy_until = time.monotonic()
        self.launched = []
        self.queued_for = {}
        self.launched_at = []
        self.events_recorded = 0
        self.pending_events = []           # recorded, not yet passed (launch_ahead moves them)
        self.initialized = True            # torch.cuda.is_initialized(): a process that used the GPU

    def launch(self, name, seconds):
        with self.lock:
            now = time.monotonic()
            start = max(now, self.busy_until)
            self.busy_until = start + seconds
            self.launched.append((name, start, self.busy_until))
            self.launched_at.append(now)            # CPU time of the launch
            self.queued_for[len(self.launched) - 1] = start - now      # GPU work ahead of it
            return self.busy_until

    def launch_ahead(self, name, seconds):
        """A kernel the GPU runs before work already queued (another process's time slice, a
        higher-priority stream): everything queued, and every event recorded after it, moves later."""
        with self.lock:
            now = time.monotonic()
            self.busy_until = max(now, self.busy_until) + seconds
            self.launched.append((name, now, now + seconds))
            self.launched_at.append(now)
            self.queued_for[len(self.launched) - 1] = 0.0
            waiting = [e for e in self.pending_events if e.at > now]
            for event in waiting:
                event.at += seconds
            self.pending_events = waiting


def make(gpu):
    torch = types.ModuleType("torch")
    nn = types.ModuleType("torch.nn")

    class Node:
        """A tensor's grad_fn: the backward of the leaf module that made it."""
        def __init__(self, module):
            self.module, self.prehooks = module, []

        def register_prehook(self, hook):
            self.prehooks.append(hook)

    class Tensor:
        """Only what autograd needs: a tensor that requires grad and was made by a leaf module has a
        grad_fn and remembers that module's input; backward() walks that chain back."""
        def __init__(self, requires_grad=False, made_by=None, source=None):
            self.requires_grad, self.source = requires_grad, source
            self.grad_fn = Node(made_by) if requires_grad and made_by is not None else None

        def backward(self):
            """As the CUDA autograd engine: on a thread of its own while the caller waits; from this
            tensor back, each grad_fn's pre-hooks, then its module's backward kernel (the module's
            backward_s, else twice its forward's time)."""
            def engine():
                tensor = self
                while tensor is not None:
                    node = tensor.grad_fn
                    if node is not None:
                        for hook in node.prehooks:
                            hook(("grad",))
                        maker = node.module
                        gpu.launch(maker.name + ".backward", getattr(maker, "backward_s", 2 * maker.kernel_s))
                    tensor = tensor.source
            thread = threading.Thread(target=engine, name="autograd")
            thread.start()
            thread.join()
    torch.Tensor = Tensor

    # torch/nn/modules/module.py's call path: the global hook dicts, and per module its own hooks and
    # compiled call; counts how often the full path (_call_impl) ran
    hooks = types.ModuleType("torch.nn.modules.module")
    hooks._global_forward_pre_hooks, hooks._global_forward_hooks = {}, {}
    hooks._global_backward_pre_hooks, hooks._global_backward_hooks = {}, {}
    hooks.call_impl_runs = 0
    hooks.tracing = None

    class Module:
        def __init__(self, *children, kernel_s=0.0, name="m", weighted=True, frozen=False):
            """weighted: a leaf that owns a weight matrix (a convolution, a linear layer), not an
            activation or a normalisation. frozen: its output requires grad only where its input does
            (its weights do not), as a fine-tuned model's backbone."""
            self._modules = {str(i): c for i, c in enumerate(children)}
            self._parameters = {"weight": types.SimpleNamespace(ndim=2)} if weighted and not children else {}
            self.kernel_s, self.name, self.frozen = kernel_s, name, frozen
            self._forward_pre_hooks, self._forward_hooks = {}, {}
            self._backward_pre_hooks, self._backward_hooks = {}, {}
            self._compiled_call_impl = None

        def register_forward_hook(self, hook):
            self._forward_hooks[len(self._forward_hooks)] = hook

        def _wrapped_call_impl(self, *args, **kwargs):
            if self._compiled_call_impl is not None:
                return self._compiled_call_impl(*args, **kwargs)
            return self._call_impl(*args, **kwargs)

        def _call_impl(self, *args, **kwargs):
            hooks.call_impl_runs += 1
            out = self.forward(*args, **kwargs)
            for hook in (*hooks._global_forward_hooks.values(), *self._forward_hooks.values()):
                result = hook(self, args, out)
                out = out if result is None else result
            return out

        def forward(self, x):
            for child in self._modules.values():
                x = child(x)
            if not self._modules:
                gpu.launch(self.name, self.kernel_s)
                if isinstance(x, Tensor):
                    return Tensor(x.requires_grad or bool(self._parameters and not self.frozen), self, x)
            return x

        __call__ = _wrapped_call_impl

    class Raising(Module):
        """A leaf whose forward raises after launching its kernel (a failing request)."""
        def forward(self, x):
            gpu.launch(self.name, self.kernel_s)
            raise RuntimeError("request failed")

    class Attention(Module):
        """A parent that launches work of its own between its children, like an attention block
        calling scaled_dot_product_attention between its projections."""
        def forward(self, x):
            children = list(self._modules.values())
            x = children[0](x)
            gpu.launch(self.name + ".sdpa", self.kernel_s)
            return children[1](x)

    nn.Module, nn.Raising, nn.Attention = Module, Raising, Attention
    nn.modules = types.SimpleNamespace(module=hooks)
    torch.nn = nn

    class Event:
        def __init__(self, enable_timing=False, blocking=False):
            self.at = None
            self.stream = None

        def record(self, stream=None):
            with gpu.lock:
                gpu.events_recorded += 1
                self.at = gpu.busy_until
                self.stream = stream if stream is not None else current_stream()
                gpu.pending_events.append(self)

        def query(self):
            return self.at is not None and time.monotonic() >= self.at

        def synchronize(self):
            while not self.query():
                time.sleep(0.0002)

    class Stream:
        streams = 0

        def __init__(self, device=None, priority=0):
            self.priority = priority
            Stream.streams += 1
            self.id = Stream.streams

        def synchronize(self):
            while time.monotonic() < gpu.busy_until:
                time.sleep(0.0002)

    default_stream = Stream()
    selected = threading.local()              # streams are per thread, as in torch

    def current_stream(device=None):
        """The thread's stream. Counted: the real call builds a new Stream object each time."""
        gpu.current_stream_calls += 1
        return selected.__dict__.get("stream", default_stream)

    gpu.current_stream_calls = 0
    cuda = types.ModuleType("torch.cuda")
    cuda.Event, cuda.Stream, cuda.current_stream = Event, Stream, current_stream
    cuda.is_initialized = lambda: gpu.initialized
    cuda.current_device = lambda: 0
    cuda.get_device_properties = lambda index: types.SimpleNamespace(uuid="GPU-fake-0", name="fake")

    @contextmanager
    def stream(s):
        before = selected.__dict__.get("stream", default_stream)
        selected.stream = s
        try:
            yield s
        finally:
            selected.stream = before
    cuda.stream = stream
    torch.cuda = cuda

    step_pre_hooks = []

    class Optimizer:
        """step(): the global step pre-hooks, then one kernel."""
        def __init__(self, kernel_s=0.0, name="step"):
            self.kernel_s, self.name = kernel_s, name

        def step(self):
            for hook in step_pre_hooks:
                hook(self, (), {})
            gpu.launch(self.name, self.kernel_s)
    optim = types.ModuleType("torch.optim")
    optim.Optimizer = Optimizer
    optim.optimizer = types.SimpleNamespace(register_optimizer_step_pre_hook=step_pre_hooks.append)
    torch.optim = optim
    # the private calls behind torch.cuda.current_stream(): (stream id, device index, device type)
    torch._C = types.SimpleNamespace(
        _get_tracing_state=lambda: hooks.tracing,
        _cuda_getDevice=lambda: 0,
        _cuda_getCurrentStream=lambda device: (selected.__dict__.get("stream", default_stream).id, device, 1))
    return torch
