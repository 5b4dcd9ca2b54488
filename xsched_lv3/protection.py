"""Hold lower-priority clients back only while they endanger this client's latency.

Strict priority holds every lower client for all of a higher client's requests. Where the two barely
interfere (a GPU that overlaps their kernels, little work queued ahead), that costs the lower client
a share of its throughput and buys the higher one nothing. The higher client is the one party that
sees the harm, in its own request latency, so it decides per request:

  * **protected**: it marks itself active, and lower clients on its GPU are held (Lv1) or their
    queues suspended (Lv3) until the request's GPU work completes;
  * **exposed**: it does not, and lower clients run on.

It starts protected. After a warm-up and a baseline of protected requests it *probes*: up to
PROBE_REQUESTS exposed requests, alternating with protected ones so both see the same load.

What the slack bounds is the tail (a user judges a service by its P99), and it is guarded per request:
an exposed request still running past the 90th percentile of the recent protected ones, plus the
slack, is protected for the rest of it (the gate's exposure guard), so lower clients are held only
once they endanger that request, and early enough that it can still end in the protected range.
Exposure is judged by the exposed requests that *overrun* all the same: end later than the recent
protected requests, plus the slack. "Later than the protected requests" leaves out their
OUTLIERS_IGNORED slowest: a host pause (a jittery VM, another tenant) hits protected and exposed
requests alike, and one such pause among the protected ones must not blind the comparison. With the
plain maximum, a single 20 ms pause among the protected requests of a 3 ms service let exposed
requests slowed to 23 ms (an LP's 8 ms kernels queued ahead of them, in the simulator on a 16-CPU
host) count as harmless, and the service ran at native latency for the rest of the run. A lower
client that costs the service little overruns about as rarely as a protected request would; one
whose work blocks the service's overruns at once. A probe ends at its second overrun
(PROBE_OVERRUN_BUDGET: one may be chance, since the bound leaves out the slowest protected requests),
so two exposed requests are the whole price of learning that a lower client hurts. A probe that ends
without that makes exposure the rule: one request in REFRESH_EVERY is still protected, to keep the
comparison current, and exposure ends at the second overrun within OVERRUN_WINDOW exposed requests (a P99
is the 1 % slowest: a few overruns a run would set it). A budget of 4 in 64 (about what protected
requests themselves give against a bound that leaves out 2 of 32) was tried at 9967c72: in the simulator
three batch jobs of 8 ms kernels next to a service at Lv1 then stayed exposed through 4 overruns of
hundreds of milliseconds each, and the service's open-loop requests queued up (P50 0.47 s); an overrun
says nothing about how far it overran. The median is not judged:
on an H100 a batch job next to a ResNet-18 service moved its median from 2.6 to 3.6 ms and its P99 by
6 % (results/diagnostics/bench_two_models_processes_b16_h100_29b291b_r*.json); a median test held the
batch job back for the whole run and cost it 15 % for a tail that did not need it. After a harmful
verdict the next probe waits four times longer (FIRST_PROBE_GAP x 4, x 16, ... up to MAX_PROBE_GAP
protected requests): a lower client that always hurts costs two exposed requests after 64, 128, 512,
2048 and then every 4096 protected requests.

`slack` = 0 turns probing off (strict priority: every request protected).
"""
from collections import deque

DEFAULT_LATENCY_SLACK = 0.10   # how much slower than the protected tail an exposed request may end
BASELINE_REQUESTS = 32         # protected requests before the first probe, and the comparison's sample
PROBE_REQUESTS = 8             # exposed requests in one probe
FIRST_PROBE_GAP = 32           # protected requests between a failed probe and the next, first
MAX_PROBE_GAP = 4096
REFRESH_EVERY = 8              # while exposed, one request in this many is protected
# The slowest recent protected requests that the overrun bound leaves out (host pauses, see above): of
# BASELINE_REQUESTS = 32 the bound is then about their 94th percentile.
OUTLIERS_IGNORED = 2
PROBE_OVERRUN_BUDGET = 1       # overruns a probe survives: the next one ends it
# While exposed, more overruns than this within OVERRUN_WINDOW exposed requests end the exposure: a
# chance one does not, a second soon after does, before a few set the P99.
OVERRUN_BUDGET = 1
OVERRUN_WINDOW = 64


