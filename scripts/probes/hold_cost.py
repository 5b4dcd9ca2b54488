#!/usr/bin/env python3
"""What one hold costs a scheduled batch job, without any GPU work from the holder: a child process
registers above the job on the same GPU and marks itself active for HOLD_MS every PERIOD_MS in every
other segment (no kernels: only the board changes). The job's iteration rate in hold segments
against idle segments gives the loss, and the loss beyond the held time, per hold.

    python scripts/probes/hold_cost.py --model resnet50 --batch 64 [--window-us 0]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "scripts" / "workloads")]

HOLDER = """
import os, sys, time
sys.path.insert(0, {repo!r})
from xsched_lv3.board import Board
board = Board({board!r})
slot = board.allocate(os.getpid(), 10, 0, {device})   # another process, as an HP is
t0, seg, segments, hold, period = {t0}, {seg}, {segments}, {hold}, {period}
held = 0
for k in range(segments):
    end = t0 + (k + 1) * seg
    if k % 2 == 0:
        time.sleep(max(0.0, end - time.monotonic()))
        continue
    nxt = t0 + k * seg
    while nxt + hold < end:
        time.sleep(max(0.0, nxt - time.monotonic()))
        board.set_active(slot, True)
        time.sleep(hold)
        board.set_active(slot, False)
        held += 1
        nxt += period
    time.sleep(max(0.0, end - time.monotonic()))
board.release(slot)
print(held)
"""


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--window-us", type=float, default=None)
    p.add_argument("--hold-ms", type=float, default=3.0)
    p.add_argument("--period-ms", type=float, default=50.0)
    p.add_argument("--segment-s", type=float, default=2.0)
    p.add_argument("--rounds", type=int, default=4)
    args = p.parse_args()
    board_path = str(Path(tempfile.mkdtemp()) / "board")
    os.environ["XSCHED_LV3_BOARD"] = board_path
    import torch
    import xsched_lv3.pytorch as xt
    from models import build
    from xsched_lv3.gate import PROCESS_SPIN_S, Gate
    model, x = build(args.model, args.batch)
    with torch.no_grad():
        for _ in range(5):
            model(x)
    torch.cuda.synchronize()
    xt.install()
    gate = Gate(xt.TorchRecorder(), 0, window_us=xt.DEFAULT_WINDOW_US if args.window_us is None else args.window_us
                or None, spin_s=PROCESS_SPIN_S)
    xt._process_gate = gate
    segments = 2 * args.rounds
    t0 = time.monotonic() + 1.0
    holder = subprocess.Popen([sys.executable, "-c", HOLDER.format(
        repo=str(REPO), board=board_path, device=gate.recorder.device_key(), t0=t0,
        seg=args.segment_s, segments=segments, hold=args.hold_ms / 1e3, period=args.period_ms / 1e3)],
        stdout=subprocess.PIPE, text=True)
    stamps = []
    stream = torch.cuda.current_stream()
    with torch.no_grad():
        while time.monotonic() < t0 + segments * args.segment_s:
            model(x)
            stream.synchronize()
            stamps.append(time.monotonic())
    holds = int(holder.communicate()[0].strip() or 0)
    rates = {0: [], 1: []}
    for k in range(segments):
        a, b = t0 + k * args.segment_s + 0.2, t0 + (k + 1) * args.segment_s
        n = sum(1 for s in stamps if a <= s < b)
        rates[k % 2].append(n / (b - a))
    idle, held = statistics.median(rates[0]), statistics.median(rates[1])
    held_fraction = args.hold_ms / args.period_ms
    loss = 1 - held / idle
    extra_ms = (loss - held_fraction) * args.period_ms
    print(json.dumps({"model": args.model, "batch": args.batch, "window_us": gate.window_us,
                      "idle_it_s": rates[0], "holds_it_s": rates[1], "holds": holds, "waits": gate.waits,
                      "held_s": round(gate.held_s, 3), "blocked_syncs": gate.blocked_syncs,
                      "sync_points": gate.sync_points, "per_sync": gate.launches.per_sync if gate.launches is not None else None,
                      "cmd_us": round(gate.window.cmd_us, 1) if gate.window is not None else None, "loss": round(loss, 4), "held_fraction": held_fraction,
                      "extra_ms_per_hold": round(extra_ms, 2)}))
    gate.close()


if __name__ == "__main__":
    main()
