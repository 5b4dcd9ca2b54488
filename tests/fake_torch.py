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

    def launch(self, name, seconds):
        with self.lock:
            now = time.monotonic()
            start = max(now, self.busy_until)
            self.busy_until = start + seconds
            self.launched.append((name, start, self.busy_until))
            self.queued_for[len(self.launched) - 1] = start - now      # GPU work ahead of it
            return self.busy_until


def make(gpu):
    torch = types.ModuleType("torch")
    nn = types.ModuleType("torch.nn")

    class Module:
        def __init__(self, *children, kernel_s=0.0, name="m"):
            self._modules = {str(i): c for i, c in enumerate(children)}
            self.kernel_s, self.name = kernel_s, name

        def forward(self, x):
            for child in self._modules.values():
                x = child(x)
            if not self._modules:
                gpu.launch(self.name, self.kernel_s)
            return x

        def __call__(self, *args, **kwargs):
            return self.forward(*args, **kwargs)

    nn.Module = Module
    torch.nn = nn

    class Event:
        def __init__(self, enable_timing=False, blocking=False):
            self.at = None

        def record(self, stream=None):
            with gpu.lock:
                self.at = gpu.busy_until

        def query(self):
            return self.at is not None and time.monotonic() >= self.at

        def synchronize(self):
            while not self.query():
                time.sleep(0.0002)

    class Stream:
        def __init__(self, device=None, priority=0):
            self.priority = priority

        def synchronize(self):
            while time.monotonic() < gpu.busy_until:
                time.sleep(0.0002)

    cuda = types.ModuleType("torch.cuda")
    cuda.Event, cuda.Stream = Event, Stream

    @contextmanager
    def stream(s):
        yield s
    cuda.stream = stream
    torch.cuda = cuda
    return torch
