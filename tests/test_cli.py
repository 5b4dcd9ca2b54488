"""kfdtool as a user runs it: subprocesses, real output, bad input -> one line and exit != 0."""
import json
import os
import re
import shlex
import subprocess
import sys
import time

import pytest

from conftest import REPO, run_cli
from kfdtool.cli.sim_cmd import spawn_workload
from simhelpers import start


@pytest.fixture(scope="module")
def sim(sim_dir):
    return start("mi308x")


def one_line_error(result, needle):
    assert result.returncode != 0
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kfdtool: ") and needle in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_topology_json_of_a_capture(capture_root):
    root = capture_root("k8sdp-mi210-8x-xgmi")
    result = run_cli("topology", "--json", env={"KFDTOOL_SYSFS_ROOT": str(root)})
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    gpus = [n for n in doc["nodes"] if n["kind"] == "gpu"]
    assert doc["schema"] == "kfdtool.topology/1" and len(gpus) == 8
    assert {g["gfx_name"] for g in gpus} == {"gfx90a"} and len(doc["hives"]) == 2


def test_topology_table_of_the_simulated_mi308x(sim):
    result = run_cli("--sim", "mi308x", "topology")
    assert result.returncode == 0, result.stderr
    assert "32 GPU nodes, 2 CPU nodes" in result.stdout and "gfx942" in result.stdout and "CPX" in result.stdout


def test_queues_of_simulated_workloads(sim):
    result = run_cli("sim", "workload", "mi308x", "--procs", "2", "--queues", "3", "--role", "llm-serve",
                     "--role", "trainer")
    assert result.returncode == 0, result.stderr
    pids = [int(p) for p in result.stdout.split(":")[1].split()]
    try:
        doc = json.loads(run_cli("--sim", "mi308x", "queues", "--json", *sum((["-p", str(p)] for p in pids), [])).stdout)
        assert doc["schema"] == "kfdtool.queues/1"
        assert [p["pid"] for p in doc["processes"]] == sorted(pids)
        assert {p["name"] for p in doc["processes"]} == {"llm-serve", "trainer"}
        assert all(len(p["queues"]) == 3 and p["queues"][0]["type"] == "compute" for p in doc["processes"])
        table = run_cli("--sim", "mi308x", "queues", "-n", "trainer").stdout
        assert "trainer" in table and "llm-serve" not in table and "compute" in table
        csv_out = run_cli("--sim", "mi308x", "queues", "--csv", "-p", str(pids[0])).stdout.splitlines()
        assert csv_out[0].startswith("pid,name,user") and len(csv_out) == 4
        watch = run_cli("--sim", "mi308x", "queues", "--json", "-p", str(pids[0]), "0.2", "2").stdout
        docs = [json.loads(line) for line in watch.splitlines()]      # JSON lines when piped
        assert len(docs) == 2 and "rates" in docs[1] and docs[1]["interval_s"] > 0.1
    finally:
        for pid in pids:
            os.kill(pid, 9)


def test_a_kfd_process_on_no_gpu_still_has_its_row(sim):
    """A process that opened /dev/kfd and nothing else (a debugger, the xsched-lv3 daemon) is counted
    in the title and shown, not left out of the table."""
    code = ("import sys, time; from kfdtool.sim import runner; from kfdtool.device import KfdDevice; "
            "k = KfdDevice(runner.machine('mi308x').open_kfd()); print('open', flush=True); sys.stdin.readline()")
    opener = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert opener.stdout.readline().strip() == "open"
        table = run_cli("--sim", "mi308x", "queues", "-p", str(opener.pid)).stdout
        assert "1 KFD processes, 0 queues" in table and str(opener.pid) in table, table
    finally:
        opener.communicate("\n", timeout=10)


def test_no_processes_is_said_honestly(sim_dir):
    start("mi210")
    deadline = time.monotonic() + 5
    while True:
        result = run_cli("--sim", "mi210", "queues")
        if "no KFD processes" in result.stdout or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert result.returncode == 0 and result.stdout.strip() == "no KFD processes"


def test_cwsr_json(sim):
    doc = json.loads(run_cli("--sim", "mi308x", "cwsr", "--json").stdout)
    assert doc["cwsr_enabled"] is True and doc["scheduler"] == "HWS"
    assert {(g["ctl_stack_size"], g["cwsr_size"]) for g in doc["gpus"]} == {(8192, 12214272)}


def test_sim_status_and_list(sim):
    assert "mi308x: running, KFD ABI 1.23" in run_cli("sim", "status", "mi308x").stdout
    assert "mi300x" in run_cli("sim", "list").stdout


