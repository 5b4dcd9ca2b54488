"""What the benchmark scripts share: open-loop request arrivals, latency summaries, provenance, and\nrunning programs together from a common start (as users run them, through `xsched-lv3 run`)."""
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


class GcPauses:
    """Diagnostics (BENCH_GC_LOG=1, `gc_pauses_if_asked`): the interpreter's garbage collections of at
    least `min_ms`. A collection runs with the GIL held, so it stops every thread of the process that
    needs it: in threads mode the service's too."""

    def __init__(self, min_ms=1.0):
        self.min_s, self.found, self._began = min_ms / 1e3, [], None      # found: [monotonic start, generation, ms]
        gc.callbacks.append(self._on_collection)

    def _on_collection(self, phase, info):
        now = time.monotonic()
        if phase == "start":
            self._began = now
        elif self._began is not None:
            if now - self._began >= self.min_s:
                self.found.append([self._began, info["generation"], round((now - self._began) * 1e3, 2)])
            self._began = None

    def since(self, origin):
        """[seconds since `origin` (monotonic), generation, ms] of each collection found."""
        return [[round(began - origin, 4), gen, ms] for began, gen, ms in self.found]

    def close(self):
        gc.callbacks.remove(self._on_collection)


def gc_pauses_if_asked():
    return GcPauses() if os.environ.get("BENCH_GC_LOG") else None


def open_loop(rate, seconds, request, warmup_s=0.0, t0=None, between=None, wake_late=None):
    """Call `request()` at `rate` per second for `seconds` (arrivals on a fixed schedule, whatever
    the previous request took). Returns latencies (completion - scheduled arrival) after warm-up.
    `between(next_arrival)`, if given, runs after each request's latency is taken (other work in the
    gap, timed by the caller's own clock). `wake_late`, if a list, gets for each of those requests how
    long after its arrival its call began (a late wake-up, the GIL, or the previous request still
    running): the part of a latency that is not the request's own."""
    t0 = time.monotonic() if t0 is None else t0
    latencies = []
    i = 0
    while True:
        arrival = t0 + i / rate
        if arrival > t0 + seconds:
            return latencies
        delay = arrival - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        began = time.monotonic()
        request()
        if arrival - t0 >= warmup_s:
            latencies.append(time.monotonic() - arrival)
            if wake_late is not None:
                wake_late.append(began - arrival)
        i += 1
        if between is not None:
            between(t0 + i / rate)


def iterations_per_second(step, start_at, seconds, warmup_s=0.0):
    """Call `step()` back to back until start_at + seconds; the rate of the calls that ended after
    start_at + warmup_s (counted from the first of them)."""
    done, counted_from = 0, None
    t_begin, t_end = start_at + warmup_s, start_at + seconds
    while time.monotonic() < t_end:
        step()
        now = time.monotonic()
        if now >= t_begin:
            if counted_from is None:
                counted_from = now
            else:
                done += 1
    return done / (time.monotonic() - counted_from) if counted_from else 0.0


def memory_scratch(prefix):
    """A fresh directory on a memory filesystem where there is one (/dev/shm), else the temporary
    directory: what a benchmark puts there (a simulated sysfs, the board, the daemon's hold records)
    lives in memory on the hosts it stands in for (sysfs, /dev/shm, /run), and a disk-backed
    /tmp adds write and rename costs of its own (~0.4 ms a hold record on this sandbox's ext4)."""
    in_memory = "/dev/shm" if os.access("/dev/shm", os.W_OK | os.X_OK) else None
    return tempfile.mkdtemp(prefix=prefix, dir=in_memory)


def add_profile(doc, config, fn, lines=14):
    """Run fn() (a segment of `config`) under cProfile; print the `lines` functions with the most time
    of their own and keep them in the results `doc`."""
    import cProfile
    import io
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(lines)
    doc["profile"] = {"config": config, "top_by_tottime": text.getvalue()}
    print(text.getvalue())


def write_results(path, doc):
    """A results file: JSON, its folder created if needed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {path}")


def percentile(ordered, p):
    """The value at rank p of sorted samples (p99 of 501 samples: the 496th smallest)."""
    return ordered[int(p * (len(ordered) - 1))]


def latency_summary(latencies_s, prefix="hp"):
    """p50 / p99 / max in ms."""
    lat = sorted(latencies_s)
    return {f"{prefix}_p50_ms": statistics.median(lat) * 1e3, f"{prefix}_p99_ms": percentile(lat, 0.99) * 1e3,
            f"{prefix}_max_ms": lat[-1] * 1e3}


def _git(tree, *cmd):
    """A git command's output in `tree`, or None (not a work tree, no git)."""
    try:
        r = subprocess.run(["git", "-C", str(tree), *cmd], capture_output=True, text=True, timeout=10)
        return r.stdout.strip() if r.returncode == 0 else None
    except OSError:
        return None


