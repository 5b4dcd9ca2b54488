"""scripts/probes/corun_timeline.py: where a batch job's GPU time goes next to a service, from the
two processes' GPU timelines (its busy share during the service's requests and between them)."""
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "scripts" / "probes"), str(REPO / "scripts")]
import corun_timeline  # noqa: E402


def test_the_batch_jobs_gpu_time_splits_into_requests_and_the_time_between():
    # its kernels: 0-1, 1.5-3, 3.2-5, 6-10 s; the service's requests 2-4 and 7-8 s (and one inside another)
    lp = corun_timeline.Work({"work": [[0, 1, 0, "k"], [1.5, 3, 0, "k"], [3.2, 5, 0, "k"], [6, 10, 0, "k"]]})
    busy = corun_timeline.lp_busy(lp, [(2, 4), (7, 8), (7.2, 7.5)], 0, 10)
    assert busy["requests_share"] == 0.3
    assert busy["in_requests"] == round(2.8 / 3, 4)           # 2-3, 3.2-4 and 7-8 of 3 s
    assert busy["between"] == round(5.5 / 7, 4)               # 0-1, 1.5-2, 4-5, 6-7, 8-10 of 7 s
    # the gaps 1-1.5 and 5-6 lie between requests; 3-3.2 lies inside one and is the scheduler's, not counted
    assert busy["gaps_between_per_s"] == 0.2
    assert busy["gap_total_share"] == round(1.5 / 7, 4)


def test_a_batch_job_that_never_idles_between_requests_shows_no_gaps():
    lp = corun_timeline.Work({"work": [[0, 2, 0, "k"], [2, 4, 0, "k"], [4, 10, 0, "k"]]})
    busy = corun_timeline.lp_busy(lp, [(3, 5)], 0, 10)
    assert busy["between"] == 1.0 and busy["in_requests"] == 1.0
    assert busy["gap_ms"] is None and busy["gaps_between_per_s"] == 0.0
