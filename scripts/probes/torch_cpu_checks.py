#!/usr/bin/env python3
"""What the PyTorch integration does with real torch, checked on the CPU (no GPU needed): a guarded
low-priority client (an idle priority-10 client on the same board) whose recorder is a stand-in,
since CUDA events need a GPU. Prints and writes one JSON document:

  hook_registration_us   CPU time to register a Tensor hook and a node pre-hook (alternated)
  training               a small CNN trained 3 iterations under the wrapper and without it:
                         gradients equal?, backward hooks fired per iteration
  compile                torch.compile'd model, per call: leaves counted by the gate, and dynamo's
                         graphs and graph breaks; with dynamo imported before install(), with and
                         without install() updating dynamo's record of nn.Module.__call__
  cpu_job                a lower client with the real recorder on a torch without CUDA, next to a
                         higher client in a request: trains without error (its first sync point used
                         to raise) and without being held (it used to wait for the higher client)
  forked_worker          a DataLoader worker (fork) whose transform is a module, under a tracking
                         service's gate: the service's slot stays idle

    pip install torch==2.13.0       # a CPU build
    python scripts/probes/torch_cpu_checks.py --out results/diagnostics/torch_cpu_checks_REV.json

Each part runs in a fresh interpreter (install() is once per process, and dynamo's import order is
what one part varies).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

PRELUDE = r'''
import os, sys, json, statistics, tempfile, threading, time
sys.path.insert(0, REPO)
os.environ["XSCHED_LV3_BOARD"] = os.path.join(tempfile.mkdtemp(), "board")
if DYNAMO_FIRST:
    import torch._dynamo
import torch, torch.nn as nn
import xsched_lv3.pytorch as xt
from xsched_lv3.gate import Gate


class StandInRecorder(xt.TorchRecorder):
    """Sync points that are always complete: the CPU has no CUDA events."""
    def __init__(self):
        self._reusable = []
    def record(self):
        return object()
    def done(self, event):
        return True
    def wait(self, event):
        pass
    def device_key(self):
        return 1


def small_cnn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(inplace=True), nn.Identity(),
                         nn.Flatten(), nn.Linear(8 * 14 * 14, 10))


def guarded_lp(no_dynamo_update=False):
    if no_dynamo_update:
        xt._update_dynamos_record = lambda call: None
    xt.install()
    lp = xt._process_gate = Gate(StandInRecorder(), priority=0)
    hp = Gate(StandInRecorder(), priority=10)       # idle: the LP may run, guarded
    return lp, hp
'''

PARTS = {
    "hook_registration_us": r'''
x = torch.randn(4, 4, requires_grad=True)
def tensor_hook(grad):
    return None
def node_prehook(grad_outputs):
    return None
def per_call_us(register, n=5000):
    outs = [x * 2 for _ in range(n)]
    t = time.perf_counter()
    for o in outs:
        register(o)
    return (time.perf_counter() - t) / n * 1e6
rounds = {"Tensor.register_hook": [], "grad_fn.register_prehook": []}
for _ in range(11):
    rounds["Tensor.register_hook"].append(per_call_us(lambda o: o.register_hook(tensor_hook)))
    rounds["grad_fn.register_prehook"].append(per_call_us(lambda o: o.grad_fn.register_prehook(node_prehook)))
print(json.dumps({k: {"median": statistics.median(v), "min": min(v), "max": max(v)} for k, v in rounds.items()}))
''',
    "training": r'''
def train(wrapped, iterations=3):
    net = small_cnn()
    data = torch.randn(4, 3, 16, 16)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    fired, grads = [], []
    if wrapped:
        lp, hp = guarded_lp()
        before = lp.before_backward
        count = {"n": 0, "commands": 0}
        def counting(commands, grad_outputs):
            count["n"] += 1
            count["commands"] += commands
            return before(commands, grad_outputs)
        lp.before_backward = counting
    for _ in range(iterations):
        optimizer.zero_grad()
        net(data).square().mean().backward()
        grads.append([p.grad.clone() for p in net.parameters()])
        optimizer.step()
        if wrapped:
            fired.append((count["n"], count["commands"]))
            count["n"] = count["commands"] = 0
    return grads, fired, [p.detach().clone() for p in net.parameters()], (lp.guarded if wrapped else None)
plain_grads, _, plain_params, _ = train(False)
grads, fired, params, guarded = train(True)
same = all(torch.equal(a, b) for ga, gb in zip(plain_grads, grads) for a, b in zip(ga, gb))
print(json.dumps({"guarded": guarded, "gradients_equal_to_unwrapped": same,
                  "parameters_equal_to_unwrapped": all(torch.equal(a, b) for a, b in zip(plain_params, params)),
                  "backward_hooks_fired_and_commands_per_iteration": fired,
                  "leaves": 6, "note": "hooked: the Conv2d and the Linear (weighted), and the ReLU's node "
                  "once three leaves went by without a hook (found through the Identity, which returns "
                  "its input); each counts 2 commands a leaf since the previous hook: 12 an iteration"}))
''',
    "compile": r'''
lp, hp = guarded_lp(no_dynamo_update=NO_UPDATE)
counted = {"n": 0}
after = lp.after_leaf
def counting(*args):
    counted["n"] += 1
    return after(*args)
lp.after_leaf = counting
net = small_cnn().eval()
data = torch.randn(4, 3, 16, 16)
compiled = torch.compile(net, backend=BACKEND)
with torch.no_grad():
    compiled(data)                      # compiles
    counted["n"] = 0
    for _ in range(3):
        compiled(data)
    per_call = counted["n"] / 3
    explained = torch._dynamo.explain(net)(data)
print(json.dumps({"backend": BACKEND, "guarded": lp.guarded, "leaves_counted_per_call": per_call,
                  "graphs": explained.graph_count, "graph_breaks": explained.graph_break_count}))
''',
    "cpu_job": r'''
xt.install()
lp = xt._process_gate = Gate(xt.TorchRecorder(), priority=0)
hp = Gate(StandInRecorder(), priority=10)
hp.board.set_active(hp.slot, True)             # the higher client is in a request throughout
threading.Timer(5.0, hp.board.set_active, (hp.slot, False)).start()   # if the job is held, not for good
net, data = small_cnn(), torch.randn(4, 3, 16, 16)
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
error = None
t0 = time.monotonic()
try:
    for _ in range(3):
        optimizer.zero_grad()
        net(data).square().mean().backward()
        optimizer.step()
except Exception as e:
    error = f"{type(e).__name__}: {e}"
print(json.dumps({"cuda_built": torch.backends.cuda.is_built(), "guarded": lp.guarded,
                  "window": lp.window is not None, "error": error, "held_times": lp.waits,
                  "seconds": round(time.monotonic() - t0, 3)}))
''',
    "forked_worker": r'''
xt.install()
service = xt._process_gate = Gate(StandInRecorder(), priority=10)
batch_job = Gate(StandInRecorder(), priority=0)
nn.Linear(2, 2)(torch.randn(1, 2))             # a request: the service tracks, its GPU "in use"
class Crop(nn.Module):
    def forward(self, x):
        return x[..., :4]
class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 16
    def __getitem__(self, i):
        x = Crop()(torch.randn(8))
        return x, int(service.board.read_slot(service.slot)[2])
loader = torch.utils.data.DataLoader(Data(), batch_size=4, num_workers=2, multiprocessing_context="fork")
marked = [int(m) for _x, ms in loader for m in ms]
print(json.dumps({"service_tracking": service.tracking, "samples": len(marked),
                  "service_slot_active_in_workers": sum(marked)}))
''',
}


def run_part(part, **settings):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    code = PRELUDE + PARTS[part]
    consts = {"REPO": str(REPO), "DYNAMO_FIRST": False, "NO_UPDATE": False, "BACKEND": "eager", **settings}
    header = "".join(f"{k} = {v!r}\n" for k, v in consts.items())
    done = subprocess.run([sys.executable, "-c", header + code], capture_output=True, text=True, env=env,
                          timeout=600, cwd=tempfile.gettempdir())
    if done.returncode != 0:
        raise SystemExit(f"torch_cpu_checks: part {part} {settings} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--out")
    args = p.parse_args()
    try:
        import torch
    except ImportError:
        p.error("needs torch (a CPU build will do: pip install torch==2.13.0)")
    from benchlib import provenance, write_results
    doc = {"benchmark": "PyTorch integration on the CPU", **provenance(), "torch": torch.__version__,
           "hook_registration_us": run_part("hook_registration_us"),
           "training": run_part("training"),
           "compile": [dict(run_part("compile", BACKEND=backend, DYNAMO_FIRST=first, NO_UPDATE=no_update),
                            dynamo_imported_first=first, record_updated=not no_update)
                       for backend in ("eager", "inductor")
                       for first, no_update in ((False, False), (True, False), (True, True))],
           "cpu_job": run_part("cpu_job"),
           "forked_worker": run_part("forked_worker")}
    print(json.dumps(doc, indent=1))
    if args.out:
        write_results(args.out, doc)


if __name__ == "__main__":
    main()
