#!/usr/bin/env python3
"""Where a batch job's time goes, from a py-spy profile of it (`py-spy record --idle --threads -f raw`).

Samples of the main thread inside the job's loop (`iterations_per_second`, scripts/benchlib.py) are
counted once each, by the first category whose frame is in the stack; samples of every other thread
(autograd's, where a training job's backward hooks run) by whether the gate holds it, waits in its
window, or runs the hook itself.

    python scripts/pyspy_summary.py results/diagnostics/pyspy_lp_train_xsched_h200_668daa4.txt.gz
"""
import argparse
import collections
import gzip
import re

# the window's frames: WindowedLaunches since f616dbc, the gate's own methods in profiles made before
WINDOW_FRAMES = ("WindowedLaunches.", "Gate._sync_point", "Gate._look_back", "ProgressiveWindow")
MAIN_CATEGORIES = (
    ("held (Gate._wait_turn)", ("Gate._wait_turn",)),
    ("window: sync points and their waits", WINDOW_FRAMES),
    ("other gate frames (checks, backward hooks' registration, requests)",
     ("Gate.", "_hook_backward", "_watch_for_backward", "before_optimizer_step")),
    ("backward (waits for autograd's thread)", ("backward (torch/_tensor.py",)),
    ("optimizer step", ("Optimizer.", "SGD.", "sgd (", "_multi_tensor_sgd", "_single_tensor_sgd")),
    ("end-of-iteration synchronize (the CPU ahead of the GPU)", ("synchronize",)),
    ("forward: model ops and module calls", ("forward (",)),
)
THREAD = re.compile(r"thread \((\d+)\)")


def read_samples(path):
    """(thread id, stack, count) for each line of a py-spy raw file; a profile recorded without
    `--threads` names no thread: its samples count as one thread's."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if stack and count.isdigit():
                match = THREAD.match(stack)
                yield (match.group(1) if match else None), stack, int(count)


def summarise(path):
    samples = list(read_samples(path))
    if not samples:
        raise ValueError("no py-spy raw samples in it (py-spy record --idle --threads -f raw)")
    per_thread = collections.Counter()
    for tid, _, n in samples:
        per_thread[tid] += n
    main_tid = per_thread.most_common(1)[0][0]
    main, others = collections.Counter(), collections.Counter()
    for tid, stack, n in samples:
        if tid == main_tid:
            if "iterations_per_second" in stack:
                name = next((name for name, frames in MAIN_CATEGORIES if any(f in stack for f in frames)), "other (loop)")
                main[name] += n
        elif "Gate.before_backward" in stack:
            held = "Gate._wait_turn" in stack
            others["held" if held else "window" if any(f in stack for f in WINDOW_FRAMES) else "hook"] += n
        else:
            others["no Python frame (C++ work, or idle)"] += n
    return main, others


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("profiles", nargs="+", help="py-spy raw files (.txt or .txt.gz)")
    args = p.parse_args()
    for path in args.profiles:
        try:
            main_thread, others = summarise(path)
        except (OSError, ValueError, IndexError) as e:
            raise SystemExit(f"pyspy_summary: {path}: {e}")
        loop = sum(main_thread.values())
        print(f"{path}: main thread, {loop} samples in the loop")
        for name, n in main_thread.most_common():
            print(f"  {name:70s} {n:6d} {100 * n / max(loop, 1):5.1f} %")
        print("  other threads, as a share of the main thread's loop samples")
        for name, n in others.most_common():
            print(f"  {name:70s} {n:6d} {100 * n / max(loop, 1):5.1f} %")


if __name__ == "__main__":
    main()
