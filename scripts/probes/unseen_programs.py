#!/usr/bin/env python3
"""Ordinary PyTorch programs the benchmarks never run, under `xsched-lv3 run` with default options, next to
a higher-priority service (so each is guarded: held and windowed), against the same program run plainly.
What a user notices is checked: the same output (a checksum each program prints, rounded), the same exit
status, no traceback the program did not raise itself, and no hang (each run has a time limit). Times are
reported, not judged (a co-run is slower by design).

The programs: a captured CUDA graph replayed; two threads on their own streams; a DataLoader with forked
workers; mixed-precision training (autocast, GradScaler); a forward that raises every fifth call, caught;
work left unsynchronized at exit; the second GPU where there is one; a user stream context; forward and
backward hooks; pure tensor functions (no module); attention by F.scaled_dot_product_attention inside a
module's own forward; a child interpreter that uses the GPU too; inference_mode generation.

    python scripts/probes/unseen_programs.py --out results/diagnostics/unseen_programs_REV.json

Needs torch with a GPU (CUDA, or ROCm's HIP under the same API).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchlib import provenance, write_results  # noqa: E402

PY = sys.executable
REPO = Path(__file__).resolve().parents[2]
HEAD = """
import sys, torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
dev = torch.device("cuda")
def done(x):
    torch.cuda.synchronize()
    print("checksum", round(float(x), 3))
"""
PROGRAMS = {
    "cuda_graph": """
m = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)).to(dev).eval()
x = torch.randn(64, 256, device=dev)
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s), torch.no_grad():
    for _ in range(3):
        m(x)
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g), torch.no_grad():
    y = m(x)
total = 0.0
for _ in range(50):
    g.replay()
    total += float(y.sum())
done(total)
""",
    "threads_streams": """
import threading
m1 = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU()).to(dev).eval()
m2 = nn.Sequential(nn.Linear(512, 512), nn.GELU()).to(dev).eval()
out = {}
def work(name, m, x):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s), torch.no_grad():
        acc = 0.0
        for _ in range(40):
            acc += float(m(x).sum())
    s.synchronize()
    out[name] = acc
ts = [threading.Thread(target=work, args=("a", m1, torch.ones(8, 3, 32, 32, device=dev))),
      threading.Thread(target=work, args=("b", m2, torch.ones(32, 512, device=dev)))]
[t.start() for t in ts]; [t.join() for t in ts]
done(out["a"] + out["b"])
""",
    "dataloader_fork": """
from torch.utils.data import DataLoader, TensorDataset
class Scale(nn.Module):
    def forward(self, x):
        return x * 2
data = TensorDataset(torch.arange(512, dtype=torch.float32).reshape(128, 4))
scale = Scale()
def collate(batch):
    return scale(torch.stack([b[0] for b in batch]))
m = nn.Linear(4, 1).to(dev)
total = 0.0
with torch.no_grad():
    for xb in DataLoader(data, batch_size=16, num_workers=2, collate_fn=collate):
        total += float(m(xb.to(dev)).sum())
done(total)
""",
    "amp_training": """
m = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10)).to(dev)
opt = torch.optim.SGD(m.parameters(), lr=0.01)
scaler = torch.cuda.amp.GradScaler()
x, y = torch.randn(64, 128, device=dev), torch.randint(0, 10, (64,), device=dev)
for _ in range(30):
    opt.zero_grad()
    with torch.autocast("cuda", dtype=torch.float16):
        loss = F.cross_entropy(m(x), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
done(loss.item() * 0)  # fp16 rounding differs run to run: the checksum is that it finished
""",
    "raising_forward": """
class Flaky(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.calls = nn.Linear(32, 32), 0
    def forward(self, x):
        self.calls += 1
        if self.calls % 5 == 0:
            raise ValueError("every fifth call fails")
        return self.lin(x)
m = Flaky().to(dev)
x = torch.ones(4, 32, device=dev)
ok = failed = 0
with torch.no_grad():
    for _ in range(40):
        try:
            m(x); ok += 1
        except ValueError:
            failed += 1
print("ok", ok, "failed", failed)
done(ok * 100 + failed)
""",
    "unsynchronized_exit": """
m = nn.Linear(1024, 1024).to(dev)
x = torch.randn(256, 1024, device=dev)
with torch.no_grad():
    for _ in range(300):
        x = torch.tanh(m(x))
print("checksum", 0)   # leaves without waiting for the GPU
""",
    "second_gpu": """
n = torch.cuda.device_count()
d = torch.device("cuda", n - 1)
torch.cuda.set_device(d)
m = nn.Linear(64, 64).to(d)
with torch.no_grad():
    y = m(torch.ones(8, 64, device=d))
done(y.sum())
""",
    "user_stream": """
m = nn.Sequential(nn.Linear(64, 64), nn.ReLU()).to(dev).eval()
s = torch.cuda.Stream()
acc = torch.zeros((), device=dev)
with torch.cuda.stream(s), torch.no_grad():
    for _ in range(100):
        acc += m(torch.ones(16, 64, device=dev)).sum()
torch.cuda.current_stream().wait_stream(s)
done(acc)
""",
    "hooks": """
m = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1)).to(dev)
seen = {"fwd": 0, "bwd": 0}
for layer in m:
    layer.register_forward_hook(lambda mod, i, o: seen.__setitem__("fwd", seen["fwd"] + 1))
    layer.register_full_backward_hook(lambda mod, gi, go: seen.__setitem__("bwd", seen["bwd"] + 1))
