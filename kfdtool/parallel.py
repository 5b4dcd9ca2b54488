"""Spread a syscall-bound scan over CPUs with bare fork(): `fork_map(fn, chunks)`.

Why not multiprocessing: its import and pool start cost ~35 ms here, a tenth of the budget of a
1,000-process `kfdtool queues`; fork + a pipe + pickle cost ~2 ms. Why not threads: the work is
tens of thousands of ~5 µs open/read/close calls, and handing the GIL around that often made a
thread pool twice as slow as one thread.

fork() is only safe in a process with one thread (a forked child inherits other threads' locks,
not the threads), so callers with threads get the serial path. A child that fails has its share
redone in the caller, so a failure surfaces exactly as it would have serially.
"""
import os
import pickle
import threading


def usable_cpus():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def split(items, min_per_chunk, max_chunks=None):
    """`items` in contiguous chunks of at least `min_per_chunk`, at most one per usable CPU."""
    chunks = max(1, min(len(items) // max(min_per_chunk, 1), max_chunks or usable_cpus()))
    size, extra = divmod(len(items), chunks)
    out, start = [], 0
    for i in range(chunks):
        end = start + size + (i < extra)
        out.append(items[start:end])
        start = end
    return out


def fork_map(fn, chunks):
    """[fn(chunk) for chunk in chunks], the first chunk here and each other in a forked child."""
    if len(chunks) < 2 or threading.active_count() > 1 or not hasattr(os, "fork"):
        return [fn(chunk) for chunk in chunks]
    children = []
    try:
        for chunk in chunks[1:]:
            children.append(_spawn(fn, chunk))
        results = [fn(chunks[0])]
        for (pid, pipe), chunk in zip(children, chunks[1:]):
            ok, value = _collect(pid, pipe)
            results.append(value if ok else fn(chunk))
        children.clear()
        return results
    finally:
        for pid, pipe in children:          # only on the way out of an exception
            _kill(pid, pipe)


def _spawn(fn, chunk):
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:                            # child: never returns, never runs the caller's cleanup
        status = 1
        try:
            os.close(read_end)
            payload = pickle.dumps(fn(chunk), protocol=pickle.HIGHEST_PROTOCOL)
            with os.fdopen(write_end, "wb") as out:
                out.write(payload)
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    return pid, read_end


def _collect(pid, pipe):
    """(True, result) from a child, or (False, None) if it failed."""
    with os.fdopen(pipe, "rb") as source:
        payload = source.read()
    _, status = os.waitpid(pid, 0)
    if status != 0 or not payload:
        return False, None
    try:
        return True, pickle.loads(payload)
    except Exception:
        return False, None


def _kill(pid, pipe):
    for cleanup in (lambda: os.kill(pid, 9), lambda: os.waitpid(pid, 0), lambda: os.close(pipe)):
        try:
            cleanup()
        except OSError:
            pass                            # already reaped or closed