@pytest.mark.parametrize("args,needle", [
    (["--sim", "nope", "queues"], "unknown simulated machine 'nope'"),
    (["--sysfs-root", "/nonexistent/sys", "topology"], "/nonexistent/sys does not exist"),
    (["--sysfs-root", "/etc/hostname", "queues"], "is not a directory"),
    (["--sysfs-root", "/tmp", "queues"], "no KFD under /tmp"),
    (["--sim", "mi308x", "queues", "-p", "999999"], "pid 999999 is not a KFD process"),
    (["sim", "start", "nosuch"], "unknown simulated machine 'nosuch'"),
    (["sim", "stop", "nosuch"], "unknown simulated machine 'nosuch'"),
    (["sim", "status", "nosuch"], "unknown simulated machine 'nosuch'"),
    (["demo", "--machine", "nosuch"], "unknown simulated machine 'nosuch'"),
    (["sim", "start", "mi308x", "--param", "sched_policy=abc"], "sched_policy wants an integer"),
    (["sim", "start", "mi308x", "--param", "no_such_param=1"], "unknown amdgpu parameter 'no_such_param'"),
    (["sim", "start", "mi308x", "--param", "oops"], "--param wants NAME=VALUE"),
    (["sim", "workload", "vega10"], "simulated vega10 is not running"),
    (["--sysfs-root", "/tmp", "preempt", "--pid", "1"], "no KFD under /tmp"),
    (["--sysfs-root", "/tmp", "resume", "--pid", "1", "--all"], "no KFD under /tmp"),
    (["sim", "start", "mi308x", "--param", "cwsr_enable=0"], "already runs with cwsr_enable=1"),
    (["--sim", "mi210", "demo", "--machine", "mi308x"], "name different machines"),
])
def test_bad_input_gives_one_line(sim, args, needle):
    one_line_error(run_cli(*args), needle)


def test_not_a_kfd_process_names_the_sysfs_it_looked_in(tmp_path):
    """--sysfs-root or a simulated machine: the message names that tree, not this host's /sys."""
    (tmp_path / "class" / "kfd" / "kfd" / "proc").mkdir(parents=True)
    (tmp_path / "class" / "kfd" / "kfd" / "topology" / "nodes").mkdir(parents=True)
    for args in (["queues", "-p", "999999"], ["preempt", "--pid", "999999"]):
        one_line_error(run_cli("--sysfs-root", str(tmp_path), *args),
                       f"pid 999999 is not a KFD process (no {tmp_path}/class/kfd/kfd/proc/999999)")


def test_unreadable_topology_file(tmp_path):
    kfd = tmp_path / "class" / "kfd" / "kfd"
    kfd.mkdir(parents=True)
    (kfd / "topology").write_text("not a directory")
    one_line_error(run_cli("topology", env={"KFDTOOL_SYSFS_ROOT": str(tmp_path)}), "topology is not a directory")


@pytest.mark.parametrize("args,needle", [
    (["queues", "-p", "abc"], "not a number: 'abc'"),
    (["--sim", "mi308x", "queues", "-p", "２５０２"], "ASCII digits only"),
    (["--sim", "mi308x", "queues", "1e308"], "must be <= 86400"),
    (["sim", "workload", "mi308x", "--procs", "100000"], "must be <= 512"),
    (["--sim", "mi308x", "queues", "0"], "argument interval: must be > 0"),
    (["--sim", "mi308x", "queues", "1", "-3"], "argument count: must be > 0"),
    (["--sim", "mi308x", "monitor", "--count", "-1"], "argument --count: must be > 0"),
    (["--sim", "mi308x", "monitor", "--interval", "nan"], "not a finite number"),
    (["sim", "workload", "mi308x", "--waves", "-5"], "argument --waves: must be > 0"),
    (["sim", "workload", "mi308x", "--sdma", "-1"], "argument --sdma: must be >= 0"),
    (["--sim", "", "topology"], "argument --sim: must not be empty"),
    (["--sysfs-root", "", "topology"], "argument --sysfs-root: must not be empty"),
    (["--sim", "mi308x", "preempt", "--pid", "1", "--for", "99999999999s"], "longer than 24 hours"),
    (["--sim", "mi308x", "preempt", "--pid", "1", "--for", "0"], "must be above zero"),
    (["--frobnicate"], "unrecognized arguments: --frobnicate"),        # named, not "COMMAND is required"
    (["--sim", "mi308x", "queues", "--frob"], "kfdtool queues: error: unrecognized arguments: --frob"),  # its usage
    (["sim", "start", "mi210", "--frob"], "kfdtool sim start: error: unrecognized arguments: --frob"),  # the deepest
    (["--frob", "--sim", "mi308x", "queues"], "kfdtool: error: unrecognized arguments: --frob"),     # not queues'
    ([], "a COMMAND is required"),
    (["--wide"], "a COMMAND is required"),
])
def test_usage_errors_exit_2_before_anything_runs(args, needle):
    result = run_cli(*args)
    assert result.returncode == 2 and needle in result.stderr and "Traceback" not in result.stderr


