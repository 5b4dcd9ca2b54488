"""kfdtool preempt / resume: suspend a process's GPU queues (waves saved to the CWSR area) and
resume them, never leaving them stuck."""
import argparse
import re
import signal
import sys
import threading
import time

from .argtypes import grace_period, positive_int, queue_id
from .render import console, human_bytes, import_rich, print_json, table
from .commands import help_for

PREEMPT_HELP = help_for("preempt")
PREEMPT_EXAMPLES = """examples:
  kfdtool preempt --pid 1234 --for 500ms        # suspend every queue for half a second
  kfdtool preempt --pid 1234 --queue 0 --queue 2 --grace 100
  kfdtool preempt --pid 1234                    # hold until Ctrl-C (or SIGTERM), then resume
  kfdtool preempt --pid 1234 --gpu 24248 --for 2s --json
  kfdtool --sim mi308x preempt --pid 4242 --for 1s

requirements: KFD ABI >= 1.13 with HWS or MES (sched_policy != 2), a gfx9+ GPU, a target that
enabled its runtime (every ROCr/HIP process does) and is not under another debugger (rocgdb),
and the right to ptrace it (same user with kernel.yama.ptrace_scope=0, or root/CAP_SYS_PTRACE).
The kernel resumes the queues if kfdtool dies, even by kill -9.
"""
RESUME_HELP = help_for("resume")
RESUME_EXAMPLES = """examples:
  kfdtool resume --pid 1234 --all               # resume every queue, whoever suspended it
  kfdtool resume --pid 1234 --queue 0
"""
_UNITS = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "m": 60.0}
MECHANISMS = ("debug-trap",)
# Opt-in ioctls of patched kernels (kfdtool.cwsr.patched): their argument carries no pid, so they act
# on the caller's own queues only, and `preempt` always targets another process.
IN_PROCESS_ONLY = ("patched-preempt-queue", "patched-gpreempt")


# Longer than any hold an admin means, and short enough for time.sleep (an OverflowError after the
# queues were suspended would be the wrong moment to find out).
MAX_DURATION_S = 24 * 3600.0


