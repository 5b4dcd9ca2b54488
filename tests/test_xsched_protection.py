"""Holding lower clients only while they endanger the higher client's latency (protection.py): the
verdicts from request latencies, how many exposed requests a harmful pair costs, and the gate
acting on them (a lower client that costs nothing is no longer held; one that slows the requests
stays held)."""
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from xsched_lv3.protection import (BASELINE_REQUESTS, FIRST_PROBE_GAP, IGNORED_SHARE, MAX_PROBE_GAP,
                                   PROBE_REQUESTS, REFRESH_EVERY, Protection)
from test_xsched_torch import model, other_client, torch_fake  # noqa: F401 (fixture)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import protection_montecarlo  # noqa: E402  (its synthetic services, for the spread tests)

# a service's request latencies: 2 ms with a spread, as jittery as a real one (deterministic). Its slow
# end (3 requests in 13) is part of the service, not a rare pause: the overrun bound leaves out only the
# slowest IGNORED_SHARE of the recent protected requests, so a slow mode as rare as that would count
# as a pause (see the host-pause test)
JITTER = [0.0, 0.3, -0.2, 0.1, 1.2, -0.1, 0.2, 1.4, -0.3, 0.0, 1.3, -0.2, 0.1]   # odd: both kinds see all


def latency(i, cost_ms=0.0):
    return (2.0 + JITTER[i % len(JITTER)] + cost_ms) / 1000


def run(protection, indices, latency_of):
    """One request for each index i, `latency_of(i, protected)` seconds long. Returns the kinds
    (True: protected)."""
    kinds = []
    for i in indices:
        protected = protection.protect_next()
        protection.finished(protected, latency_of(i, protected))
        kinds.append(protected)
    return kinds


def serve(protection, requests, exposed_cost_ms, start=0):
    """Run `requests` requests; exposed ones take `exposed_cost_ms` longer. Returns the kinds."""
    return run(protection, range(start, start + requests),
               lambda i, protected: latency(i, 0.0 if protected else exposed_cost_ms))


def test_a_harmless_lower_client_is_no_longer_held_after_one_probe():
    p = Protection(0.10)
    kinds = serve(p, 2 * BASELINE_REQUESTS + 2 * PROBE_REQUESTS, exposed_cost_ms=0.05)
    assert all(kinds[:2 * BASELINE_REQUESTS])               # protected while the baseline is taken
    assert p.exposing
    later = serve(p, 80, exposed_cost_ms=0.05, start=len(kinds))
    assert later.count(True) == 80 // REFRESH_EVERY    # one in REFRESH_EVERY still protected (the baseline)


def test_a_lower_client_that_always_hurts_costs_one_exposed_request_a_probe():
    """A lower client whose presence makes every request slower than any protected one (head-of-line
    blocking behind its kernels): each probe ends at its first exposed request, and probes back off."""
    p = Protection(0.10)
    kinds = serve(p, 10_000, exposed_cost_ms=10.0)
    assert not p.exposing
    exposed = [i for i, k in enumerate(kinds) if not k]
    assert len(exposed) == p.probes
    gaps = [b - a for a, b in zip(exposed, exposed[1:])]
    assert gaps == [min(MAX_PROBE_GAP, FIRST_PROBE_GAP * 4 ** k) + 1 for k in range(1, len(gaps) + 1)]
    assert exposed[0] == 2 * BASELINE_REQUESTS
    assert len(exposed) / len(kinds) < 0.001


def test_host_pauses_among_the_protected_requests_do_not_make_a_harmful_lower_client_look_harmless():
    """Seen in the simulator on a jittery 16-CPU host: a 20 ms pause among the protected requests of a
    3 ms service made exposed requests of 23 ms (behind a batch job's kernels) count as harmless, and
    the service ran at native latency. Pauses hit both kinds; up to IGNORED_SHARE of the protected
    requests leave the verdict alone."""
    p = Protection(0.10)
    pauses = 0
    kinds = []
    for i in range(3000):
        protected = p.protect_next()
        pause = i % 16 == 5                       # one request in 16 hits a 20 ms pause, whichever kind
        pauses += pause and protected
        ms = 2.0 + JITTER[i % len(JITTER)] + (20.0 if pause else 0.0) + (0.0 if protected else 18.0)
        p.finished(protected, ms / 1000)
        kinds.append(protected)
    assert pauses and not p.exposing
    assert kinds.count(False) / len(kinds) < 0.01


