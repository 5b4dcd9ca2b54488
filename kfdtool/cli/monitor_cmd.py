"""kfdtool monitor: a live view of KFD processes and queues (rich), refreshed from sysfs, with each
process's CPU % and RSS (psutil); notes topology changes (generation_id) and, where udev is
available, GPU hotplug events."""
import argparse
import contextlib
import time

from ..cwsr.holds import mark_held
from .argtypes import interval_seconds, positive_int
from ..hostusage import HostUsage
from ..processes import scan_processes
from ..sysfs import read_int
from .render import console, human_bytes, table
from .commands import help_for

HELP = help_for("monitor")


# --sort: the busiest first, like top; each key reads one row's values
SORT_KEYS = {
    "vram": lambda r: r["vram"] or 0,
    "cu": lambda r: r["cu_occupancy"] or 0,
    "sdma": lambda r: r["sdma_pct"] or 0,
    "cpu": lambda r: r["cpu"] or 0,
    "rss": lambda r: r["rss"] or 0,
    "queues": lambda r: r["queues"],
    "pid": lambda r: -r["pid"],
}
HEADER_LINES = 8            # title, table borders and header, caption, a line to spare


def add_parser(sub):
    p = sub.add_parser("monitor", help=HELP, description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  kfdtool monitor\n  kfdtool --sim mi308x monitor --interval 0.5\n"
                              "  kfdtool monitor --sort cpu       # the most CPU-hungry GPU processes first\n"
                              "  kfdtool monitor --count 5        # five refreshes, then exit\n")
    p.add_argument("--interval", type=interval_seconds, default=1.0)
    p.add_argument("--count", type=positive_int, help="stop after this many refreshes")
    p.add_argument("--sort", choices=sorted(SORT_KEYS), default="vram",
                   help="order of the rows, largest first (default: vram); a terminal shows the rows that fit")
    p.add_argument("--no-udev", action="store_true", help="do not listen for GPU hotplug events")
    p.set_defaults(run=run)


def _sample(ctx, previous, dt, host):
    """One row per (process, GPU it uses), with rates against the previous sample."""
    scan = mark_held(scan_processes(ctx.sysfs, kernel_release=ctx.kernel_release, workers=None))
    usage = host.sample([p.pid for p in scan.processes])
    before = {p.pid: p for p in previous.processes} if previous else {}
    rows = []
    for p in scan.processes:
        old = before.get(p.pid)
        cpu, rss = usage.get(p.pid, (None, None))
        for gpu in p.gpu_ids:
            queues = [q for q in p.queues if q.gpu_id == gpu]
            sdma_pct = evict_rate = None
            if old and dt:
                sdma_pct = 100 * ((p.sdma_us.get(gpu) or 0) - (old.sdma_us.get(gpu) or 0)) / (dt * 1e6)
                evict_rate = ((p.evicted_ms.get(gpu) or 0) - (old.evicted_ms.get(gpu) or 0)) / dt
            rows.append({"pid": p.pid, "name": p.name, "cpu": cpu, "rss": rss, "gpu": gpu, "queues": len(queues),
                         "suspended": sum(1 for q in queues if q.suspended_by), "vram": p.vram.get(gpu),
                         "cu_occupancy": p.cu_occupancy.get(gpu), "sdma_pct": sdma_pct, "evict_rate": evict_rate})
    return scan, rows


def _grid(scan, rows, sort, limit, notes):
    rows = sorted(rows, key=SORT_KEYS[sort], reverse=True)
    hidden = len(rows) - limit if limit is not None and len(rows) > limit else 0
    shown = rows[:len(rows) - hidden]
    cells = [(r["pid"], r["name"], "" if r["cpu"] is None else f"{r['cpu']:.0f}", human_bytes(r["rss"]), r["gpu"],
              r["queues"], r["suspended"] or "", human_bytes(r["vram"]), r["cu_occupancy"],
              "" if r["sdma_pct"] is None else f"{r['sdma_pct']:.1f}%",
              "" if r["evict_rate"] is None else f"{r['evict_rate']:.0f}") for r in shown]
    title = (f"kfdtool monitor — {len(scan.processes)} KFD processes, {sum(len(p.queues) for p in scan.processes)} "
             f"queues, by {sort}")
    caption = notes[-3:] + ([f"{hidden} more rows below (a taller terminal, or --sort)"] if hidden else [])
    return table(title, [">PID", "NAME", "->CPU %", "->RSS", ">GPU_ID", ">QUEUES", ">SUSPENDED", ">VRAM",
                         "->CU_OCC", "->SDMA", "->EVICT ms/s"], cells, caption="; ".join(caption) or None)


def run(args, ctx):
    from rich.live import Live
    notes = []
    mon = None
    if not args.no_udev and ctx.sim is None:
        try:
            from ..hotplug import monitor
            mon = monitor()
            mon.start()
        except Exception as e:           # no udev in containers: the view still works
            notes.append(f"no hotplug events ({type(e).__name__})")
    generation = read_int(ctx.sysfs.topology / "generation_id")
    out = console()
    # a terminal shows what fits; a pipe or file gets every row
    limit = max(out.height - HEADER_LINES, 1) if out.is_terminal else None
    host = HostUsage()
    scan, rows = _sample(ctx, None, None, host)
    shown = 1
    last = time.monotonic()
    # auto_refresh off: rich would otherwise re-render the whole table 4 times a second (2.7 s of
    # CPU a second at 1,000 processes); the view changes once a sample. A pipe or a file gets every
    # refresh, one table after another as `top -b` prints them: a live view shows only its last
    # frame there, so `kfdtool monitor > log` would hold nothing until it ended.
    grid = _grid(scan, rows, args.sort, limit, notes)
    live = Live(grid, console=out, auto_refresh=False, transient=False) if out.is_terminal else None
    if live is None:
        _print_now(out, grid)
    with live or contextlib.nullcontext():
        while args.count is None or shown < args.count:
            time.sleep(args.interval)
            if mon is not None:
                from ..hotplug import events
                for ev in events(mon, timeout=0):
                    notes.append(f"{ev.subsystem} {ev.action}: {ev.device}")
            gen = read_int(ctx.sysfs.topology / "generation_id")
            if gen != generation:
                notes.append(f"topology changed (generation {generation} -> {gen})")
                generation = gen
            now = time.monotonic()
            scan, rows = _sample(ctx, scan, now - last, host)
            last = now
            if live is not None:
                limit = max(out.height - HEADER_LINES, 1)      # follows a resized window
                live.update(_grid(scan, rows, args.sort, limit, notes), refresh=True)
            else:
                _print_now(out, _grid(scan, rows, args.sort, limit, notes))
            shown += 1
    return 0


def _print_now(out, grid):
    out.print(grid)
    out.file.flush()