class Protection:
    def __init__(self, slack=DEFAULT_LATENCY_SLACK):
        if not 0 <= slack < float("inf"):
            raise ValueError(f"latency slack must be >= 0 and finite, got {slack!r}")
        self.slack = slack
        # the latest protected latencies (s): recent, so a warm-up or an old phase soon leaves them
        self.protected = deque(maxlen=BASELINE_REQUESTS)
        self._overruns = deque(maxlen=OVERRUN_BUDGET + 1)   # which exposed requests overran (their number)
        self.exposing = False                        # the verdict: lower clients are harmless
        self._probe_left = 0                         # exposed requests still to run in this probe
        self._probe_overruns = 0                     # ... and its overruns so far
        self._gap = FIRST_PROBE_GAP
        self._until_probe = 2 * BASELINE_REQUESTS         # the first ones warm up (caches, clocks, a queue)
        self._turn = 0
        self.probes = 0                              # for reports
        self.exposed_requests = 0
        self.overruns = 0

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
            self._probe_left, self._probe_overruns, self._turn = PROBE_REQUESTS, 0, 1
            self.probes += 1
            return False
        return True

    def finished(self, protected, latency_s):
        """A request ended (its GPU work completed) `latency_s` after it began."""
        if protected:
            self.protected.append(latency_s)
            self._until_probe -= 1
            return
        self.exposed_requests += 1
        if not (self.exposing or self._probe_left):
            return
        if latency_s > self.overrun_bound_s():
            self.overruns += 1
            self._overruns.append(self.exposed_requests)
            if self._probe_left:
                self._probe_overruns += 1
                harmful = self._probe_overruns > PROBE_OVERRUN_BUDGET
            else:
                harmful = (len(self._overruns) > OVERRUN_BUDGET
                           and self.exposed_requests - self._overruns[0] < OVERRUN_WINDOW)
            if harmful:
                self._verdict(False)
                return
        if self._probe_left:
            self._probe_left -= 1
            if not self._probe_left:
                self._verdict(True)                   # at most PROBE_OVERRUN_BUDGET overruns

    def overrun_bound_s(self):
        """An exposed request that ends later than this overran: slower than the recent protected
        requests but their OUTLIERS_IGNORED slowest, by the slack."""
        if not self.protected:
            return float("inf")
        ordered = sorted(self.protected)
        return (1 + self.slack) * ordered[max(0, len(ordered) - 1 - OUTLIERS_IGNORED)]

    def guard_deadline_s(self):
        """How long an exposed request runs before the gate protects it after all: past the 90th
        percentile of the protected ones, by the slack. Earlier than the overrun bound, so a request
        that a lower client slows is protected while it can still end within that bound: per request,
        lower clients are held only once they endanger it."""
        if not self.protected:
            return float("inf")
        ordered = sorted(self.protected)
        return (1 + self.slack) * ordered[int(0.9 * (len(ordered) - 1))]

    def new_company(self):
        """A lower client joined: a verdict about the others says nothing about it. Protected from
        here on, with a fresh probe after FIRST_PROBE_GAP protected requests (the baseline, the
        service's own latency, still holds)."""
        if self.exposing or self._probe_left or self._gap > FIRST_PROBE_GAP:
            self.exposing, self._probe_left = False, 0
            self._gap = self._until_probe = FIRST_PROBE_GAP
            self._overruns.clear()

    def _verdict(self, harmless):
        if harmless:
            self.exposing, self._gap = True, FIRST_PROBE_GAP
        else:                                         # also when an exposure turned harmful: no flapping
            self.exposing = False
            self._gap = min(MAX_PROBE_GAP, self._gap * 4)
            self._until_probe = self._gap
        self._probe_left = 0
        self._overruns.clear()

    def stats(self):
        return {"latency_slack": self.slack, "exposing": self.exposing, "probes": self.probes,
                "exposed_requests": self.exposed_requests, "overruns": self.overruns}
