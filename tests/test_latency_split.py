"""scripts/latency_split.py: a service's latency in three parts (late start, launching, GPU wait),
and under the scheduler its protected requests apart from its exposed ones, where the gate's
timeline lines up with the service's requests."""
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import latency_split  # noqa: E402


def xsched_row(letters, timeline_ms=None):
    lat = [3.0, 3.2, 9.0, 3.1]
    late = [0.1, 0.1, 0.2, 0.1]
    wait = [0.1, 0.2, 2.5, 0.1]
    own = [round(a - b, 3) for a, b in zip(lat, late)]
    return {"pair": "p", "variant": "xsched", "hp_latencies_ms": lat, "hp_wake_late_ms": late, "hp_gpu_wait_ms": wait,
            "hp_gate": {"timeline": "WW" + letters, "timeline_ms": [400.0, 3.0] + (timeline_ms or own)}}


def test_protected_and_exposed_requests_are_told_apart_and_each_latency_is_split_in_three():
    groups = dict(latency_split.groups(xsched_row("PPeP")))
    assert set(groups) == {"xsched", "xsched, protected", "xsched, exposed"}
    assert groups["xsched, exposed"] == [(9.0, 9.0 - 0.2 - 2.5, 2.5)]      # launching = latency - late - wait
    assert [r[0] for r in groups["xsched, protected"]] == [3.0, 3.2, 3.1]


def test_a_timeline_that_does_not_line_up_with_the_requests_is_not_used_to_split_them():
    row = xsched_row("PPeP", timeline_ms=[3.0, 9.0, 3.2, 3.1])      # a merged busy period shifted them
    assert [name for name, _ in latency_split.groups(row)] == ["xsched"]
    assert latency_split.groups({k: v for k, v in row.items() if k != "hp_gpu_wait_ms"}) == []


def test_the_table_names_its_results_and_bad_files_get_one_line(tmp_path):
    doc = {"git_revision": "abcdef1234", "card": "GPU X", "cpu_count": 16,
           "rows": [xsched_row("PPeP"), {"pair": "p", "variant": "lp-alone"}]}
    path = tmp_path / "bench_two_models_x.json"
    path.write_text(json.dumps(doc))
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "latency_split.py"), "--table", str(path)],
                         capture_output=True, text=True, check=True).stdout
    assert "| x, p | xsched, exposed | 1 | 9.00 / 9.00 | 6.30 / 6.30 | 2.50 / 2.50 |" in out
    assert "GPU X; revisions abcdef1; 16 CPUs" in out
    bad = subprocess.run([sys.executable, str(REPO / "scripts" / "latency_split.py"), "--table", str(tmp_path / "none")],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "cannot read the results" in bad.stderr and "Traceback" not in bad.stderr
