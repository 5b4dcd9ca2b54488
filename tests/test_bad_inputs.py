"""The bad-input sweep, kept: every one of these ends as a usage error (exit 2, argparse's `error:`
line) or one clear line on stderr with exit 1; never a traceback, never a hang, and nothing is
written outside the run's own directories. Table-driven: add a row for every new way to hold a
command wrong."""
import os
import subprocess
import sys

import pytest

from simhelpers import start

U, E = 2, 1          # usage error (argparse), error (one line)
NOT_FOUND, CANNOT_RUN = 127, 126    # `run`'s command, as env(1) answers (one line too)
K = ["kfdtool"]
S = ["kfdtool", "--sim", "mi308x"]
X = ["xsched-lv3"]
BAD_NUMBERS = ["abc", "-1", "nan", "inf", "1e999", ""]

CASES = [
    # kfdtool: globals and names
    (K, U), (K + ["nosuch"], U), (K + ["--sim"], U), (K + ["--sim", "", "topology"], U),
    (K + ["--sysfs-root", "", "topology"], U), (K + ["--sim", "nosuch", "topology"], E),
    (K + ["--sysfs-root", "/nonexistent", "topology"], E), (K + ["--sysfs-root", "/etc/hostname", "topology"], E),
    (K + ["--sysfs-root", "{tmp}", "topology"], E), (K + ["--sysfs-root", "{tmp}", "queues"], E),
    (K + ["--sysfs-root", "{tmp}", "cwsr"], E), (K + ["--sim", "mi308x", "--sysfs-root", "/tmp", "topology"], U),
    (K + ["topology", "--bogus"], U),
    # queues / monitor numbers
    *[(S + ["queues", v], U) for v in ["0", *BAD_NUMBERS]],
    *[(S + ["queues", "1", v], U) for v in ["0", "-3", "abc", "1.5"]],
    (S + ["queues", "-p", "abc"], U), (S + ["queues", "-p", "999999"], E), (S + ["queues", "--json", "--csv"], U),
    *[(S + ["monitor", "--count", v], U) for v in ["0", "-1", "abc"]],
    *[(S + ["monitor", "--interval", v], U) for v in ["0", *BAD_NUMBERS]],
    (S + ["monitor", "--sort", "bogus"], U), (S + ["queues", "1e308", "2"], U), (S + ["monitor", "--interval", "1e308"], U),
    (S + ["queues", "-p", "２５０２"], U), (S + ["queues", "-p", "-1"], U),
    # cwsr
    (S + ["cwsr", "--pid", "1"], E), (S + ["cwsr", "--probe", "--pid", "abc"], U),
    (S + ["cwsr", "--probe", "--pid", "-1"], U), (S + ["cwsr", "--probe", "--pid", "999999"], E),
    (S + ["cwsr", "--probe", "--pid", "999999", "--json"], E),
    # preempt / resume
    (S + ["preempt"], U), (S + ["preempt", "--pid", "abc"], U), (S + ["preempt", "--pid", "0"], U),
    (S + ["preempt", "--pid", "-5"], U), (S + ["preempt", "--pid", "999999"], E),
    (K + ["--sysfs-root", "{tmp}", "preempt", "--pid", "1"], E),
    *[(S + ["preempt", "--pid", "1", "--for", v], U) for v in ["0", "-1", "abc", "99999999999s", "1e999s", "5h"]],
    *[(S + ["preempt", "--pid", "1", "--grace", v], U) for v in ["-1", "256", "abc"]],
    (S + ["preempt", "--pid", "1", "--queue", "abc"], U), (S + ["preempt", "--pid", "1", "--queue", "-1"], U),
    # a queue id past the kernel's 1024 names no queue (and 2**32 wrapped to queue 0 in the ioctl's array)
    (S + ["preempt", "--pid", "1", "--queue", "1024"], U), (S + ["resume", "--pid", "1", "--queue", "4294967296"], U),
    (S + ["preempt", "--pid", "1", "--gpu", "-1"], U), (S + ["preempt", "--pid", "２５０２"], U), (S + ["preempt", "--pid", "1", "--mechanism", "bogus"], U),
    (S + ["resume"], U), (S + ["resume", "--pid", "1"], U), (S + ["resume", "--pid", "abc", "--all"], U),
    (S + ["resume", "--pid", "999999", "--all"], E), (S + ["resume", "--pid", "1", "--all", "--queue", "1"], U),
    (K + ["--sysfs-root", "{tmp}", "resume", "--pid", "1", "--all"], E),
    # sim
    (K + ["sim"], U), (K + ["sim", "bogus"], U), (K + ["sim", "start", "nosuch"], E), (K + ["sim", "stop", "nosuch"], E),
    (K + ["sim", "status", "nosuch"], E), (K + ["sim", "workload", "nosuch"], E),
    (K + ["sim", "start", "mi308x", "--abi", "9.9"], U), (K + ["sim", "start", "mi308x", "--param", "oops"], E),
    (K + ["sim", "start", "mi308x", "--param", "nosuch=1"], E),
    (K + ["sim", "start", "mi308x", "--param", "sched_policy=abc"], E),
    # kfd_init would not load KFD at all with these
    (K + ["sim", "start", "mi308x", "--param", "sched_policy=3"], E),
    (K + ["sim", "start", "mi308x", "--param", "max_num_of_queues_per_device=0"], E),
    (K + ["sim", "start", "mi308x", "--param", "sched_policy=99999999999999999999999"], E),
    *[(K + ["sim", "workload", "mi308x", opt, v], U) for opt in ["--procs", "--gpus", "--waves"] for v in ["0", "-5", "abc"]],
    *[(K + ["sim", "workload", "mi308x", opt, v], U) for opt in ["--queues", "--sdma"] for v in ["-1", "abc"]],
    (K + ["sim", "workload", "mi308x", "--gpus", "999"], E), (K + ["sim", "workload", "mi308x", "--procs", "100000"], U), (K + ["demo", "--machine", "nosuch"], E),
    # xsched-lv3
    (X, U), (X + ["bogus"], U), (X + ["run"], U), (X + ["run", "--"], U),
    (X + ["run", "--", "no-such-program-xyz"], NOT_FOUND), (X + ["run", "--", "{tmp}/not-executable"], CANNOT_RUN),
    (X + ["run", "--", "z" * 300], CANNOT_RUN), (X + ["run", "--", "{tmp}/notes.txt/x"], CANNOT_RUN),   # too long; not a folder
    *[(X + ["run", "--priority", v, "--", "true"], code) for v, code in [("abc", U), ("5000", U), ("-5000", U), ("1.5", U)]],
    (X + ["run", "--policy", "bogus", "--", "true"], U), (X + ["run", "--priority", "１", "--", "true"], U),
    (X + ["run", "--", ""], NOT_FOUND),
    *[(X + ["run", "--window-us", v, "--", "true"], U) for v in ["-1", "nan", "inf"]],
    (X + ["run", "--window-us", "abc", "--", "true"], U),
    *[(X + ["run", "--latency-slack", v, "--", "true"], U) for v in ["-0.1", "nan", "inf"]],
    (X + ["run", "--latency-slack", "abc", "--", "true"], U),
    *[(X + ["run", "--utilization", v, "--", "true"], U) for v in ["300", "-1"]],
    (X + ["run", "--deadline-us", "-1", "--", "true"], U), (X + ["run", "--laxity-us", "-5", "--", "true"], U),
    (X + ["hint"], U), (X + ["hint", "--pid", "abc"], U), (X + ["hint", "--pid", "1"], U),
    (X + ["hint", "--pid", "1", "--priority", "5", "--socket", "/nonexistent.sock"], E),
    (X + ["hint", "--pid", "1", "--utilization", "500", "--socket", "/x"], U),
    (X + ["hint", "--pid", "1", "--priority", "abc", "--socket", "/x"], U),
    (X + ["daemon", "--policy", "bogus"], U), (X + ["daemon", "--socket", ""], U), (X + ["status", "--socket", ""], U),
    (K + ["demo", "--machine", ""], U), *[(X + ["daemon", "--attached-poll-ms", v], U) for v in ["0", "nan", "abc"]],
    (X + ["daemon", "--trace", "{tmp}/fifo"], U), (X + ["daemon", "--trace", "{tmp}"], U),   # nobody reads it; a folder
    (X + ["daemon", "--trace", "/proc/self/status"], U),        # opens, yet cannot be appended to
    (X + ["attach", "--pid", "1", "--priority", "5000"], U),
]
ENV_CASES = [            # the same commands, held wrong through the environment
    ({"XSCHED_LV3_BOARD": "{tmp}"}, X + ["status"]), ({"XSCHED_LV3_BOARD": "{tmp}/missing/board"}, X + ["status"]),
    ({"XSCHED_LV3_BOARD": "{tmp}/notes.txt"}, X + ["status"]),
    ({"XSCHED_LV3_BOARD": "{tmp}/notes.txt"}, X + ["run", "--", "false"]),   # runs unscheduled: false's status, one warning
    ({"XSCHED_LV3_BOARD": "/proc/self/status"}, X + ["status"]),   # a file of ours that cannot be a board
    ({"KFDTOOL_SIM_DIR": "{tmp}/" + "e" * 120}, K + ["sim", "start", "mi210"]),   # no room for its socket's name
    ({"KFDTOOL_SYSFS_ROOT": "/nonexistent"}, K + ["topology"]), ({"KFDTOOL_SYSFS_ROOT": "/etc/hostname"}, K + ["queues"]),
]