def _planted_tree(tmp_path, where, plant):
    """A copy of one real capture node with `plant(path)` put at `where` (relative to the node)."""
    import shutil
    from kfdtool.sim.runner import static_tree
    src = static_tree("mi210").sysfs_root
    root = tmp_path / "sys"
    shutil.copytree(src, root, symlinks=True)
    nodes = root / "class" / "kfd" / "kfd" / "topology" / "nodes"
    node = next(n for n in sorted(nodes.iterdir()) if (n / "gpu_id").read_text().strip() not in ("", "0"))
    target = node / where if where else root / "class" / "kfd" / "kfd" / "topology" / "generation_id"
    target.unlink()
    plant(target)
    return root, int(node.name)


@pytest.mark.parametrize("where,plant", [
    ("properties", os.mkfifo),
    ("", os.mkfifo),                                       # generation_id
    ("gpu_id", os.mkfifo),
    ("properties", lambda p: os.symlink("/dev/zero", p)),
    ("properties", lambda p: os.symlink(p, p)),            # a link to itself: ELOOP
], ids=["fifo-properties", "fifo-generation", "fifo-gpu_id", "dev-zero-properties", "loop-properties"])
def test_planted_sysfs_files_never_hang_or_trace(tmp_path, where, plant):
    root, node_index = _planted_tree(tmp_path, where, plant)
    result = subprocess.run([sys.executable, "-m", "kfdtool", "topology", "--json"], capture_output=True, text=True,
                            timeout=30, env=dict(os.environ, KFDTOOL_SYSFS_ROOT=str(root)))
    assert "Traceback" not in result.stderr
    if result.returncode == 0:                             # read as a problem of that node, not silently
        doc = json.loads(result.stdout)
        if where:                                          # the planted GPU node says what is wrong
            node = next(n for n in doc["nodes"] if n["node"] == node_index)
            assert node["problems"]
    else:
        assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1


def test_help_has_examples():
    for cmd in ("topology", "queues", "cwsr", "sim"):
        out = run_cli(cmd, "--help").stdout
        assert "examples:" in out and "kfdtool" in out


