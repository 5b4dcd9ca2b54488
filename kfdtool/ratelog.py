"""A log that a local user cannot flood: the simulator's server and the xsched-lv3 daemon both
log what clients do, and a client reconnecting in a loop must not fill the disk. Stdlib only (the
simulated kernel may import it, as it may import `kfdtool.pids`)."""
import sys
import time

LOG_LINES_PER_MINUTE = 600


class RateLimitedLog:
    """Lines to `stream` (stderr), at most `per_minute`, each stamped and prefixed with `name`; the
    rest are counted and the count is logged when lines flow again."""

    def __init__(self, name, per_minute=LOG_LINES_PER_MINUTE, stream=None):
        self.name, self.per_minute, self.stream = name, per_minute, stream
        self.window_start, self.lines, self.dropped = time.monotonic(), 0, 0

    def __call__(self, text):
        now = time.monotonic()
        if now - self.window_start >= 60:
            if self.dropped:
                self._write(f"({self.dropped} log lines dropped in the last minute)")
            self.window_start, self.lines, self.dropped = now, 0, 0
        if self.lines >= self.per_minute:
            self.dropped += 1
            return
        self.lines += 1
        self._write(text)

    def _write(self, text):
        # a log nobody can read any more (its pipe closed, a full disk) must not stop what it
        # reports on: a daemon logging its shutdown would otherwise skip resuming the queues it holds
        try:
            print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {self.name}: {text}", file=self.stream or sys.stderr,
                  flush=True)
        except (OSError, ValueError):          # ValueError: the stream was closed
            self.dropped += 1
