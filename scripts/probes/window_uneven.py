#!/usr/bin/env python3
"""Fake-GPU probe (no GPU, no torch): what the progressive window costs a batch job shaped like GPT-2
small at b16 (docs/measurements.md, *A family the tables above do not cover*): twelve blocks of matrix products of
150-500 us and elementwise kernels of 20-60 us, an attention block's own work between its children, a
3 ms output projection, and Python time per module call (`--cpu-us`: Hugging Face modules cost more
than torchvision's). The job runs guarded by an idle higher client (tests/fake_torch.py's GPU and
events; waits spin, as the real recorder's do), first unwindowed, then with the window; both
synchronize after each forward pass, as scripts/workloads/batch.py does. Times are this probe's
guesses for an H200, not measurements.

    python scripts/probes/window_uneven.py --cpu-us 60 --window-us 500 1000 2000
"""
import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "scripts")]
US = 1e-6


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu-us", type=float, default=60.0, help="Python time per module call (default 60)")
    p.add_argument("--window-us", type=float, nargs="+", default=[500.0], help="windows to try (default 500)")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--out")
    args = p.parse_args()
    if args.cpu_us < 0 or args.seconds <= 0 or any(w <= 0 for w in args.window_us):
        p.error("--cpu-us must be >= 0, --seconds and --window-us > 0")
    import fake_torch
    gpu = fake_torch.FakeGPU()
    torch = fake_torch.make(gpu)
    sys.modules["torch"] = torch
    os.environ["XSCHED_LV3_BOARD"] = str(Path(tempfile.mkdtemp()) / "board")

    def spin(event):
        while not event.query():
            pass
    torch.cuda.Event.synchronize = spin              # the gate's waits

    def drain():                                     # the job's synchronize after each forward pass
        while time.monotonic() < gpu.busy_until:
            pass
    import xsched_lv3.pytorch as xt
    from xsched_lv3.gate import Gate
    cpu_s = args.cpu_us * US

    def busy(seconds):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    class Leaf(torch.nn.Module):
        def forward(self, x):
            busy(cpu_s)
            gpu.launch(self.name, self.kernel_s)
            return x

    class Attention(torch.nn.Module):
        def forward(self, x):
            qkv, proj = self._modules.values()
            x = qkv(x)
            busy(cpu_s)
            gpu.launch(self.name, 300 * US)          # scaled_dot_product_attention, inside the block
            return proj(x)

    def block(i):
        return torch.nn.Module(
            Leaf(kernel_s=30 * US, name=f"ln1.{i}"),
            Attention(Leaf(kernel_s=400 * US, name=f"qkv.{i}"), Leaf(kernel_s=150 * US, name=f"proj.{i}"), name=f"attn.{i}"),
            Leaf(kernel_s=20 * US, name=f"drop1.{i}"), Leaf(kernel_s=30 * US, name=f"ln2.{i}"),
            Leaf(kernel_s=500 * US, name=f"fc.{i}"), Leaf(kernel_s=60 * US, name=f"gelu.{i}"),
            Leaf(kernel_s=500 * US, name=f"proj2.{i}"), Leaf(kernel_s=20 * US, name=f"drop2.{i}"), name=f"block{i}")
    model = torch.nn.Module(Leaf(kernel_s=10 * US, name="embed"), *[block(i) for i in range(12)],
                            Leaf(kernel_s=10 * US, name="ln_f"), Leaf(kernel_s=3000 * US, name="lm_head"), name="gpt2")

    def run(window_us):
        hp = Gate(xt.TorchRecorder(), priority=10, window_us=None)      # registered, idle
        n = 0
        with xt.client(priority=0, window_us=window_us) as gate:
            for _ in range(3):
                model(None)
                drain()
            t0 = time.monotonic()
            while time.monotonic() - t0 < args.seconds:
                model(None)
                drain()
                n += 1
            rate = n / (time.monotonic() - t0)
            stats = gate.stats()
        hp.close()
        return rate, stats, n

    xt.install()
    base, _, _ = run(0)
    rows = []
    for window in args.window_us:
        rate, stats, n = run(window)
        rows.append({"window_us": window, "it_s": round(rate, 1), "vs_unwindowed": round(rate / base, 3),
                     "sync_points_per_iteration": round(stats["sync_points"] / max(n, 1), 1),
                     "waits_per_iteration": round(stats["blocked_syncs"] / max(n, 1), 1),
                     "learned_cmd_us": stats["window_cmd_us"] and round(stats["window_cmd_us"], 1)})
    doc = {"probe": "window cost on a fake GPU, GPT-2-shaped job", "cpu_us": args.cpu_us,
           "unwindowed_it_s": round(base, 1), "rows": rows}
    print(json.dumps(doc, indent=1))
    if args.out:
        from benchlib import provenance, write_results
        write_results(args.out, {**provenance(), **doc})


if __name__ == "__main__":
    main()
