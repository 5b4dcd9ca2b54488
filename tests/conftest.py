import faulthandler
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The slowest test takes about 2 s; one that runs past this is stuck (a simulator that never
# answers, a read that never returns) and fails, so that the suite cannot hang.
TEST_TIME_LIMIT_S = float(os.environ.get("KFDTOOL_TEST_TIME_LIMIT_S", 60))
# Where even that cannot interrupt it (stuck inside C code), every thread's stack is dumped and the
# run ends; the simulators it started exit with it (below).
HARD_TIME_LIMIT_S = TEST_TIME_LIMIT_S + 30


def pytest_configure(config):
    # Every simulator started from this run (runner.start, `kfdtool sim start`, the server
    # fixtures) stops when this process exits: a run that is killed leaves no server behind.
    os.environ["KFDTOOL_SIM_EXIT_WITH"] = str(os.getpid())
    # Hold records of the preemptions tests make go to a directory of this run, never to the
    # user's (or, as root, the system's /run/kfdtool), where `kfdtool queues` would read them.
    import tempfile
    os.environ["KFDTOOL_RUN_DIR"] = tempfile.mkdtemp(prefix="kfdtool-test-run-")


@pytest.fixture(autouse=True)
def time_limit(request):
    """Fail a test that runs past TEST_TIME_LIMIT_S, with the stack it was stuck in."""
    if threading.current_thread() is not threading.main_thread():     # signals reach only the main thread
        yield
        return

    def expired(signum, frame):
        pytest.fail(f"{request.node.nodeid} ran past its time limit of {TEST_TIME_LIMIT_S:g} s "
                    f"(KFDTOOL_TEST_TIME_LIMIT_S)", pytrace=True)

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, TEST_TIME_LIMIT_S)
    faulthandler.dump_traceback_later(HARD_TIME_LIMIT_S, exit=True)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        faulthandler.cancel_dump_traceback_later()
SHARED_FIXTURES = REPO.parent / "shared" / "fixtures" / "kfd-topology"
CAPTURES = ["k8sdp-mi210-8x-xgmi", "k8sdp-mi300x-8x-cpx", "k8sdp-mi308x-8x-cpx", "k8sdp-vega10-1gpu",
            "rocprofsdk-composite", "tinygrad-rx7900xtx-partial"]


def make_root(tmp, capture):
    """A sysfs root whose class/kfd/kfd/topology is the capture: the shared copy where this
    checkout has ../shared, else the byte-identical copy shipped in the package."""
    root = Path(tmp) / capture
    kfd = root / "class" / "kfd" / "kfd"
    kfd.mkdir(parents=True)
    shared = SHARED_FIXTURES / capture
    if shared.is_dir():
        (kfd / "topology").symlink_to(shared)
    else:
        from kfdtool.sim.machine import extract_capture
        extract_capture(capture, kfd / "topology")
    return root


@pytest.fixture
def capture_root(tmp_path):
    return lambda capture: make_root(tmp_path, capture)


def run_cli(*args, env=None, timeout=60):
    """Run kfdtool as a user does, in a subprocess."""
    full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
    return subprocess.run([sys.executable, "-m", "kfdtool", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout)


@pytest.fixture(scope="module")
def sim(sim_dir):
    """A simulated mi308x for a module's kernel-rule tests (a module may define its own)."""
    from simhelpers import start
    return start("mi308x")


@pytest.fixture
def client(sim):
    """A KFD process of the test's own: this process, through the simulator's client."""
    from simhelpers import Client
    cl = Client(sim)
    yield cl
    cl.close()


@pytest.fixture(scope="session")
def sim_dir(tmp_path_factory):
    """A private KFDTOOL_SIM_DIR for the session; stops every simulator started in it at the end."""
    d = tmp_path_factory.mktemp("sims")
    old = os.environ.get("KFDTOOL_SIM_DIR")
    os.environ["KFDTOOL_SIM_DIR"] = str(d)
    yield d
    from kfdtool.sim import runner
    for machine_dir in d.iterdir():
        if (machine_dir / "kfd.sock").exists():
            try:
                runner.stop(machine_dir.name)
            except Exception:
                pass
    if old is None:
        os.environ.pop("KFDTOOL_SIM_DIR", None)
    else:
        os.environ["KFDTOOL_SIM_DIR"] = old


@pytest.fixture(scope="module")
def composite_612(sim_dir):
    """The composite machine (MES, per-VMID and older GPUs side by side) under the 6.12 profile,
    stopped after the module: other tests start it with another ABI."""
    from kfdtool.sim import runner
    from simhelpers import start
    yield start("composite", "1.17")
    runner.stop("composite")
