"""Hold lower-priority clients back only while they endanger this client's latency.

Strict priority holds every lower client for all of a higher client's requests. Where the two barely
interfere (a GPU that overlaps their kernels, little work queued ahead), that costs the lower client
a share of its throughput and buys the higher one nothing. The higher client is the one party that
sees the harm, in its own request latency, so it decides per request:

  * **protected**: it marks itself active, and lower clients on its GPU are held (Lv1) or their
    queues suspended (Lv3) until the request's GPU work completes;
  * **exposed**: it does not, and lower clients run on.

It starts protected. After a warm-up (BASELINE_REQUESTS requests, not kept: caches, clocks, lazy
set-up) and a baseline of as many protected requests it *probes*: up to PROBE_REQUESTS exposed
requests, alternating with protected ones so both see the same load (those protected ones are not
kept either: they wait for what the exposed ones let lower clients queue). A baseline whose older half
is still much slower than its newer half (a longer warm-up) postpones the probe (`_settled`).

What the slack bounds is the tail (a user judges a service by its P99), and it is guarded per request:
an exposed request still running past the 90th percentile of the recent protected ones, plus the
slack, is protected for the rest of it (the gate's exposure guard), so lower clients are held only
once they endanger that request, and early enough that it can still end in the protected range.
Exposure is judged by the exposed requests that *overrun* all the same: end later than the recent
protected requests, plus the slack. "Later than the protected requests" leaves out their slowest
sixteenth (IGNORED_SHARE): a host pause (a jittery VM, another tenant) hits protected and exposed
requests alike, and one such pause among the protected ones must not blind the comparison. With the
plain maximum, a single 20 ms pause among the protected requests of a 3 ms service let exposed
requests slowed to 23 ms (an LP's 8 ms kernels queued ahead of them, in the simulator on a 16-CPU
host) count as harmless, and the service ran at native latency for the rest of the run. The bound
comes from the latest PROTECTED_HISTORY protected requests (32 at the first probe, more as they come):
from 32 only, its quantile moved so much from one baseline to the next that a lower client that
changed nothing overran it 1 to 8 % of the time, depending on the baseline it drew.

A probe ends at its first overrun: that one request is the whole price of learning that a lower client
hurts, so probes cannot own the tail (9967c72 let a probe survive one overrun and an exposure four in
64: in the simulator a harmful batch job then passed probes and stayed exposed at Lv1 through overruns
of hundreds of ms). A probe without an overrun makes exposure the rule: one request in REFRESH_EVERY
is still protected, to keep the comparison current. They join the history, so that stragglers of a
warm-up and an old phase age out of it, but they wait for what lower clients queue while exposed, so
until the next verdict the bound and the guard's deadline may fall with them, never rise above where
the verdict found them. Where the latest REFRESH_SAMPLE of them all end faster than the fastest
quarter of the baseline the verdict was judged by, the service itself got faster (or that baseline
was mostly warm-up stragglers) and the baseline is taken again.

A protected request overruns the bound now and then by chance (the service's own spread), so an
exposed one may too: the protected requests compared with the bound count how often (`chance_rate`),
and exposure ends when its overruns outrun that rate by more than EXCESS_OVERRUNS (a one-sided CUSUM:
each overrun adds 1, each exposed request takes away the chance rate plus EXCESS_OVERRUNS, and
OVERRUN_ALARM ends the exposure): three overruns within a few dozen exposed requests, or a rate above
chance kept up; not a chance overrun now and then. Overruns *far* past the bound (by more than the
slack again) are counted apart, against the protected requests' own rate of those (0.3 % at a 15 %
spread, 1.5 % at 30 %): one far overrun in a hundred requests is the P99, so the second within 50 to
110 exposed requests, depending on that rate, ends the exposure (EXCESS_FAR_OVERRUNS,
FAR_OVERRUN_ALARM). Under the rule before 1a7bafd (the second overrun within 64 exposed requests, the
bound from the latest 32) a lower client that changed nothing was exposed for 0.34 of a 15 %-spread
service's requests, against 0.57 now (`scripts/protection_montecarlo.py`), and far overruns once in
100 requests seldom ended an exposure.

The median is not judged: on an H100 a batch job next to a ResNet-18 service moved its median from
2.6 to 3.6 ms and its P99 by 6 % (results/diagnostics/bench_two_models_processes_b16_h100_29b291b_r*.json);
a median test held the batch job back for the whole run and cost it 15 % for a tail that did not need
it. After a harmful verdict the next probe waits four times longer (FIRST_PROBE_GAP x 4, x 16, ... up
to MAX_PROBE_GAP protected requests): a lower client that always hurts costs one exposed request after
64, 128, 512, 2048 and then every 4096 protected requests.

`slack` = 0 turns probing off (strict priority: every request protected).
"""
from collections import deque
from typing import NamedTuple