def parse_duration(text):
    """Checked while parsing the command line, before anything is suspended."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|us|s|m|)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 500ms, 2s, 1.5)")
    seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"the duration must be above zero, got {text!r}")
    if seconds > MAX_DURATION_S:
        raise argparse.ArgumentTypeError(f"{text!r} is longer than {MAX_DURATION_S / 3600:g} hours; "
                                         f"leave out --for and resume with `kfdtool resume`")
    return seconds


def preempt_mechanism(text):
    """--mechanism: refused at parse time, before anything is opened or suspended."""
    if text in MECHANISMS:
        return text
    if text in IN_PROCESS_ONLY:
        raise argparse.ArgumentTypeError(
            f"{text} is not offered by `kfdtool preempt`: the patched 0x87/0x88 ioctls (in no upstream kernel) "
            f"act only on the calling process's own queues; use debug-trap")
    raise argparse.ArgumentTypeError(f"unknown mechanism {text!r} (choose from {', '.join(MECHANISMS)})")


def add_parser(sub):
    p = sub.add_parser("preempt", help=PREEMPT_HELP, description=PREEMPT_HELP, epilog=PREEMPT_EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pid", type=positive_int, required=True, help="target process")
    p.add_argument("--queue", type=queue_id, action="append", help="queue id (repeatable; default: all)")
    p.add_argument("--gpu", type=positive_int, action="append", help="only queues on this gpu_id (repeatable)")
    p.add_argument("--grace", type=grace_period, default=None, help="grace period, 1K GPU clocks (0-255, HWS only)")
    p.add_argument("--for", dest="duration", type=parse_duration, help="resume after DURATION (e.g. 500ms)")
    p.add_argument("--mechanism", type=preempt_mechanism, default="debug-trap", metavar="{debug-trap}",
                   help="how to preempt (the patched-kernel ioctls serve only in-process callers, not this command)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run_preempt)
    r = sub.add_parser("resume", help=RESUME_HELP, description=RESUME_HELP, epilog=RESUME_EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("--pid", type=positive_int, required=True)
    what = r.add_mutually_exclusive_group(required=True)
    what.add_argument("--all", action="store_true", help="every queue of the process")
    what.add_argument("--queue", type=queue_id, action="append", help="queue id (repeatable)")
    r.add_argument("--json", action="store_true")
    r.set_defaults(run=run_resume)


_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _Stop(Exception):
    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _on_signal(signum, frame):
    raise _Stop(signum)


def _select(entries, args):
    chosen = [e for e in entries if (not args.gpu or e.gpu_id in args.gpu)]
    ids = {e.queue_id for e in chosen}
    if args.queue:
        missing = sorted(set(args.queue) - {e.queue_id for e in entries})
        if missing:
            raise ValueError(f"pid {args.pid} has no queue {missing[0]}")
        return [q for q in dict.fromkeys(args.queue) if q in ids]       # each queue once
    return sorted(ids)


def run_preempt(args, ctx):
    from ..cwsr.debugtrap import DebugTrapSuspend
    from ..cwsr.holds import Hold, ensure_run_dir
    ctx.require_kfd_process(args.pid)
    ensure_run_dir()                        # where the hold is recorded: refuse now, not after suspending
    ctx.import_device_modules()             # no import once signals raise (import_device_modules says why)
    if not args.json:
        import_rich()
    # From here to the last line a signal means "resume and exit 128+N": while opening the device
    # and working it raises _Stop; during the cleanup it is noted and the cleanup finishes first.
    stopped = []
    old = {sig: signal.signal(sig, _on_signal) for sig in _SIGNALS}
    kfd = mech = None
    report = {"pid": args.pid, "mechanism": args.mechanism, "grace_period": args.grace}
    try:
        kfd = ctx.open_device()
        mech = DebugTrapSuspend(kfd, args.pid)
        qids = _select(mech.queues(), args)
        if not qids:
            raise ValueError(f"pid {args.pid} has no queues to preempt" + (" on those GPUs" if args.gpu else ""))
        t0 = time.perf_counter()
        suspended = mech.suspend(qids, args.grace)
        report["suspend_s"] = time.perf_counter() - t0
        report["suspend"] = [o.to_dict() for o in suspended.outcomes]
        report["notes"] = list(suspended.notes)
        with Hold(args.pid, mech.suspended(), mech.name):
            if not args.json:
                _print_outcomes(f"suspended pid {args.pid} in {report['suspend_s'] * 1e3:.2f} ms",
                                suspended.outcomes, suspended.notes)
            _hold(args, mech)
            t0 = time.perf_counter()
            resumed = mech.resume()
            report["resume_s"] = time.perf_counter() - t0
            report["resume"] = [o.to_dict() for o in resumed.outcomes]
            report["notes"] += resumed.notes
            report["held_s"] = args.duration
        if args.json:
            print_json(report)
        else:
            console().print(f"resumed {sum(o.ok for o in resumed.outcomes)} queues in "
                            f"{report['resume_s'] * 1e3:.2f} ms")
    except _Stop as stop:
        print(f"kfdtool: {stop}: {'resuming' if mech is not None else 'stopping'}", file=sys.stderr)
        stopped.append(stop.signum)
    finally:
        for sig in _SIGNALS:
            signal.signal(sig, lambda signum, frame: stopped.append(signum))
        try:
            if mech is not None:
                mech.close()            # resumes anything still held, then DISABLE
        finally:
            if kfd is not None:
                kfd.close()
            for sig, handler in old.items():
                signal.signal(sig, handler)
    if stopped:
        return 128 + stopped[0]
    return 0 if all(o["outcome"] in ("suspended", "already") for o in report["suspend"]) else 1


def _hold(args, mech):
    if args.duration is not None:
        time.sleep(args.duration)
        return
    if not args.json:
        console().print("holding; Ctrl-C or SIGTERM resumes")
    threading.Event().wait()         # until a signal raises _Stop


def _print_outcomes(title, outcomes, notes=()):
    rows = [(o.qid, o.gpu_id, o.outcome, o.ctl_stack_bytes, human_bytes(o.save_area_bytes), o.detail)
            for o in outcomes]
    out = console()
    out.print(table(title, [">QID", ">GPU_ID", "OUTCOME", "->CTL STACK B", "->SAVED WAVES", "~DETAIL"], rows))
    for note in notes:
        out.print(f"note: {note}")


def run_resume(args, ctx):
    from ..cwsr.debugtrap import recover
    from ..cwsr.holds import forget
    ctx.require_kfd_process(args.pid)
    kfd = ctx.open_device()
    try:
        t0 = time.perf_counter()
        count, outcomes, own = recover(kfd, args.pid, None if args.all else args.queue)
        elapsed = time.perf_counter() - t0
    finally:
        kfd.close()
    forget(args.pid, None if args.all else [o.qid for o in outcomes if o.ok])
    report = {"pid": args.pid, "resumed": count, "resume_s": elapsed,
              "queues": [o.to_dict() for o in outcomes] if outcomes else None,
              "other_debugger_kept": not own}
    if args.json:
        print_json(report)
    elif outcomes:
        _print_outcomes(f"resumed pid {args.pid} in {elapsed * 1e3:.2f} ms", outcomes)
    else:
        # RESUME_QUEUES counts every queue it was given, suspended or not (resume_single_queue
        # answers 0 for a running one): so this says they all run, not that they were stopped
        print(f"all {count} queues of pid {args.pid} run (RESUME_QUEUES took {elapsed * 1e3:.2f} ms)")
    failed = [o for o in outcomes or () if not o.ok]
    if failed:                             # as preempt: a queue not found fails, said on stderr
        print(f"kfdtool: pid {args.pid}: queue {failed[0].qid} {failed[0].outcome}"
              + (f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""), file=sys.stderr)
        return 1
    return 0