def test_the_sweep_is_large_enough():
    assert len(CASES) + len(ENV_CASES) >= 100


@pytest.fixture(scope="module")
def area(tmp_path_factory, sim_dir):
    start("mi308x")
    tmp = tmp_path_factory.mktemp("sweep")
    (tmp / "not-executable").write_text("echo hi\n")
    (tmp / "notes.txt").write_text("somebody's notes\n")
    os.mkfifo(tmp / "fifo")                          # opening it to write waits for a reader
    for d in ("cwd", "home", "run"):
        (tmp / d).mkdir()
    return tmp


def _run(area, argv, extra_env=None):
    program, *args = argv
    module = "kfdtool" if program == "kfdtool" else "xsched_lv3"
    args = [a.replace("{tmp}", str(area)) for a in args]
    env = dict(os.environ, HOME=str(area / "home"), KFDTOOL_RUN_DIR=str(area / "run"), COLUMNS="120",
               XSCHED_LV3_BOARD=str(area / "run" / "board"))
    env.update({k: v.replace("{tmp}", str(area)) for k, v in (extra_env or {}).items()})
    before = _files(area)
    result = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=env,
                            cwd=area / "cwd", timeout=60, stdin=subprocess.DEVNULL)
    changed = {p for p in _files(area) ^ before if "/run/" not in p}
    assert not changed, f"{argv} wrote {sorted(changed)}"
    assert "Traceback" not in result.stderr, result.stderr
    return result