def test_only_the_chosen_command_is_loaded_but_help_lists_all():
    probe = ("import sys; from kfdtool.cli import build_parser; "
             "build_parser(['--sim', 'mi308x', 'queues', '--json']); "
             "print(sorted(m for m in sys.modules if m.startswith('kfdtool.cli.') and m.endswith('_cmd')))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "['kfdtool.cli.queues_cmd']"
    listing = run_cli("--help").stdout
    assert all(name in listing for name in ("topology", "queues", "monitor", "cwsr", "preempt", "resume", "sim", "demo"))
    assert run_cli("resume", "--help").returncode == 0     # shares preempt's module


def test_readonly_commands_never_open_dev_kfd(sim):
    """Opening /dev/kfd registers the opener as a KFD process until it exits: read-only commands
    must not. The simulator counts every open."""
    with sim.control() as ctl:
        before = ctl("status")["opens"]
        for args in (["queues"], ["queues", "--json"], ["topology"], ["cwsr"]):
            assert run_cli("--sim", "mi308x", *args).returncode == 0
        assert ctl("status")["opens"] == before


def test_a_symlink_loop_at_topology_is_named(tmp_path):
    kfd = tmp_path / "class" / "kfd" / "kfd"
    kfd.mkdir(parents=True)
    (kfd / "topology").symlink_to("topology")
    one_line_error(run_cli("topology", env={"KFDTOOL_SYSFS_ROOT": str(tmp_path)}), "Too many levels of symbolic links")


def test_workload_on_more_gpus_than_the_machine_has(sim):
    one_line_error(run_cli("sim", "workload", "mi308x", "--gpus", "999"), "--gpus 999: simulated mi308x has 32 GPUs")


def test_an_interrupted_workload_start_leaves_nothing_running(sim, monkeypatch):
    """Ctrl-C while `sim workload --procs 6` starts them left the ones already started running, their
    pids never printed (a hostile-input sweep found it): now all or none."""
    import types

    from kfdtool.cli import sim_cmd
    started = []

    def spawn(*args, **kwargs):
        if len(started) == 2:
            raise KeyboardInterrupt
        started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
        return started[-1].pid
    monkeypatch.setattr(sim_cmd, "spawn_workload", spawn)
    args = types.SimpleNamespace(machine="mi308x", role=None, procs=6, gpus=1, queues=2, sdma=0, waves=512)
    with pytest.raises(KeyboardInterrupt):
        sim_cmd.run_workload(args, None)
    assert [p.wait(timeout=10) for p in started] == [-15, -15]      # SIGTERM, both


@pytest.mark.parametrize("columns", [80, 100, 120])
def test_tables_fit_narrow_terminals_without_cutting_identifiers(sim, columns):
    """Every line fits; every PID, GPU id and PCI address is shown whole; what was dropped is said."""
    pids = [spawn_workload("mi308x", "a-rather-long-process-name", gpus=2) for _ in range(2)]
    try:
        env = {"COLUMNS": str(columns)}
        topo = json.loads(run_cli("--sim", "mi308x", "topology", "--json").stdout)
        shown = run_cli("--sim", "mi308x", "topology", env=env).stdout
        assert max(map(len, shown.splitlines())) <= columns
        for node in topo["nodes"]:
            if node["kind"] == "gpu":
                assert f" {node['gpu_id']} " in shown and node["pci_bdf"] in shown
        if columns < 120:
            assert "--wide shows every column" in shown
        listing = run_cli("--sim", "mi308x", "queues", env=env).stdout
        assert max(map(len, listing.splitlines())) <= columns
        for pid in pids:
            assert f" {pid} " in listing
        wide = run_cli("--sim", "mi308x", "--wide", "topology", env=env).stdout
        assert "IO LINKS" in wide and "HIVE" in wide and "--wide shows" not in wide
    finally:
        for pid in pids:
            os.kill(pid, 9)


def test_fifos_at_a_queue_type_and_a_module_parameter_never_hang(tmp_path):
    import shutil
    from kfdtool.sim.runner import static_tree
    root = tmp_path / "sys"
    shutil.copytree(static_tree("mi210").sysfs_root, root, symlinks=True)
    queue = root / "class" / "kfd" / "kfd" / "proc" / str(os.getpid()) / "queues" / "0"
    queue.mkdir(parents=True)
    (queue / "size").write_text("1048576\n")
    (queue / "gpuid").write_text("1\n")
    os.mkfifo(queue / "type")
    param = root / "module" / "amdgpu" / "parameters" / "cwsr_enable"
    param.unlink(missing_ok=True)
    os.mkfifo(param)
    env = {"KFDTOOL_SYSFS_ROOT": str(root)}
    for args in (["queues", "--json"], ["cwsr", "--json"]):
        result = run_cli(*args, env=env, timeout=30)          # a blocking read would time out here
        assert "Traceback" not in result.stderr and result.returncode in (0, 1), (args, result.stderr)


@pytest.mark.parametrize("unreadable", ["topology", "topology/nodes", "proc"])
def test_unreadable_directories_are_one_line(tmp_path, monkeypatch, capsys, unreadable):
    """As a user without rights to them (root reads everything, so the refusal is injected)."""
    import shutil
    from kfdtool.cli import main
    from kfdtool.sim.runner import static_tree
    root = tmp_path / "sys"
    shutil.copytree(static_tree("mi210").sysfs_root, root, symlinks=True)
    denied = str(root / "class" / "kfd" / "kfd" / unreadable)
    real_listdir, real_open = os.listdir, os.open

    def refused(path):                            # the directory and everything reached through it
        return str(path) == denied or str(path).startswith(denied + "/")

    def listdir(path="."):
        if refused(path):
            raise PermissionError(13, "Permission denied", str(path))
        return real_listdir(path)

    def open_(path, flags, *a, **k):
        if refused(path):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *a, **k)
    monkeypatch.setattr(os, "listdir", listdir)
    monkeypatch.setattr(os, "open", open_)
    command = "queues" if unreadable == "proc" else "topology"
    code = main(["--sysfs-root", str(root), command])
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1 and "Permission denied" in err, err


