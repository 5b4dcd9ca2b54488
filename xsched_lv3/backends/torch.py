"""HwQueue over a PyTorch stream (CUDA on NVIDIA, HIP on ROCm): Lv1. Commands are callables that
launch GPU work; sync points are events."""
import time

from ..levels import HwQueue, Level


class TorchHwQueue(HwQueue):
    max_level = Level.BLOCK
    why = "PyTorch streams cannot stop launched kernels: Lv1 (progressive launching)"

    def __init__(self, stream=None, device=None, priority=0):
        import torch
        self.torch = torch
        self.stream = stream or torch.cuda.Stream(device=device, priority=priority)

    def launch(self, fn):
        with self.torch.cuda.stream(self.stream):
            fn()

    def record_sync_point(self):
        event = self.torch.cuda.Event()
        event.record(self.stream)
        return event

    def sync_point_done(self, handle):
        return handle.query()

    def wait_sync_point(self, handle):
        while not handle.query():          # poll: never hold the GIL across a GPU wait
            time.sleep(10e-6)


    def synchronize(self):
        self.stream.synchronize()