DEFAULT_LATENCY_SLACK = 0.10   # how much slower than the protected tail an exposed request may end
# ... at most: 100x the protected tail is already "never protect"; beyond it a deadline overflows a
# thread's timeout (threading.TIMEOUT_MAX)
MAX_LATENCY_SLACK = 100.0
BASELINE_REQUESTS = 32         # protected requests before the first probe
PROTECTED_HISTORY = 128        # the latest protected requests the overrun bound comes from
PROBE_REQUESTS = 8             # exposed requests in one probe
FIRST_PROBE_GAP = 32           # protected requests between a failed probe and the next, first
MAX_PROBE_GAP = 4096
REFRESH_EVERY = 8              # while exposed, one request in this many is protected
REFRESH_SAMPLE = 8             # ... and the latest this many of them are compared with the baseline
# A baseline whose older half is slower than its newer half by this much (75th percentiles) is still
# warming up (`_settled`): 2x-slow stragglers are caught, a 30 %-spread service's chance differences are not
WARMING_UP_RATIO = 1.5
# The share of the recent protected requests, the slowest, that the overrun bound leaves out (host
# pauses, see above): the bound is about their 94th percentile, plus the slack.
IGNORED_SHARE = 1 / 16
# While exposed: overruns beyond the protected requests' own rate of them (chance_rate) by more than
# this, per exposed request, add up (a CUSUM), and exposure ends when they reach OVERRUN_ALARM. A
# P99 is the slowest 1 % of the requests: an excess rate above that would set it.
EXCESS_OVERRUNS = 0.01
OVERRUN_ALARM = 2.0
# ... and apart, the overruns past the bound by more than the slack, which a service's own requests
# seldom make and which set a P99 where one request in a hundred does: beyond their own chance rate
# by more than this they add up too, and exposure ends when they reach FAR_OVERRUN_ALARM
EXCESS_FAR_OVERRUNS = 0.005
FAR_OVERRUN_ALARM = 1.0
# chance_rate before any protected request was compared with the bound: one in 32, worth 32 of them
CHANCE_PRIOR = (1, 32)
FAR_CHANCE_PRIOR = 0.125                # ... and of a far one: one in 256
REPORTED = 8192                # busy periods kept for the report (the timeline), the latest of either kind
# How each reported request ran, as the timeline spells it: protected (upper case) or exposed (lower
# case), and in which phase of the protection it ended. (What the gate judges is a busy period: one
# request, or a few whose GPU work ran back to back.) Whether a tail is the exposed requests' or the
# protected ones', and which protected ones: the service's own (P), or those that wait for what lower
# clients queued under an exposure (R, Q).
PHASES = {"W": "protected, warming up", "P": "protected", "Q": "protected, between a probe's exposed requests",
          "R": "protected while exposing (a refresh)", "x": "exposed, a probe's", "e": "exposed while exposing",
          "o": "exposed, ended after its verdict was taken back"}


class _Verdict(NamedTuple):
    """What the latest harmless verdict was judged by: while exposing, the bound and the guard's
    deadline stay at most there, and `lower_quartile` tells a service that got faster."""
    bound_s: float
    guard_deadline_s: float
    lower_quartile_s: float


NO_VERDICT = _Verdict(float("inf"), float("inf"), 0.0)


