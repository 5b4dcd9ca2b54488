"""What `xsched-lv3 run` hands its child: the scheduling options as environment variables (written
by the CLI, read here), and the process-wide gate a framework integration builds from them."""
import atexit
import json
import os
import sys

from .gate import PROCESS_SPIN_S, Gate
from .protection import DEFAULT_LATENCY_SLACK
from .window import DEFAULT_WINDOW_US

HINT_VARIABLES = {"XSCHED_LV3_UTILIZATION": "utilization", "XSCHED_LV3_DEADLINE_US": "deadline_us",
                  "XSCHED_LV3_LAXITY_US": "laxity_us"}


def process_gate(recorder):
    """The gate of a process started by `xsched-lv3 run` (every thread one client), or None, said
    once on stderr, where it cannot be scheduled: a framework's import never fails over scheduling."""
    hints = {name: float(os.environ[var]) for var, name in HINT_VARIABLES.items() if os.environ.get(var)}
    window = os.environ.get("XSCHED_LV3_WINDOW_US")
    slack = os.environ.get("XSCHED_LV3_LATENCY_SLACK")
    try:
        gate = Gate(recorder, int(os.environ.get("XSCHED_LV3_PRIORITY", "0")), os.environ.get("XSCHED_LV3_POLICY", "hpf"),
                    DEFAULT_WINDOW_US if window is None else float(window) or None, spin_s=PROCESS_SPIN_S,
                    whole_process=True, latency_slack=DEFAULT_LATENCY_SLACK if slack is None else float(slack),
                    **hints)
    except (OSError, ValueError, RuntimeError) as e:    # board unusable or full (`run` checked it before)
        _say(f"xsched-lv3: cannot schedule this process ({e}); running unscheduled")
        return None
    atexit.register(gate.close)              # its slot goes with it, after the report (atexit is LIFO)
    if os.environ.get("XSCHED_LV3_REPORT"):
        atexit.register(_write_report, os.environ["XSCHED_LV3_REPORT"], gate, os.getpid())
    return gate


def report(gate):
    """A client's scheduling stats and which xsched_lv3 scheduled it (benchmarks comparing two trees
    check it)."""
    return {**gate.stats(), "package": os.path.dirname(os.path.abspath(__file__))}


def _write_report(path, gate, pid):
    """XSCHED_LV3_REPORT=FILE: the process's `report` as JSON when it exits (not a forked child's)."""
    if os.getpid() != pid:
        return
    try:
        with open(path, "w") as f:
            json.dump(report(gate), f)
    except OSError as e:
        _say(f"xsched-lv3: cannot write report {path}: {e}")


def _say(line):
    """One line on the program's stderr; none where it has none (print would write it to stdout)."""
    if sys.stderr is not None:
        print(line, file=sys.stderr)