@pytest.mark.parametrize("where,content,needle", [
    ("properties", lambda text: text[: text.index(b"\n", len(text) // 3) + 4], "not `name number`"),   # cut mid-line
    ("properties", lambda text: bytes(range(256)) * 4, "not `name number`"),
    ("properties", lambda text: re.sub(rb"simd_count \d+", b"simd_count -4", text), "simd_count is missing or not a count"),
    ("gpu_id", lambda text: b"garbage\n", "gpu_id: not a number"),
    ("gpu_id", lambda text: b"-5\n", "gpu_id: -5 is negative"),
], ids=["properties-cut", "properties-random", "properties-negative", "gpu_id-garbage", "gpu_id-negative"])
def test_corrupt_sysfs_files_are_warned_about_and_keep_the_node_a_gpu(tmp_path, where, content, needle):
    import shutil
    from kfdtool.sim.runner import static_tree
    src = static_tree("mi210").sysfs_root
    nodes = src / "class" / "kfd" / "kfd" / "topology" / "nodes"
    gpu = next(n for n in sorted(nodes.iterdir()) if (n / "gpu_id").read_text().strip() not in ("", "0"))
    root = tmp_path / "sys"
    shutil.copytree(src, root, symlinks=True)
    (root / gpu.relative_to(src) / where).write_bytes(content((gpu / where).read_bytes()))
    result = run_cli("topology", "--json", env={"KFDTOOL_SYSFS_ROOT": str(root)})
    doc = json.loads(result.stdout)
    node = next(n for n in doc["nodes"] if n["node"] == int(gpu.name))
    assert any(needle in p for p in node["problems"]), node["problems"]
    assert f"warning: node {gpu.name}: " in result.stderr
    if where == "properties":
        assert node["kind"] == "gpu"                   # the gpu_id still says so


def test_corrupt_module_parameters_are_unknown_not_echoed(tmp_path):
    import shutil
    from kfdtool.sim.runner import static_tree
    root = tmp_path / "sys"
    shutil.copytree(static_tree("mi210").sysfs_root, root, symlinks=True)
    params = root / "module" / "amdgpu" / "parameters"
    (params / "sched_policy").write_bytes(b"\x1b[31mred\x07\n")
    (params / "cwsr_enable").unlink()
    os.mkfifo(params / "cwsr_enable")
    result = run_cli("cwsr", "--json", env={"KFDTOOL_SYSFS_ROOT": str(root)}, timeout=30)
    assert "\x1b" not in result.stdout and result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["cwsr_enabled"] is not False          # unknown, not "off"


@pytest.mark.parametrize("columns", ["0", "-5", "abc", "", "5"])
def test_a_senseless_columns_value_still_gives_whole_tables(sim, columns):
    """In a pipe COLUMNS sets the width; an empty, zero, negative, non-numeric or tiny value falls
    back to the default instead of failing or printing nothing, and identifiers stay whole."""
    result = run_cli("--sim", "mi308x", "topology", env={"COLUMNS": columns})
    assert result.returncode == 0 and result.stderr == ""
    gpu = run_cli("--sim", "mi308x", "topology", "--json").stdout
    first_gpu_id = str(next(n["gpu_id"] for n in json.loads(gpu)["nodes"] if n.get("gpu_id")))
    assert first_gpu_id in result.stdout


def test_a_closed_stdout_is_one_line_not_a_traceback(sim):
    result = subprocess.run(f"{shlex.quote(sys.executable)} -m kfdtool --sim mi308x queues >&-", shell=True,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and result.stderr.strip() == "kfdtool: standard output is closed"


def test_probing_a_stopped_simulated_machine_says_so(sim_dir):
    """Its sysfs tree is still readable, but nothing there can be preempted: not "available"."""
    run_cli("sim", "stop", "mi210")
    one_line_error(run_cli("--sim", "mi210", "cwsr", "--probe"), "simulated mi210 is not running")


@pytest.mark.parametrize("script", ["kfdtool", "xsched-lv3"])
def test_ctrl_c_while_a_command_is_still_importing_is_exit_130_without_a_traceback(tmp_path, monkeypatch, script):
    """Seen: Ctrl-C in the first tens of milliseconds of `kfdtool` (while its modules load, before
    main's own handler) printed a traceback. Both console scripts start in kfdtool.entry."""
    import tomllib
    from kfdtool import entry
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts[script].startswith("kfdtool.entry:")
    (tmp_path / "slow_to_import.py").write_text("raise KeyboardInterrupt  # Ctrl-C during the import\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert entry.run("slow_to_import") == 130
    (tmp_path / "interrupted_main.py").write_text("def main(argv):\n    raise KeyboardInterrupt\n")
    assert entry.run("interrupted_main") == 130
