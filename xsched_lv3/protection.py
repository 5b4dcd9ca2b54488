"""Hold lower-priority clients back only while they endanger this client's latency.

Strict priority holds every lower client for all of a higher client's requests. Where the two barely
interfere (a GPU that overlaps their kernels, little work queued ahead), that costs the lower client
a share of its throughput and buys the higher one nothing. The higher client is the one party that
sees the harm, in its own request latency, so it decides per request:

  * **protected**: it marks itself active, and lower clients on its GPU are held (Lv1) or their
    queues suspended (Lv3) until the request's GPU work completes;
  * **exposed**: it does not, and lower clients run on.

It starts protected. After a warm-up and a baseline of protected requests it *probes*: up to
PROBE_REQUESTS exposed requests, alternating with protected ones so both see the same load. A probe
is cut short by the first exposed request slower than anything the protected ones showed lately
(their maximum, plus the slack): that one request is the whole price of learning that a lower
client hurts, so probes cannot own the tail (a P99 is set by 1 % of the requests). A probe that
runs to its end is judged on its median: exposure is harmless when it shifts the median latency by
no more than `slack` times the protected requests' 90th percentile (interference adds waiting time
to a request, so a shift of the middle moves the tail about as much; the 90th percentile of the
recent protected requests stands for their tail, the highest one a few outliers cannot move).
Harmless: requests stay exposed, one in REFRESH_EVERY still protected to keep the comparison
current; any exposed request beyond the protected maximum plus the slack, or a batch of
PROBE_REQUESTS exposed requests whose median shifted too far, ends it. Harmful: protected on, and
the next probe waits four times longer (FIRST_PROBE_GAP x 4, x 16, ... up to MAX_PROBE_GAP protected
requests). A lower client that always hurts costs one exposed request after 64, 128, 512, 2048 and
then every 4096 protected requests, and that request itself is protected once it has run past the
same bound (the gate's exposure guard): where the lower client's work blocks the service's (a GPU
whose waves are not preempted), one exposed request would otherwise take as long as that work.

`slack` = 0 turns probing off (strict priority: every request protected).
"""
import statistics
from collections import deque

DEFAULT_LATENCY_SLACK = 0.10   # the P99 an exposed request may cost, as a fraction of the protected P99
BASELINE_REQUESTS = 32         # protected requests before the first probe, and the comparison's sample
PROBE_REQUESTS = 8             # exposed requests in one probe (and per re-check while exposed)
FIRST_PROBE_GAP = 32           # protected requests between a failed probe and the next, first
MAX_PROBE_GAP = 4096
REFRESH_EVERY = 8              # while exposed, one request in this many is protected


class Protection:
    def __init__(self, slack=DEFAULT_LATENCY_SLACK):
        if not 0 <= slack < float("inf"):
            raise ValueError(f"latency slack must be >= 0 and finite, got {slack!r}")
        self.slack = slack
        # the latest protected latencies (s): recent, so a warm-up or an old phase soon leaves them
        self.protected = deque(maxlen=BASELINE_REQUESTS)
        self.exposed = deque(maxlen=PROBE_REQUESTS)     # the latest exposed latencies, judged together
        self.exposing = False                        # the verdict: lower clients are harmless
        self._probe_left = 0                         # exposed requests still to run in this probe
        self._gap = FIRST_PROBE_GAP
        self._until_probe = 2 * BASELINE_REQUESTS         # the first ones warm up (caches, clocks, a queue)
        self._turn = 0
        self._since_check = 0
        self.probes = 0                              # for reports
        self.exposed_requests = 0

    def protect_next(self):
        """Whether the request starting now is protected."""
        if not self.slack:
            return True
        self._turn += 1
        if self.exposing:
            return self._turn % REFRESH_EVERY == 0
        if self._probe_left:
            return self._turn % 2 == 0               # alternate: both kinds see the same load
        if self._until_probe <= 0 and len(self.protected) >= BASELINE_REQUESTS:
            self._probe_left, self._turn = PROBE_REQUESTS, 1
            self.exposed.clear()
            self.probes += 1
            return False
        return True

    def finished(self, protected, latency_s):
        """A request ended (its GPU work completed) `latency_s` after it began."""
        if protected:
            self.protected.append(latency_s)
            self._until_probe -= 1
            return
        self.exposed.append(latency_s)
        self.exposed_requests += 1
        if self.exposing or self._probe_left:
            if latency_s > self.exposure_deadline_s():
                self._verdict(False)              # slower than any protected request: no more exposure
                return
        if self.exposing:
            self._since_check += 1
            if self._since_check >= PROBE_REQUESTS:
                self._since_check = 0
                if not self.harmless():
                    self._verdict(False)
        elif self._probe_left:
            self._probe_left -= 1
            if not self._probe_left:
                self._verdict(self.harmless())

    def exposure_deadline_s(self):
        """How long an exposed request may run before it is protected after all (and counts as
        harmed): longer than any recent protected request, by the slack."""
        return (1 + self.slack) * max(self.protected, default=float("inf"))

    def harmless(self):
        """Do the latest exposed requests stay within the slack of the protected ones?"""
        if len(self.exposed) < PROBE_REQUESTS // 2 or len(self.protected) < PROBE_REQUESTS // 2:
            return False
        shift = statistics.median(self.exposed) - statistics.median(self.protected)
        return shift <= self.slack * quantile(self.protected, 0.90)

    def _verdict(self, harmless):
        if harmless:
            self.exposing, self._gap = True, FIRST_PROBE_GAP
        else:                                         # also when an exposure turned harmful: no flapping
            self.exposing = False
            self._gap = min(MAX_PROBE_GAP, self._gap * 4)
            self._until_probe = self._gap
        self._probe_left, self._since_check = 0, 0
        self.exposed.clear()

    def stats(self):
        return {"latency_slack": self.slack, "exposing": self.exposing, "probes": self.probes,
                "exposed_requests": self.exposed_requests}


def quantile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