for _ in range(10):
    m(torch.ones(4, 16, device=dev)).sum().backward()
print("hooks", seen)
done(seen["fwd"] * 1000 + seen["bwd"])
""",
    "functions_only": """
x = torch.ones(512, 512, device=dev)
for _ in range(50):
    x = torch.relu(x @ x.T / 512.0)
done(x.sum())
""",
    "attention_in_forward": """
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.out = nn.Linear(64, 192), nn.Linear(64, 64)
    def forward(self, x):
        q, k, v = self.qkv(x).view(x.shape[0], x.shape[1], 3, 4, 16).unbind(2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.out(y.transpose(1, 2).reshape(x.shape))
m = nn.Sequential(Block(), Block()).to(dev).eval()
x = torch.ones(8, 32, 64, device=dev) / 10
with torch.no_grad():
    for _ in range(20):
        y = m(x)
done(y.sum())
""",
    "child_process": """
import subprocess
child = "import torch; x = torch.ones(100, device='cuda'); print(float(x.sum()))"
r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
print("child", r.returncode, r.stdout.strip())
done(float(r.stdout.strip() or -1))
""",
    "inference_mode": """
m = nn.GRU(32, 32, batch_first=True).to(dev).eval()
h = None
x = torch.ones(1, 1, 32, device=dev)
with torch.inference_mode():
    for _ in range(64):
        x, h = m(x, h)
done(x.sum())
""",
}
SERVICE = [PY, str(REPO / "scripts" / "workloads" / "serve.py"), "--model", "resnet18", "--batch", "4",
           "--rate", "20", "--seconds", "600"]
LIMIT_S = 180


def run(path, scheduled, env):
    argv = [PY, str(path)]
    if scheduled:
        argv = [PY, "-m", "xsched_lv3", "run", "--"] + argv
    t = time.monotonic()
    try:
        r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=LIMIT_S, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "seconds": LIMIT_S}
    checksum = next((line.split()[1] for line in r.stdout.splitlines() if line.startswith("checksum ")), None)
    return {"status": r.returncode, "checksum": checksum, "seconds": round(time.monotonic() - t, 2),
            "traceback": "Traceback" in r.stderr, "stderr_tail": r.stderr[-600:]}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", choices=list(PROGRAMS), help="these programs (default: all)")
    p.add_argument("--out")
    args = p.parse_args()
    doc = {**provenance(), "programs": {}}
    with tempfile.TemporaryDirectory(prefix="xsched-unseen-") as tmp:
        env = dict(os.environ, XSCHED_LV3_BOARD=f"{tmp}/board", XSCHED_LV3_SOCKET=f"{tmp}/daemon.sock",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        service = subprocess.Popen([PY, "-m", "xsched_lv3", "run", "--priority", "10", "--"] + SERVICE, env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
        try:
            time.sleep(15)                              # its model loaded and its requests running
            for name in args.only or PROGRAMS:
                path = Path(tmp) / f"{name}.py"
                path.write_text(HEAD + PROGRAMS[name])
                plain, scheduled = run(path, False, env), run(path, True, env)
                same = all(plain.get(k) == scheduled.get(k) for k in ("status", "checksum", "traceback"))
                doc["programs"][name] = {"plain": plain, "scheduled": scheduled, "same": same}
                print(json.dumps({"program": name, "same": same,
                                  "plain": {k: plain.get(k) for k in ("status", "checksum", "seconds")},
                                  "scheduled": {k: scheduled.get(k) for k in ("status", "checksum", "seconds")}}),
                      flush=True)
        finally:
            service.terminate()
            service.wait(timeout=30)
        doc["service_still_ran"] = service.returncode in (0, -15)
    doc["all_same"] = all(p["same"] for p in doc["programs"].values())
    if args.out:
        write_results(args.out, doc)
    print("all the same" if doc["all_same"] else "DIFFERENCES: " +
          ", ".join(n for n, p in doc["programs"].items() if not p["same"]))
    return 0 if doc["all_same"] else 1


if __name__ == "__main__":
    sys.exit(main())