def test_a_lower_client_that_moves_the_tail_a_little_stays_held_at_under_one_percent_exposed():
    """Exposed requests 1.5 ms slower: their slow third runs past every protected one plus the slack,
    so probes end at once and back off."""
    p = Protection(0.10)
    kinds = serve(p, 10_000, exposed_cost_ms=1.5)
    assert not p.exposing
    assert kinds.count(False) / len(kinds) < 0.01


def test_a_lower_client_that_moves_the_median_but_not_the_tail_is_no_longer_held():
    """Seen on an H100 (a batch job next to a ResNet-18 service): exposure moved the service's median
    by 40 % and its P99 by 6 %. The slack bounds the tail, so this lower client runs on."""
    p = Protection(0.10)
    # typical requests 1 ms slower exposed; the slow ones (host hiccups, not the GPU) no slower
    kinds = serve_shaped(p, 2000, lambda base_ms: base_ms if base_ms > 2.5 else base_ms + 1.0)
    assert p.exposing and p.overruns == 0
    assert kinds.count(False) / len(kinds) > 0.8


def test_a_shift_of_the_tail_within_the_slack_is_harmless_and_beyond_it_is_not():
    slowest = 2.0 + max(JITTER)                          # ms: the slowest protected request
    assert exposed_share(0.10, 0.5 * 0.10 * slowest)[0] > 0.8
    share, overran = exposed_share(0.10, 1.5 * 0.10 * slowest)
    assert share < 0.1 and overran < 0.01                # a P99 (1 % of the requests) not set by overruns
    assert exposed_share(0.30, 1.5 * 0.10 * slowest)[0] > 0.8      # a looser slack accepts it


def test_a_rare_overrun_of_a_harmless_lower_client_does_not_end_the_exposure():
    """One exposed request in 300 beyond every protected one by far (a host hiccup, or a lower client
    that rarely slows a request): too rare to set the P99, exposure goes on; two close together end it."""
    p = Protection(0.10)
    serve(p, 2 * BASELINE_REQUESTS + 2 * PROBE_REQUESTS, exposed_cost_ms=0.0)
    assert p.exposing
    for i in range(3000):
        protected = p.protect_next()
        p.finished(protected, latency(i, 5.0 if not protected and i % 300 == 1 else 0.0))
    assert p.exposing and p.overruns >= 8
    i = 3000
    while p.exposing and i < 3000 + 2 * REFRESH_EVERY:
        protected = p.protect_next()
        p.finished(protected, latency(i, 0.0 if protected else 5.0))
        i += 1
    assert not p.exposing


def test_far_overruns_of_one_request_in_a_hundred_end_the_exposure():
    """The same overruns once in 100 exposed requests: those would be the service's P99 (its slowest
    1 %), so exposure ends, although they never come two within 64 (the rule before 1a7bafd let them)."""
    p = Protection(0.10)
    serve(p, 2 * BASELINE_REQUESTS + 2 * PROBE_REQUESTS, exposed_cost_ms=0.0)
    assert p.exposing
    exposed = 0
    for i in range(1000):
        protected = p.protect_next()
        exposed += not protected
        p.finished(protected, latency(i, 5.0 if not protected and exposed % 100 == 0 else 0.0))
        if not p.exposing:
            break
    assert not p.exposing and exposed <= 300