class Protection:
    def __init__(self, slack=DEFAULT_LATENCY_SLACK):
        if not 0 <= slack <= MAX_LATENCY_SLACK:
            raise ValueError(f"latency slack must be between 0 and {MAX_LATENCY_SLACK:g}, got {slack!r}")
        self.slack = slack
        # the latest protected latencies (s): recent, so a warm-up or an old phase soon leaves them
        self.protected = deque(maxlen=PROTECTED_HISTORY)
        # The requests protected while exposing wait for what lower clients queued under the
        # exposure: they join the history (warm-up stragglers and an old phase age out), but while
        # exposing, the bound and the guard's deadline stay at most where the verdict found them, or
        # the verdict would confirm itself (seen in the simulator at 2b37327: exposed requests at
        # native latency that never overran a bound these requests had raised) ...
        self._verdict_at = NO_VERDICT
        # ... and the latest of them tell whether the service itself got faster since its baseline
        # (`_faster_than_baseline`), which would leave the bound too loose for long
        self.refreshed = deque(maxlen=REFRESH_SAMPLE)
        self._forget_chance()
        self._excess = self._far_excess = 0.0        # the CUSUMs of exposed overruns beyond chance
        self.exposing = False                        # the verdict: lower clients are harmless
        self._probe_left = 0                         # exposed requests still to run in this probe
        self._gap = FIRST_PROBE_GAP
        self._warming_up = BASELINE_REQUESTS         # the first ones warm up (caches, clocks, a queue) ...
        self._until_probe = 2 * BASELINE_REQUESTS         # ... and are not part of the baseline
        self._turn = 0
        self.probes = 0                              # for reports
        self.exposed_requests = 0
        self.overruns = 0
        self.new_baselines = 0
        # (number, phase, latency) of the latest REPORTED requests in the order they ended (PHASES), for
        # reports; numbered from 0 in that order, so a report says where its timeline begins
        self._timeline = deque(maxlen=REPORTED)
        self._ended = 0

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
            if not self._settled():
                return True
            self._probe_left, self._turn = PROBE_REQUESTS, 1
            self.probes += 1
            return False
        return True

    def _settled(self):
        """Whether the service has settled: the older half of the latest BASELINE_REQUESTS protected
        requests is not slower than the newer half, at their 75th percentiles, by WARMING_UP_RATIO. A
        warm-up that outlasts the first BASELINE_REQUESTS leaves stragglers in the baseline that would
        loosen the bound for as long as they stay in the history (a lower client that slowed every
        request 2x stayed exposed for ~15 % of 5,000 requests after 40 requests 3x slow). If not, the
        older ones are dropped and the question is asked again once as many new ones came."""
        latest = list(self.protected)[-BASELINE_REQUESTS:]
        half = BASELINE_REQUESTS // 2
        older, newer = sorted(latest[:half]), sorted(latest[half:])
        if older[3 * half // 4] <= WARMING_UP_RATIO * newer[3 * half // 4]:
            return True
        self.protected = deque(latest[half:], maxlen=PROTECTED_HISTORY)
        self._forget_chance()
        self._until_probe = half
        return False

    def finished(self, protected, latency_s):
        """A request ended (its GPU work completed) `latency_s` after it began."""
        self._timeline.append((self._ended, self._phase(protected), latency_s))
        self._ended += 1
        if protected:
            self._until_probe -= 1
            if self._warming_up:
                self._warming_up -= 1
                return
            if self.exposing:
                # kept current, so that warm-up stragglers and an old phase age out of the baseline;
                # but while exposing the references are capped where the verdict found them (they may
                # fall, never rise: these requests wait for what lower clients queue meanwhile)
                self.refreshed.append(latency_s)
                self.protected.append(latency_s)
                if self._faster_than_baseline():
                    self._new_baseline()
                return
            if self._probe_left:
                # these wait for what the exposed requests between them let lower clients queue:
                # counted in the baseline, they would take the lower clients' harm for the service's
                return
            if len(self.protected) >= BASELINE_REQUESTS:
                bound = self.overrun_bound_s()
                self._compared += 1
                self._beyond += latency_s > bound
                self._far_beyond += latency_s > (1 + self.slack) * bound
            self.protected.append(latency_s)
            return
        self.exposed_requests += 1
        if not (self.exposing or self._probe_left):
            return
        bound = self.overrun_bound_s()
        overran = latency_s > bound
        self.overruns += overran
        if self._probe_left:
            self._probe_left = 0 if overran else self._probe_left - 1
            if not self._probe_left:
                self._verdict(not overran)            # harmless: a probe without an overrun
            return
        far = latency_s > (1 + self.slack) * bound
        self._excess = max(0.0, self._excess + overran - self.chance_rate() - EXCESS_OVERRUNS)
        self._far_excess = max(0.0, self._far_excess + far - self._far_beyond / self._compared
                               - EXCESS_FAR_OVERRUNS)
        if self._excess >= OVERRUN_ALARM or self._far_excess >= FAR_OVERRUN_ALARM:
            self._verdict(False)

    def _phase(self, protected):
        """The request ending now, as PHASES names it (before it changes the state)."""
        if protected:
            return "W" if self._warming_up else "R" if self.exposing else "Q" if self._probe_left else "P"
        return "e" if self.exposing else "x" if self._probe_left else "o"

    def _forget_chance(self):
        """Back to the priors: the protected requests that overran the bound in force, of those
        compared with it, and those that overran it by more than the slack."""
        self._beyond, self._compared = CHANCE_PRIOR
        self._far_beyond = FAR_CHANCE_PRIOR

    def chance_rate(self):
        """How often a protected request overran the bound in force when it ended: how often an
        exposed one may, where lower clients change nothing."""
        return self._beyond / self._compared

    def overrun_bound_s(self):
        """An exposed request that ends later than this overran: slower than the recent protected
        requests but their slowest IGNORED_SHARE, by the slack."""
        bound = (1 + self.slack) * _slowest_counted(self.protected)
        return min(bound, self._verdict_at.bound_s) if self.exposing else bound

    def _faster_than_baseline(self):
        """Every one of the latest REFRESH_SAMPLE requests protected while exposing ended faster than
        the baseline's fastest quarter: the service itself got faster (smaller requests, a warm cache),
        and a lower client could now slow it without an overrun. By chance that happens once in 4**8
        (whatever the service's spread: a comparison of medians with a margin fired several times a
        run for a service with a 15 % spread); for a service twice as fast at a 30 % spread, in two
        of three windows."""
        return (len(self.refreshed) == REFRESH_SAMPLE
                and max(self.refreshed) < self._verdict_at.lower_quartile_s)

    def _new_baseline(self):
        """Forget the stale baseline: protected until a new one is taken, then a probe."""
        self.new_baselines += 1
        self.protected.clear()
        self._forget_chance()
        self._verdict(False)
        self._gap = FIRST_PROBE_GAP
        self._until_probe = BASELINE_REQUESTS

    def guard_deadline_s(self):
        """How long an exposed request runs before the gate protects it after all: past the 90th
        percentile of the protected ones, by the slack. Earlier than the overrun bound, so a request
        that a lower client slows is protected while it can still end within that bound: per request,
        lower clients are held only once they endanger it."""
        if not self.protected:
            return float("inf")
        ordered = sorted(self.protected)
        deadline = (1 + self.slack) * _rank(ordered, 0.9)
        return min(deadline, self._verdict_at.guard_deadline_s) if self.exposing else deadline

    def new_company(self):
        """A lower client joined: a verdict about the others says nothing about it. Protected from
        here on, with a fresh probe after FIRST_PROBE_GAP protected requests (the baseline, the
        service's own latency, still holds)."""
        if self.exposing or self._probe_left or self._gap > FIRST_PROBE_GAP:
            self.exposing, self._probe_left = False, 0
            self._gap = self._until_probe = FIRST_PROBE_GAP
            self._excess = self._far_excess = 0.0
            self.refreshed.clear()

    def _verdict(self, harmless):
        if harmless:
            ordered = sorted(self.protected) or [0.0]
            self._verdict_at = _Verdict(self.overrun_bound_s(), self.guard_deadline_s(),
                                        ordered[len(ordered) // 4])
            self.exposing, self._gap = True, FIRST_PROBE_GAP
        else:                                         # also when an exposure turned harmful: no flapping
            self.exposing = False
            self._gap = min(MAX_PROBE_GAP, self._gap * 4)
            self._until_probe = self._gap
        self._probe_left = 0
        self._excess = self._far_excess = 0.0
        self.refreshed.clear()

    def stats(self):
        # a copy first, made in one C call: the gate's watcher thread may end a request meanwhile, and a
        # deque changed under a Python-level iteration raises
        timeline = list(self._timeline)
        return {"latency_slack": self.slack, "exposing": self.exposing, "probes": self.probes,
                "exposed_requests": self.exposed_requests, "overruns": self.overruns,
                "new_baselines": self.new_baselines,
                # past the warm-up (its first requests take hundreds of ms: lazy set-up, not the service)
                "protected_ms": _summary_ms([t for _, phase, t in timeline if phase.isupper() and phase != "W"]),
                "exposed_ms": _summary_ms([t for _, phase, t in timeline if phase.islower()]),
                "timeline": "".join(phase for _, phase, _ in timeline),
                "timeline_ms": [round(t * 1e3, 3) for _, _, t in timeline],
                "timeline_from": timeline[0][0] if timeline else 0}


def _rank(ordered, q):
    """The value at rank q of sorted samples, as the benchmarks take it (q = 0.99 of 501: the 496th smallest)."""
    return ordered[int(q * (len(ordered) - 1))]


def _summary_ms(latencies_s):
    """{n, p50, p99, max} in ms, or None for none."""
    if not latencies_s:
        return None
    ordered = sorted(latencies_s)

    def ms(q):
        return round(_rank(ordered, q) * 1e3, 3)
    return {"n": len(ordered), "p50": ms(0.5), "p99": ms(0.99), "max": ms(1.0)}


def _slowest_counted(latencies):
    """The slowest of `latencies` but their slowest IGNORED_SHARE (inf: none)."""
    if not latencies:
        return float("inf")
    ordered = sorted(latencies)
    return ordered[len(ordered) - 1 - int(len(ordered) * IGNORED_SHARE)]