def _files(area):
    return {f"{root}/{name}:{os.stat(os.path.join(root, name)).st_mtime_ns}"
            for root, _, names in os.walk(area) for name in names}


def _check(result, expected, argv):
    lines = result.stderr.strip().splitlines()
    assert result.returncode == expected, (argv, result.returncode, result.stderr)
    if expected == U:
        assert lines and "error:" in lines[-1]
    else:
        assert len(lines) == 1, (argv, result.stderr)


@pytest.mark.parametrize("argv,expected", CASES, ids=[" ".join(c[0][1:]) or c[0][0] for c in CASES])
def test_bad_input(area, argv, expected):
    _check(_run(area, argv), expected, argv)


@pytest.mark.parametrize("env,argv", ENV_CASES, ids=[f"{list(e)[0]}={list(e.values())[0]}" for e, _ in ENV_CASES])
def test_bad_environment(area, env, argv):
    _check(_run(area, argv, env), E, argv)
    assert (area / "notes.txt").read_text() == "somebody's notes\n"


def test_an_output_error_is_named_as_such(area):
    """`status` into a full disk: one line with the reason, not blamed on the board."""
    env = dict(os.environ, XSCHED_LV3_BOARD=str(area / "run" / "board"))
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "xsched_lv3", "status"], stdout=full, stderr=subprocess.PIPE,
                                text=True, env=env, timeout=60)
    assert result.returncode == 1 and result.stderr.strip() == "xsched-lv3: No space left on device", result.stderr


def test_an_unusable_board_is_named_in_the_error(area):
    result = _run(area, X + ["status"], {"XSCHED_LV3_BOARD": "/proc/self/status"})
    assert result.returncode == E and "board /proc/self/status:" in result.stderr, result.stderr


@pytest.mark.parametrize("argv", [S + ["topology"], S + ["queues", "--json"], X + ["status"], X + ["status", "--json"]],
                         ids=lambda a: " ".join(a))
def test_a_reader_that_went_away_ends_the_command_quietly(area, argv):
    """`kfdtool topology | head -1`: no message about the pipe, and both commands end alike (status 1,
    as rich's console ends one whose table could not be written)."""
    program, *args = argv
    module = "kfdtool" if program == "kfdtool" else "xsched_lv3"
    env = dict(os.environ, KFDTOOL_RUN_DIR=str(area / "run"), XSCHED_LV3_BOARD=str(area / "run" / "board"))
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run([sys.executable, "-m", module, *args], stdout=write_end, stderr=subprocess.PIPE,
                                text=True, env=env, timeout=60)
    finally:
        os.close(write_end)
    assert result.returncode == 1 and result.stderr == "", result.stderr