def lognormal_runs(slowdown, spread=0.15, runs=20, requests=500):
    """`runs` services of `requests` requests whose latencies spread like a real one's (log-normal,
    P99 about 1.4x the median at 0.15), exposed ones `slowdown` times slower, as the Monte Carlo
    script draws them: the share exposed, and the median over the runs of the P99 against the P99
    of the same draws with nothing exposed."""
    results = [protection_montecarlo.run(Protection, protection_montecarlo.slowed(spread, slowdown), requests, seed)
               for seed in range(runs)]
    return sum(share for share, _ in results) / runs, sorted(ratio for _, ratio in results)[runs // 2]


def test_a_lower_client_that_changes_nothing_is_exposed_despite_the_services_own_spread():
    """The service's own spread makes an exposed request overrun now and then by chance, as often as
    a protected one does. Judged against that rate, and by a bound from the latest 128 protected
    requests, exposure lasts: before, the second overrun within 64 exposed requests ended it, and a
    lower client that changed nothing was exposed for a third of such a service's requests (0.34 in
    scripts/protection_montecarlo.py) against 0.57 now, of at most ~0.76."""
    share, p99_ratio = lognormal_runs(1.0)
    assert share > 0.45 and p99_ratio == 1.0


def test_a_lower_client_that_slows_every_request_by_half_stays_held_with_the_services_own_spread():
    """The other side of the rule above: judged against chance, a lower client that does hurt is not
    let through (a rule that exposes too much fails here; strict priority would pass)."""
    share, p99_ratio = lognormal_runs(1.5)
    assert share < 0.03 and p99_ratio < 1.05


def test_a_service_that_gets_faster_while_exposed_takes_its_baseline_again():
    """A baseline taken before the service got twice as fast would let a lower client slow it by half
    without an overrun. The requests still protected while exposing show the change (all eight latest
    below the lower quartile of the baseline the verdict was judged by): the baseline is taken again,
    and the probe after it finds the lower client harmful."""
    p = Protection(0.10)
    serve(p, 2 * BASELINE_REQUESTS + 2 * PROBE_REQUESTS, exposed_cost_ms=0.0)
    assert p.exposing
    # twice as fast from here, and slowed by half exposed
    kinds = run(p, range(1000), lambda i, protected: latency(i) / 2 * (1.0 if protected else 1.5))
    assert not p.exposing
    assert kinds[200:].count(False) / 800 < 0.02               # held again after the new baseline's probe


def test_warm_up_stragglers_do_not_loosen_the_bound_for_good():
    """The first requests of a service are slow (caches, clocks, lazy set-up): the first 32 are not
    part of the baseline, and stragglers after them age out while it exposes. At 23623c9 the bound
    taken at the first probe stayed in force for the whole exposure, so a lower client that slowed
    every request by half was exposed for ~0.8 of 5,000 requests when the first 20 were slow."""
    import math
    import random
    for slow in (8, 20):
        rng, p = random.Random(slow), Protection(0.10)
        kinds = run(p, range(5000), lambda i, protected: math.exp(rng.gauss(0, 0.05)) * (2 if i < slow else 1)
                    * (1 if protected else 1.5))
        assert kinds.count(False) / 5000 < 0.01 and not p.exposing


def test_a_warm_up_longer_than_the_one_skipped_does_not_loosen_the_bound():
    """40 to 60 requests 3x slow at the start: the first 32 are skipped, and the rest would have made
    the baseline's bound (a third review: a lower client that slowed every request 2x then stayed
    exposed for ~15 % of 5,000 requests). The older half of the baseline slower than the newer
    postpones the probe (40, 48); a baseline mostly of stragglers is found stale once the requests
    protected while exposing all end below its lower quartile (56, 60)."""
    import math
    import random
    for slow in (40, 48, 56, 60):
        rng, p = random.Random(slow), Protection(0.10)
        kinds = run(p, range(5000), lambda i, protected: math.exp(rng.gauss(0, 0.15)) * (3 if i < slow else 1)
                    * (1 if protected else 2))
        assert kinds.count(False) / 5000 < 0.03 and not p.exposing, slow


def test_a_steady_service_is_not_taken_for_one_that_got_faster():
    """Only a service that really got faster takes a new baseline: a median of eight compared with a
    margin did so several times a run at a 15 % spread; all eight below the baseline's fastest
    quarter happens by chance once in 4**8."""
    import math
    import random
    for spread in (0.15, 0.3):
        rng, p = random.Random(1), Protection(0.10)
        run(p, range(5000), lambda i, protected: math.exp(rng.gauss(0, spread)))
        assert p.stats()["new_baselines"] == 0


def test_the_guard_fires_before_the_bound_whatever_the_history():
    """The guard protects an exposed request while it can still end within the overrun bound: its
    deadline stays below the bound through exposures, new baselines and outliers."""
    import random
    rng = random.Random(5)
    for harm in (1, 3):                                        # a lower client harmless, or now and then not
        p = Protection(0.10)
        for i in range(3000):
            protected = p.protect_next()
            scale = 1.0 if (i // 700) % 2 == 0 else 0.8        # the service changes speed now and then
            slowed = 1 if protected else rng.choice([1, 1, 1, harm])
            p.finished(protected, scale * rng.lognormvariate(0, 0.1) * slowed)
            if len(p.protected) >= BASELINE_REQUESTS:
                assert p.guard_deadline_s() <= p.overrun_bound_s()


def test_requests_protected_while_exposing_cannot_make_the_verdict_confirm_itself():
    """Once exposed, lower clients queue more (a wider window), so the requests still protected for the
    comparison wait for that too (10 ms here). Were they counted as they are, they would raise the bound
    within a few dozen requests, and the exposed requests that the lower clients now slow (4 ms, one in
    30) would never overrun it: the exposure would confirm itself. They may not raise it: it ends."""
    p = Protection(0.10)
    serve(p, 2 * BASELINE_REQUESTS + 2 * PROBE_REQUESTS, exposed_cost_ms=0.0)
    assert p.exposing
    verdicts, exposed = [], 0
    for i in range(192):
        protected = p.protect_next()
        exposed += not protected
        cost_ms = 10.0 if protected else (4.0 if exposed % 30 == 0 else 0.0)
        p.finished(protected, latency(i, cost_ms))
        verdicts.append(p.exposing)
    assert not all(verdicts)


def test_an_exposed_request_is_guarded_before_it_could_overrun():
    """The gate protects an exposed request at the protected 90th percentile plus the slack: earlier
    than the bound past which it overruns, so it can still end within the protected range."""
    p = Protection(0.10)
    serve(p, 2 * BASELINE_REQUESTS, exposed_cost_ms=0.0)
    ordered = sorted(p.protected)
    assert p.guard_deadline_s() == pytest.approx(1.1 * ordered[int(0.9 * (len(ordered) - 1))])
    assert p.guard_deadline_s() < p.overrun_bound_s() == pytest.approx(1.1 * ordered[-1 - int(len(ordered) * IGNORED_SHARE)])


def serve_shaped(protection, requests, exposed_ms):
    """Like serve(), with exposed latencies `exposed_ms(protected latency in ms)`."""
    return run(protection, range(requests),
               lambda i, protected: latency(i) if protected else exposed_ms(latency(i) * 1000) / 1000)


def exposed_share(slack, cost_ms):
    """The share of requests exposed, and of requests that overran."""
    p = Protection(slack)
    kinds = serve(p, 5000, exposed_cost_ms=cost_ms)
    return kinds.count(False) / len(kinds), p.overruns / len(kinds)


def test_slack_zero_is_strict_priority():
    p = Protection(0)
    assert all(serve(p, 500, exposed_cost_ms=0.0))


@pytest.mark.parametrize("slack", [-0.1, float("nan"), float("inf")])
def test_a_bad_slack_is_refused(slack):
    with pytest.raises(ValueError, match="latency slack"):
        Protection(slack)


def _requests(xt, torch, gpu, gate_priority, n, layers=4, kernel_s=0.0005, interference=None, latency_slack=0.1):
    """`n` requests of a service, one at a time; `interference()`: extra seconds a launch takes now."""
    class Launching(torch.nn.Module):
        """A leaf that takes CPU time before its kernel, as a real launch-bound service does."""
        def forward(self, x):
            time.sleep(0.0005 + (interference() if interference else 0.0))
            gpu.launch(self.name, self.kernel_s)
            return x
    m = torch.nn.Module(*[Launching(kernel_s=kernel_s, name=f"hp{i}") for i in range(layers)])
    active_seen = 0
    with xt.client(priority=gate_priority, latency_slack=latency_slack) as gate:
        for _ in range(n):
            m(None)
            active_seen += gate.board.read_slot(gate.slot)[2]
            deadline = time.monotonic() + 1
            while gate._busy_since is not None and time.monotonic() < deadline:
                time.sleep(0.0005)          # the watcher ends the request: one at a time, like a service
        stats = gate.stats()
        stats["exposing_on_board"] = bool(gate.board.read_slot(gate.slot).exposing)
    return active_seen, stats


def test_an_idle_lower_client_stops_being_held_once_the_probe_shows_it_costs_nothing(torch_fake):
    torch, gpu, xt = torch_fake
    lp = other_client(xt, priority=0)           # registered, launches nothing: exposure costs the service nothing
    n = 2 * BASELINE_REQUESTS + 2 * PROBE_REQUESTS + 40
    # requests of ~20 ms and a wide slack: a loaded CI host's scheduling noise stays below it
    active_seen, stats = _requests(xt, torch, gpu, 10, n, kernel_s=0.005, latency_slack=0.5)
    assert stats["probes"] == 1
    # exposed from the probe on, but for one in REFRESH_EVERY (the comparison), unless overruns (host
    # pauses) came closer together than the protected requests' own rate of them
    assert stats["exposed_requests"] >= PROBE_REQUESTS + 10, stats
    assert active_seen <= n - stats["exposed_requests"] + 1
    assert stats["exposing_on_board"] == stats["exposing"]     # what lower clients size their window by
    lp.close()


def test_a_lower_client_that_joins_ends_the_exposure_its_predecessors_earned(torch_fake):
    """The verdict is about the lower clients that were there: a new one is held (and its window not
    widened) until a probe of its own; one that leaves changes nothing."""
    torch, gpu, xt = torch_fake
    first = other_client(xt, priority=0)
    hp = other_client(xt, priority=10)
    assert hp.tracking
    for _ in range(BASELINE_REQUESTS):
        hp.protection.finished(True, 0.002)
    hp.protection._verdict(True)                     # as a probe without an overrun would
    hp._exposing = True
    hp.board.write(hp.slot, exposing=1)
    second = other_client(xt, priority=0)            # joins
    hp.check()
    assert not hp.protection.exposing and hp.board.read_slot(hp.slot).exposing == 0
    assert hp.protection.protect_next()              # protected until a probe of its own
    hp.protection._verdict(True)
    second.close()                                   # leaves: the others' verdict stands
    hp.check()
    assert hp.protection.exposing
    for gate in (first, hp):
        gate.close()


def test_a_lower_clients_window_is_wider_while_every_client_above_it_exposes(torch_fake):
    """The wider window (window.EXPOSED_WINDOW_SCALE) holds only while *every* higher-priority client
    on the device runs its requests beside it; one that protects its requests brings the bound back."""
    torch, gpu, xt = torch_fake
    from xsched_lv3.gate import Gate
    from xsched_lv3.window import DEFAULT_WINDOW_US, EXPOSED_WINDOW_SCALE
    hp = other_client(xt, priority=10)
    lp = Gate(xt.TorchRecorder(), 0)
    assert lp.guarded and lp.window.window_us == DEFAULT_WINDOW_US
    hp.board.write(hp.slot, exposing=1)
    lp.check()
    assert lp.window.window_us == DEFAULT_WINDOW_US * EXPOSED_WINDOW_SCALE
    second = other_client(xt, priority=5)           # above it too, and protecting its requests
    lp.check()
    assert lp.window.window_us == DEFAULT_WINDOW_US
    second.close()
    lp.check()
    assert lp.window.window_us == DEFAULT_WINDOW_US * EXPOSED_WINDOW_SCALE
    hp.board.write(hp.slot, exposing=0)
    lp.check()
    assert lp.window.window_us == DEFAULT_WINDOW_US
    for gate in (lp, hp):
        gate.close()


@contextmanager
def interfering_lower_client(xt, torch, slowdown_s):
    """A lower-priority client running back to back in a thread; yields `interference()`: how much
    slower each launch of the service is right now (`slowdown_s` while that client may run, as on a
    GPU the two share)."""
    stop = threading.Event()
    lp_model = model(torch, "lp", 5, 0.0001)
    lp_gate = {}

    def lp():
        with xt.client(priority=0) as gate:
            lp_gate["gate"] = gate
            while not stop.is_set():
                lp_model(None)
                torch.cuda.Stream().synchronize()

    def interference():
        gate = lp_gate.get("gate")
        return slowdown_s if gate is not None and gate._may_run else 0.0
    t = threading.Thread(target=lp)
    t.start()
    try:
        time.sleep(0.05)
        yield interference
    finally:
        stop.set()
        t.join()


def test_a_lower_client_that_slows_the_requests_stays_held(torch_fake):
    """Each launch of the service 20 ms slower while the LP may run. An exposed request that starts while
    the LP still runs overruns (the guard cannot undo a launch under way); one that starts while the LP is
    still held is guarded in time and does not. Either way the service's tail is not left to overruns
    (at most two): the run ends held after one or two, or, where the guard caught every exposed request
    in time (none overran), exposure is the verdict and costs the service nothing."""
    torch, gpu, xt = torch_fake
    n = 2 * BASELINE_REQUESTS + 2 * PROBE_REQUESTS + 60
    with interfering_lower_client(xt, torch, 0.020) as interference:
        active_seen, stats = _requests(xt, torch, gpu, 10, n, interference=interference)
    assert stats["probes"] == 1 and stats["overruns"] <= 2, stats   # not left to overruns
    if stats["overruns"]:
        assert not stats["exposing"] and stats["exposed_requests"] < n // 4, stats
    else:
        assert stats["exposing"], stats               # every exposed request was guarded in time


def test_a_harmful_exposed_request_is_protected_once_it_runs_past_the_slowest_protected_one(torch_fake, monkeypatch):
    """Where a lower client's work blocks the service's, one exposed request would take as long as
    that work: the gate protects it once it runs past the recent protected maximum plus the slack."""
    torch, gpu, xt = torch_fake
    from xsched_lv3.protection import Protection
    latencies = []
    original = Protection.finished

    def recording(self, protected, latency_s):
        latencies.append((protected, latency_s))
        return original(self, protected, latency_s)
    monkeypatch.setattr(Protection, "finished", recording)
    # each launch 20 ms slower while the LP runs: an exposed request would take ~160 ms
    with interfering_lower_client(xt, torch, 0.020) as interference:
        _, stats = _requests(xt, torch, gpu, 10, 2 * BASELINE_REQUESTS + 2 * PROBE_REQUESTS, layers=8,
                             interference=interference)
    protected_max = max(lat for protected, lat in latencies if protected)
    exposed = [lat for protected, lat in latencies if not protected]
    assert len(exposed) == 1 == stats["overruns"] and not stats["exposing"], stats   # the probe ends there
    # each cut at (1 + slack) x the protected maximum, plus the launch under way when the LP was held
    assert max(exposed) < 1.1 * protected_max + 0.030, (exposed, protected_max)


def _bursts(xt, torch, gpu, bursts, calls, gap_s, between_s, kernel_s=0.001):
    """A service whose request is `calls` model calls (a text generation: one call per token), each
    after a CPU gap of `gap_s`; requests `between_s` apart. Returns (the board's active flag seen as
    each call began, one list per request; the gate's stats)."""
    m = model(torch, "tok", 2, kernel_s / 2)
    seen = []
    with xt.client(priority=10) as gate:
        for _ in range(bursts):
            flags = []
            for _ in range(calls):
                flags.append(gate.board.read_slot(gate.slot)[2])
                m(None)
                torch.cuda.Stream().synchronize()      # its token on the CPU side
                time.sleep(gap_s)
            seen.append(flags)
            time.sleep(between_s)
        stats = gate.stats()
    return seen, stats


def test_a_service_that_comes_straight_back_keeps_its_busy_period_across_the_gaps(torch_fake, monkeypatch):
    """Seen on an H200: a GPT-2 service generating 8 tokens a request (a model call per token, a moment
    of CPU work between) marked itself idle after every call. The batch job next to it slipped work in
    ahead of each next call, and the protection judged single calls, whose slack a co-running batch
    job's kernels exceed more often than the whole request's (presumably: calls were not timed one by
    one): its probes failed, and the batch job was held 31-34 s of ~101 at 0.62-0.67 of its speed, while
    running both unscheduled cost the service P99 1.01x and 1.11x in two runs. Its busy period now
    spans the gaps: one period a request, held throughout."""
    torch, gpu, xt = torch_fake
    import xsched_lv3.gate
    # a release priced at 10 ms, not 1: a loaded CI host's scheduling delays make some 0.1 ms gaps longer
    # than 1 ms, and the rule then (rightly) stops keeping them open
    monkeypatch.setattr(xsched_lv3.gate, "RELEASE_COST_S", 0.010)
    lp = other_client(xt, priority=0)              # the service tracks its requests for it
    seen, stats = _bursts(xt, torch, gpu, bursts=12, calls=8, gap_s=0.0001, between_s=0.060)
    lp.close()
    assert stats["requests"] == 12 * 8
    assert stats["busy_periods"] <= 12 * 2, stats          # one a request (a host hiccup may split one)
    later_calls = [flag for flags in seen for flag in flags[1:]]
    assert sum(later_calls) >= 0.8 * len(later_calls)      # lower clients held through the gaps


def test_requests_far_apart_are_busy_periods_of_their_own(torch_fake):
    """Gaps longer than a release costs: lower clients run in them (released once the requests'
    work is done), and each request is judged by itself."""
    torch, gpu, xt = torch_fake
    lp = other_client(xt, priority=0)
    seen, stats = _bursts(xt, torch, gpu, bursts=20, calls=1, gap_s=0.0, between_s=0.020)
    lp.close()
    assert stats["busy_periods"] == stats["requests"] == 20
    assert sum(flags[0] for flags in seen[1:]) <= 2        # idle again when the next one begins


def test_a_client_that_never_pauses_is_still_judged_in_periods_of_bounded_length(torch_fake, monkeypatch):
    """Found in review: a job in a loop (or a service with a standing queue) that tracks for a lower
    client comes straight back every time, so its busy period never ended: no latency was ever judged
    and the lower client was held for the whole run. A period kept open ends at the first gap after
    KEPT_OPEN_MAX_S."""
    torch, gpu, xt = torch_fake
    import xsched_lv3.gate
    monkeypatch.setattr(xsched_lv3.gate, "KEPT_OPEN_MAX_S", 0.100)
    monkeypatch.setattr(xsched_lv3.gate, "RELEASE_COST_S", 0.010)     # every gap kept open, on a loaded host too
    lp = other_client(xt, priority=0)
    seen, stats = _bursts(xt, torch, gpu, bursts=1, calls=200, gap_s=0.0001, between_s=0.0, kernel_s=0.002)
    lp.close()
    # at least 0.4 s of calls (200 of 2 ms): periods of 100 ms or a little more, not one
    assert 3 <= stats["busy_periods"] <= 200 // 3, stats


def test_the_exposure_guard_does_not_hold_lower_clients_in_a_gap_kept_open(torch_fake, monkeypatch):
    """Found in review: an exposed period whose guard deadline fell in the gap kept open after its work
    marked the service active with nothing open and its GPU idle (lower clients held, at Lv3 suspended,
    for nothing). It is protected from its next request on instead."""
    torch, gpu, xt = torch_fake
    import xsched_lv3.gate
    # times long enough that even a loaded host's watcher sees the work done before the deadline (a
    # guard that fires while the work is not yet seen done protects the request, rightly)
    monkeypatch.setattr(xsched_lv3.gate, "RELEASE_COST_S", 0.200)
    lp = other_client(xt, priority=0)
    hp = other_client(xt, priority=10)
    monkeypatch.setattr(hp.protection, "protect_next", lambda: False)       # exposed (a probe, or harmless)
    monkeypatch.setattr(hp.protection, "guard_deadline_s", lambda: 0.050)
    hp.begin_request()
    torch.nn.Module(kernel_s=0.0, name="k")(None)
    hp.end_request()
    t0 = time.monotonic()
    flags = []
    while time.monotonic() - t0 < 0.150:          # the guard fires, the gap stays open (RELEASE_COST_S)
        flags.append(hp.board.read_slot(hp.slot)[2])
        time.sleep(0.0005)
    assert not any(flags), flags.count(1)
    assert hp._protecting or hp._busy_since is None         # guarded from its next request, or ended
    hp.close()
    lp.close()


def test_a_request_that_begins_before_the_last_ones_work_is_done_counts_as_no_gap(torch_fake):
    """The rule's history of gaps must see a client that comes straight back even when it beats the
    watcher: otherwise only the gaps long enough for the watcher to see the work done are counted, and
    the rule leans towards releasing."""
    torch, gpu, xt = torch_fake
    lp = other_client(xt, priority=0)
    with xt.client(priority=10) as gate:
        m = model(torch, "k", 1, 0.020)                # 20 ms of GPU work: still running at the next call
        m(None)
        m(None)
        assert list(gate._gaps) == [0.0]
    lp.close()


def test_the_report_splits_request_latencies_into_protected_and_exposed():
    """`XSCHED_LV3_REPORT` and the benchmarks' results carry each kind's P50 / P99 / max, so that a
    service's tail can be told apart: its exposed requests' or its protected ones' (past the warm-up,
    whose first requests are set-up, not service)."""
    p = Protection()
    assert p.stats()["protected_ms"] is None and p.stats()["exposed_ms"] is None
    for _ in range(BASELINE_REQUESTS):
        p.finished(True, 0.300)                         # the warm-up: lazy set-up, not the service's latency
    for i in range(101):
        p.finished(True, 0.001 * (i + 1))               # 1 .. 101 ms
    p.finished(False, 0.250)
    stats = p.stats()
    assert stats["protected_ms"] == {"n": 101, "p50": 51.0, "p99": 100.0, "max": 101.0}
    assert stats["exposed_ms"] == {"n": 1, "p50": 250.0, "p99": 250.0, "max": 250.0}


def test_the_report_keeps_each_request_in_order_with_the_phase_it_ran_in():
    """The timeline: which requests were protected or exposed, when, and in which phase (warming up,
    the baseline, a probe, an exposure and its refreshes), each with its latency, so a slow protected
    request can be told from one that waited for what an exposure let lower clients queue."""
    p = Protection(0.10)
    kinds = serve(p, 2 * BASELINE_REQUESTS + 2 * PROBE_REQUESTS + 2 * REFRESH_EVERY, exposed_cost_ms=0.05)
    timeline, latencies = p.stats()["timeline"], p.stats()["timeline_ms"]
    assert len(timeline) == len(latencies) == len(kinds)
    assert [phase.isupper() for phase in timeline] == kinds
    assert timeline.startswith("W" * BASELINE_REQUESTS + "P" * BASELINE_REQUESTS)
    probe_ends = 2 * BASELINE_REQUESTS + 2 * PROBE_REQUESTS - 1     # its last exposed request passed it
    assert timeline[2 * BASELINE_REQUESTS:probe_ends] == "xQ" * (PROBE_REQUESTS - 1) + "x"
    exposure = timeline[probe_ends:]
    assert set(exposure) == {"e", "R"} and exposure.count("R") == -(-len(exposure) // REFRESH_EVERY)
    assert latencies[0] == pytest.approx(latency(0) * 1e3)
    assert latencies[2 * BASELINE_REQUESTS] == pytest.approx(latency(2 * BASELINE_REQUESTS, 0.05) * 1e3)


def test_the_timeline_keeps_the_latest_requests_and_says_where_it_begins(monkeypatch):
    import xsched_lv3.protection as protection
    monkeypatch.setattr(protection, "REPORTED", 50)
    p = Protection(0.10)
    serve(p, 2 * BASELINE_REQUESTS + 10, exposed_cost_ms=0.05)
    stats = p.stats()
    assert len(stats["timeline"]) == len(stats["timeline_ms"]) == 50
    assert stats["timeline_from"] == 2 * BASELINE_REQUESTS + 10 - 50
    assert stats["timeline"].startswith("W" * (BASELINE_REQUESTS - stats["timeline_from"]) + "P")


def test_an_exposed_request_that_ends_after_its_probe_failed_is_labelled_so():
    """Requests overlap (a service with several threads): one exposed request's overrun ends the probe
    while another exposed one is still running; that one ends under no probe and no exposure ("o")."""
    p = Protection(0.10)
    serve(p, 2 * BASELINE_REQUESTS, exposed_cost_ms=0.0)
    assert [p.protect_next(), p.protect_next(), p.protect_next()] == [False, True, False]   # x, Q, x begun
    p.finished(False, 1.0)                    # the first exposed one overran: the probe fails
    p.finished(True, latency(0))
    p.finished(False, latency(1))
    assert p.stats()["timeline"][-3:] == "xPo"


def test_a_report_taken_while_requests_end_on_another_thread_never_fails():
    """The gate's watcher thread ends busy periods while a report is written (`XSCHED_LV3_REPORT` at
    exit, a benchmark's thread): a report is a consistent copy, never 'deque mutated during iteration'."""
    p = Protection(0.10)
    stop = threading.Event()

    def end_requests():
        while not stop.is_set():
            p.finished(p.protect_next(), 0.002)
    worker = threading.Thread(target=end_requests)
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)               # hand the GIL over as often as the interpreter allows
    worker.start()
    try:
        for _ in range(200):
            stats = p.stats()
            assert len(stats["timeline"]) == len(stats["timeline_ms"])
    finally:
        stop.set()
        worker.join()
        sys.setswitchinterval(previous)


def test_a_replay_of_recorded_latencies_reproduces_the_services_verdicts(tmp_path):
    """scripts/protection_replay.py: the latencies a results file recorded, fed to this tree's rule
    after as many unrecorded warm-up periods as the gate reported, give its probes and exposures."""
    import json
    import subprocess
    p = Protection(0.10)
    kinds = serve(p, 20 + 300, exposed_cost_ms=0.05)          # 20 before the benchmark counted any
    recorded = [round(latency(i, 0.0 if protected else 0.05) * 1e3, 3) for i, protected in enumerate(kinds)][20:]
    gate = {"latency_slack": 0.10, "probes": p.probes, "exposed_requests": p.exposed_requests,
            "protected_ms": {"n": kinds.count(True)}, "exposed_ms": {"n": kinds.count(False)}}
    results = tmp_path / "r.json"
    results.write_text(json.dumps({"rows": [{"pair": "a", "variant": "xsched", "hp_latencies_ms": recorded,
                                             "hp_gate": gate}]}))
    out = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[1] / "scripts" / "protection_replay.py"),
                          str(results)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert p.probes >= 1 and f"replay: {p.probes} probes, {p.exposed_requests} exposed; recorded: " \
        f"{p.probes}, {p.exposed_requests}\n" in out.stdout and "exposing" in out.stdout
    results.write_text("[1, 2]")                                # not a results file: one line, no traceback
    bad = subprocess.run(out.args, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "not a bench_two_models results file" in bad.stderr and "Traceback" not in bad.stderr
