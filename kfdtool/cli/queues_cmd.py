"""kfdtool queues: every KFD process and its queues, from sysfs (never opens /dev/kfd)."""
import argparse
import sys
import time

from ..cwsr.holds import mark_held
from .argtypes import interval_seconds, positive_int
from ..errors import NoSuchProcess
from ..processes import scan_processes
from .render import console, human_bytes, print_csv, print_json, table
from .commands import help_for

HELP = help_for("queues")
EXAMPLES = """examples:
  kfdtool queues                        # all KFD processes, one row per queue
  kfdtool queues -p 1234 -p 5678        # only these pids
  kfdtool queues -n python              # processes whose name contains "python"
  kfdtool queues --json                 # schema kfdtool.queues/1
  kfdtool queues --csv > queues.csv
  kfdtool queues 1 10                   # every second, 10 times, with SDMA and eviction rates
  kfdtool --sim mi308x queues           # the simulated MI308X host
"""
CSV_HEADER = ["pid", "name", "user", "container_pid", "gpu_id", "qid", "type", "ring_size", "vram_bytes",
              "sdma_us", "cu_occupancy", "evicted_ms"]


def add_parser(sub):
    p = sub.add_parser("queues", help=HELP, description=HELP, epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-p", "--pid", type=positive_int, action="append", help="only this pid (repeatable)")
    p.add_argument("-n", "--name", action="append", help="only processes whose name contains NAME")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="JSON (one document per sample in watch mode)")
    fmt.add_argument("--csv", action="store_true", help="CSV, one row per queue")
    p.add_argument("interval", nargs="?", type=interval_seconds, help="watch: seconds between samples")
    p.add_argument("count", nargs="?", type=positive_int, help="watch: number of samples (default: until Ctrl-C)")
    p.set_defaults(run=run)


def run(args, ctx):
    scan = _scan(args, ctx)
    if args.pid:
        missing = sorted(set(args.pid) - {p.pid for p in scan.processes})
        if missing and args.interval is None:
            raise NoSuchProcess(missing[0], ctx.not_kfd_process(missing[0]))
    if args.interval is None:
        _emit(args, scan, None, None)
        return 0
    previous, t_prev = scan, time.monotonic()
    samples = 1
    _emit(args, scan, None, None)
    while args.count is None or samples < args.count:
        time.sleep(args.interval)
        scan, now = _scan(args, ctx), time.monotonic()
        _emit(args, scan, previous, now - t_prev)
        previous, t_prev = scan, now
        samples += 1
    return 0


def _scan(args, ctx):
    return mark_held(scan_processes(ctx.sysfs, pids=args.pid, names=args.name, kernel_release=ctx.kernel_release,
                                    workers=None))


def _rates(scan, previous, dt):
    """SDMA busy % and eviction ms/s per (pid, gpu) from two samples."""
    if previous is None or not dt:
        return {}
    before = {p.pid: p for p in previous.processes}
    rates = {}
    for proc in scan.processes:
        old = before.get(proc.pid)
        if old is None:
            continue
        for gpu in proc.gpu_ids:
            sdma = (proc.sdma_us.get(gpu) or 0) - (old.sdma_us.get(gpu) or 0)
            evicted = (proc.evicted_ms.get(gpu) or 0) - (old.evicted_ms.get(gpu) or 0)
            rates[(proc.pid, gpu)] = (100.0 * sdma / (dt * 1e6), evicted / dt)
    return rates


def _emit(args, scan, previous, dt):
    rates = _rates(scan, previous, dt)
    if args.json:
        doc = scan.to_dict()
        if dt:
            doc["interval_s"] = dt
            doc["rates"] = [{"pid": pid, "gpu_id": gpu, "sdma_busy_pct": r[0], "evicted_ms_per_s": r[1]}
                            for (pid, gpu), r in rates.items()]
        print_json(doc)
    elif args.csv:
        print_csv(CSV_HEADER, _csv_rows(scan))
    else:
        _print_table(scan, rates, dt)
    sys.stdout.flush()


def _csv_rows(scan):
    for p in scan.processes:
        for q in p.queues:
            g = q.gpu_id
            yield [p.pid, p.name, p.user, p.container_pid, g, q.qid, q.type_name, q.size, p.vram.get(g),
                   p.sdma_us.get(g), p.cu_occupancy.get(g), p.evicted_ms.get(g)]


def _print_table(scan, rates, dt):
    out = console()
    if not scan.processes:
        out.print("no KFD processes" + _footer(scan))
        return
    rows = []
    for p in scan.processes:
        name = p.name or "?"
        if p.container_pid:
            name += f" (ns pid {p.container_pid})"
        first = True
        # a KFD process on no GPU yet (opened /dev/kfd only: a debugger such as the xsched-lv3
        # daemon) still gets its row, so the rows add up to the title's count
        for gpu in p.gpu_ids or ["-"]:
            queues = [q for q in p.queues if q.gpu_id == gpu] or [None]
            sdma = f"{rates[(p.pid, gpu)][0]:.1f}%" if (p.pid, gpu) in rates else p.sdma_us.get(gpu)
            evicted = f"{rates[(p.pid, gpu)][1]:.0f}/s" if (p.pid, gpu) in rates else p.evicted_ms.get(gpu)
            for i, q in enumerate(queues):
                per_gpu = i == 0
                state = f"suspended by {q.suspended_by}" if q and q.suspended_by else ""
                rows.append((p.pid if first else "", name if first else "", p.user if first else "",
                             gpu if per_gpu else "", q.qid if q else "-", q.type_name if q else "", state,
                             human_bytes(q.size) if q else "", human_bytes(p.vram.get(gpu)) if per_gpu else "",
                             sdma if per_gpu else "", p.cu_occupancy.get(gpu) if per_gpu else "",
                             evicted if per_gpu else ""))
                first = False
    n_queues = sum(len(p.queues) for p in scan.processes)
    title = f"{len(scan.processes)} KFD processes, {n_queues} queues"
    sdma_col = ">SDMA %" if dt else ">SDMA µs"
    evict_col = ">EVICTED ms/s" if dt else ">EVICTED ms"
    out.print(table(title, [">PID", "NAME", "-USER", ">GPU_ID", ">QID", "TYPE", "STATE", "->RING", "->VRAM",
                            "-" + sdma_col, "->CU_OCC", "-" + evict_col], rows, caption=_footer(scan).strip() or None))


def _footer(scan):
    parts = []
    if scan.unreadable:
        parts.append(f"{scan.unreadable} processes unreadable (permission denied)")
    if scan.vanished:
        parts.append(f"{scan.vanished} exited during the scan")
    return ("; " + "; ".join(parts)) if parts else ""