def git_revision_of(tree):
    """The commit the git work tree whose top is `tree` is at; None where `tree` is not one (a `git
    archive` unpacked inside another work tree would otherwise report that tree's commit)."""
    out = (_git(tree, "rev-parse", "--show-toplevel", "HEAD") or "").split()
    return out[1] if len(out) == 2 and Path(out[0]).resolve() == Path(tree).resolve() else None


def provenance(argv=None):
    """What every results file records: git revision and dirty flag (BENCH_GIT_REVISION /
    BENCH_GIT_DIRTY where set, as for a tree copied to the device machine, whose .git may be stale;
    else git), the exact command, the host's CPU count, the GPU's name from the driver's tool, and
    BENCH_NOTE where set (what else shared the host, for one)."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    repo = Path(__file__).resolve().parents[1]
    rev = os.environ.get("BENCH_GIT_REVISION")
    if rev:
        dirty = os.environ.get("BENCH_GIT_DIRTY") == "1"
    else:
        rev = git_revision_of(repo) or "unknown"
        dirty = bool(_git(repo, "status", "--porcelain", "--untracked-files=no"))
    card = "none found (no nvidia-smi or rocm-smi answered)"
    for tool in (["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], ["rocm-smi", "--showproductname"]):
        try:
            r = subprocess.run(tool, capture_output=True, text=True, timeout=20)
            if r.returncode == 0 and r.stdout.strip():
                card = r.stdout.strip().splitlines()[0]
                break
        except OSError:
            continue
    out = {"git_revision": rev, "git_dirty": dirty,
           "command": " ".join([Path(sys.executable).name] + (argv if argv is not None else sys.argv)),
           "cpu_count": os.cpu_count(), "card": card}
    if os.environ.get("BENCH_NOTE"):
        out["note"] = os.environ["BENCH_NOTE"]
    return out


REPO = Path(__file__).resolve().parents[1]
PY = sys.executable


def xsched_run(argv, priority=None, window_us=None, latency_slack=None):
    """`xsched-lv3 run` (the console script's main, through -m so no install is needed)."""
    cmd = [PY, "-m", "xsched_lv3", "run"]
    if priority is not None:
        cmd += ["--priority", str(priority)]
    if window_us is not None:
        cmd += ["--window-us", str(window_us)]
    if latency_slack is not None:
        cmd += ["--latency-slack", str(latency_slack)]
    return cmd + ["--"] + argv


def run_together(commands, timeout_s, checkout=REPO, when_ready=None):
    """Start every command, wait until each says READY, give all the same start time, and return
    what each printed last (a JSON object), in order, with the scheduler's account of that process
    under "gate" where it wrote one (XSCHED_LV3_REPORT). `checkout`: whose xsched_lv3
    `-m xsched_lv3` runs and the programs import; a report naming another package is an error.
    `when_ready(pids)`: called once all are ready, before the start (e.g. `xsched-lv3 attach` of some
    of them)."""
    # Absolute: relative to the programs' cwd (the checkout) it would name nothing, and a program
    # would import the xsched_lv3 further down PYTHONPATH (this tree's, on the device machine)
    checkout = Path(checkout).resolve()
    env = dict(os.environ, PYTHONPATH=str(checkout) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONUNBUFFERED="1")
    reports = tempfile.mkdtemp(prefix="xsched-report-")
    procs = [subprocess.Popen(c, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(env, XSCHED_LV3_REPORT=f"{reports}/{i}.json"), cwd=checkout)
             for i, c in enumerate(commands)]                                # -m puts the cwd first
    try:
        for p, c in zip(procs, commands):
            line = p.stdout.readline()
            if line.strip() != "READY":
                raise RuntimeError(f"{' '.join(c)} did not start: {line!r} {p.stderr.read()[-2000:]}")
        if when_ready is not None:
            when_ready([p.pid for p in procs])
        start_at = time.monotonic() + 0.5
        for p in procs:
            p.stdin.write(f"{start_at}\n")
            p.stdin.flush()
        outputs = []
        for i, (p, c) in enumerate(zip(procs, commands)):
            stdout, stderr = p.communicate(timeout=timeout_s)
            if p.returncode != 0:
                raise RuntimeError(f"{' '.join(c)} exited {p.returncode}: {stderr[-2000:]}")
            out = json.loads(stdout.strip().splitlines()[-1])
            report = Path(reports, f"{i}.json")
            if report.exists():
                out["gate"] = json.loads(report.read_text())
            for key in [k for k in out if k == "gate" or k.endswith("_gate")]:    # threads mode: in its output
                package = out[key].pop("package", None) if isinstance(out[key], dict) else None
                if package is not None and Path(package).resolve() != checkout / "xsched_lv3":
                    raise RuntimeError(f"{' '.join(c)} was scheduled by {package}, "
                                       f"not by {checkout}'s xsched_lv3")
            outputs.append(out)
        return outputs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        shutil.rmtree(reports, ignore_errors=True)
