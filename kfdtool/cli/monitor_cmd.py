"""kfdtool monitor: a live view of KFD processes and queues (rich), refreshed from sysfs, with each
process's CPU % and RSS (psutil); notes topology changes (generation_id) and, where udev is
available, GPU hotplug events."""
import argparse
import time

from ..cwsr.holds import for_each_hold
from ..hostusage import HostUsage
from ..processes import scan_processes
from ..sysfs import read_int
from .render import console, human_bytes, table
from .commands import help_for

HELP = help_for("monitor")


def add_parser(sub):
    p = sub.add_parser("monitor", help=HELP, description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  kfdtool monitor\n  kfdtool --sim mi308x monitor --interval 0.5\n"
                              "  kfdtool monitor --count 5        # five refreshes, then exit\n")
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--count", type=int, help="stop after this many refreshes")
    p.add_argument("--no-udev", action="store_true", help="do not listen for GPU hotplug events")
    p.set_defaults(run=run)


def _render(ctx, previous, dt, notes, host):
    scan = scan_processes(ctx.sysfs, kernel_release=ctx.kernel_release, workers=None)
    usage = host.sample([p.pid for p in scan.processes])
    held = {(r["target_pid"], q): r["holder_pid"] for r in for_each_hold() for q in r["queues"]}
    before = {p.pid: p for p in previous.processes} if previous else {}
    rows = []
    for p in scan.processes:
        old = before.get(p.pid)
        cpu, rss = usage.get(p.pid, (None, None))
        first = True
        for gpu in p.gpu_ids:
            queues = [q for q in p.queues if q.gpu_id == gpu]
            sdma = evict = ""
            if old and dt:
                sdma = f"{100 * ((p.sdma_us.get(gpu) or 0) - (old.sdma_us.get(gpu) or 0)) / (dt * 1e6):.1f}%"
                evict = f"{((p.evicted_ms.get(gpu) or 0) - (old.evicted_ms.get(gpu) or 0)) / dt:.0f}"
            suspended = sum(1 for q in queues if (p.pid, q.qid) in held)
            host_cols = (f"{cpu:.0f}" if cpu is not None else "", human_bytes(rss)) if first else ("", "")
            rows.append((p.pid if first else "", p.name if first else "", *host_cols, gpu, len(queues),
                         suspended or "", human_bytes(p.vram.get(gpu)), p.cu_occupancy.get(gpu), sdma, evict))
            first = False
    title = f"kfdtool monitor — {len(scan.processes)} KFD processes, {sum(len(p.queues) for p in scan.processes)} queues"
    grid = table(title, [">PID", "NAME", ">CPU %", ">RSS", ">GPU_ID", ">QUEUES", ">SUSPENDED", ">VRAM", ">CU_OCC", ">SDMA", ">EVICT ms/s"],
                 rows, caption="; ".join(notes[-3:]) or None)
    return scan, grid


def run(args, ctx):
    from rich.live import Live
    if args.interval <= 0:
        raise ValueError("interval must be > 0")
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
    host = HostUsage()
    scan, grid = _render(ctx, None, None, notes, host)
    shown = 1
    last = time.monotonic()
    with Live(grid, console=console(), refresh_per_second=4, transient=False) as live:
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
            scan, grid = _render(ctx, scan, now - last, notes, host)
            last = now
            live.update(grid)
            shown += 1
    return 0
