"""`kfdtool sim start`: the archive reader that builds a first start's sysfs tree, what a built tree is
keyed on, and where machines live by default (a memory filesystem, like the kernel's sysfs)."""
import ast
import gzip
import io
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from kfdtool.errors import SimulatorError
from kfdtool.sim import machine, runner
from kfdtool.sim.machine import ArchiveError, extract_archive


class Special:
    """A member that is neither a file nor a directory: a tarfile type such as SYMTYPE."""
    def __init__(self, tar_type):
        self.tar_type = tar_type


def tar_gz(*members, format=tarfile.GNU_FORMAT):
    """A gzip'd tar of (name, bytes of a file, None for a directory, or a Special)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=format) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
            elif isinstance(data, Special):
                info.type, info.linkname = data.tar_type, "/etc/passwd"
            else:
                info.size = len(data)
            info.mode = 0o444 if isinstance(data, bytes) else 0o755
            tar.addfile(info, io.BytesIO(data) if isinstance(data, bytes) else None)
    return gzip.compress(out.getvalue())


def files_under(root):
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in Path(root).rglob("*")}


def test_posix_long_names_and_unlisted_directories_are_extracted(tmp_path):
    """A POSIX name longer than 100 bytes keeps its leading part in the header's prefix field, and
    an archive need not list a file's directories: both come out as tarfile writes them."""
    long_dir = "/".join(["d" * 60, "e" * 60])
    archive = tar_gz((f"{long_dir}/properties", b"simd_count 4\n"), ("a/b/c", b"x"), format=tarfile.USTAR_FORMAT)
    extract_archive(archive, tmp_path / "ours")
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(archive))) as tar:
        tar.extractall(tmp_path / "tarfile", filter="data")
    assert files_under(tmp_path / "ours") == files_under(tmp_path / "tarfile")
    assert (tmp_path / "ours" / long_dir / "properties").read_bytes() == b"simd_count 4\n"
    assert oct((tmp_path / "ours" / "a" / "b" / "c").stat().st_mode & 0o777) == oct(0o644)


@pytest.mark.parametrize("bad_member", [("../outside", b"x"), ("/etc/owned", b"x"), ("link", Special(tarfile.SYMTYPE)),
                                        ("hard", Special(tarfile.LNKTYPE)), ("fifo", Special(tarfile.FIFOTYPE))])
def test_archive_with_anything_but_files_and_directories_inside_it_is_refused_before_writing(tmp_path, bad_member):
    """Links, devices and names leading out of the destination are refused, and nothing of the
    archive is written (every member is checked first), as tarfile's data filter refuses them."""
    archive = tar_gz(("nodes/0/properties", b"cpu_cores_count 8\n"), bad_member)
    with pytest.raises(ArchiveError, match="refusing member"):
        extract_archive(archive, tmp_path / "t", "capture test")
    assert not (tmp_path / "t").exists() and not (tmp_path / "outside").exists()


def test_pax_headers_are_refused_with_a_clear_error(tmp_path):
    """A PAX extended header (here for a non-ASCII name) is not a plain file: one clear error."""
    archive = tar_gz(("nodes/\u00e9", b"x"), format=tarfile.PAX_FORMAT)
    with pytest.raises(ArchiveError, match="refusing member"):
        extract_archive(archive, tmp_path / "t")


def test_a_corrupt_or_cut_archive_is_an_archive_error(tmp_path):
    archive = gzip.decompress(tar_gz(("nodes/0/properties", b"cpu_cores_count 8\n" * 100)))
    flipped = bytearray(archive)
    flipped[0] ^= 1                                         # the name: the header checksum no longer matches
    cases = {"checksum": gzip.compress(bytes(flipped)), "truncated": gzip.compress(archive[:700]),
             "not a gzip": archive}
    for what, data in cases.items():
        with pytest.raises(ArchiveError):
            extract_archive(data, tmp_path / what, what)


def test_a_planted_link_in_the_destination_is_not_followed(tmp_path):
    """A directory the archive names that exists as a link (to anywhere) is refused, so no file is
    created outside the destination through it."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "nodes").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ArchiveError, match="not a directory"):
        extract_archive(tar_gz(("nodes", None), ("nodes/0", b"x")), tmp_path / "t")
    assert list((tmp_path / "elsewhere").iterdir()) == []


@pytest.fixture
def memory_tmp():
    """A temporary directory where machines live by default (a memory filesystem where there is
    one): thousands of files are written there in a fraction of the time a loaded disk takes."""
    import shutil
    import tempfile
    path = Path(tempfile.mkdtemp(prefix="kfdtool-test-", dir=runner.default_base_dir().parent))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_every_shipped_capture_extracts_as_tarfile_would(memory_tmp):
    """All six captures, the two large ones included, come out with the names, bytes and file modes
    tarfile's data filter gives their members (tests/test_sim_server.py also compares whole trees
    that tarfile.extractall wrote, for the small ones)."""
    captures = sorted(p.name.removesuffix(".tar.gz") for p in (Path(machine.__file__).parent / "presets").iterdir()
                      if p.name.endswith(".tar.gz"))
    assert len(captures) == 6
    for capture in captures:
        dest = memory_tmp / capture
        ours = machine.extract_capture(capture, dest)
        expected = {}
        with tarfile.open(fileobj=io.BytesIO(machine._capture_archive(capture))) as tar:
            for member in tar:
                allowed = tarfile.data_filter(member, str(dest))
                name = os.path.normpath(allowed.name)
                if name != ".":
                    expected[name] = (None, None) if allowed.isdir() else (tar.extractfile(member).read(),
                                                                           0o100000 | allowed.mode)
        got = {str(p.relative_to(ours)): (None, None) if p.is_dir() else (p.read_bytes(), p.stat().st_mode)
               for p in ours.rglob("*")}
        assert got == expected, capture


def test_the_tree_is_keyed_on_every_module_that_builds_it():
    """A built tree is kept until the code that builds it changes: TREE_CODE must name every module
    of this package that machine.py imports at its top, and those modules import none but those.
    (Its one import inside a function from outside the simulator, the ABI tables behind
    KernelProfile.abi, writes nothing into a tree.)"""
    sim_dir = Path(machine.__file__).parent

    def package_imports(module_file):
        tree = ast.parse((sim_dir / module_file).read_text())
        out = set()
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                out.add(f"{node.module}.py" if node.module else "__init__.py")
            elif isinstance(node, ast.ImportFrom) and node.level > 1:
                out.add(f"../{node.module}")       # outside the simulator: a tree must not depend on it
        return out
    imported = package_imports("machine.py")
    assert imported <= set(machine.TREE_CODE), imported - set(machine.TREE_CODE)
    for module in machine.TREE_CODE:
        assert package_imports(module) <= set(machine.TREE_CODE), module


# --- where machines live ------------------------------------------------------------------------------

@pytest.fixture
def default_dirs(monkeypatch, tmp_path):
    """No KFDTOOL_SIM_DIR, and an XDG_RUNTIME_DIR of the test's own."""
    monkeypatch.delenv("KFDTOOL_SIM_DIR", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    return tmp_path


def test_machines_live_in_the_users_runtime_directory_by_default(default_dirs, monkeypatch):
    assert runner.base_dir() == default_dirs / "kfdtool-sim"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    if os.access("/dev/shm", os.W_OK | os.X_OK):
        assert runner.base_dir() == Path(f"/dev/shm/kfdtool-sim-{os.getuid()}")
    monkeypatch.setenv("KFDTOOL_SIM_DIR", "/somewhere/else")
    assert runner.base_dir() == Path("/somewhere/else")


def test_a_planted_default_directory_is_refused_in_one_line(default_dirs, tmp_path):
    """In a shared directory (/dev/shm) anyone can create kfdtool-sim-UID first, or a link to a
    place of their choosing: `sim start` and `--sim` refuse to use one that is not the user's own
    directory, with one line naming it."""
    (tmp_path / "theirs").mkdir()
    (default_dirs / "kfdtool-sim").symlink_to(tmp_path / "theirs")
    with pytest.raises(SimulatorError, match="not a directory of yours"):
        runner.static_tree("mi210")
    cli = subprocess.run([sys.executable, "-m", "kfdtool", "--sim", "mi210", "topology"], capture_output=True,
                         text=True, env={**os.environ}, timeout=60)
    assert cli.returncode == 1 and cli.stderr.count("\n") == 1 and "not a directory of yours" in cli.stderr
    assert list((tmp_path / "theirs").iterdir()) == []


def start_the_largest_capture():
    """`kfdtool sim start mi300x-cpx` as a user runs it: running, all 65 nodes, within 3x the issue's 1 s."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "kfdtool", "sim", "start", "mi300x-cpx"], env={**os.environ},
                   check=True, capture_output=True, timeout=60)
    elapsed = time.perf_counter() - t0
    sim = runner.machine("mi300x-cpx")
    assert sim.is_running()
    assert len(list((sim.sysfs_root / "class/kfd/kfd/topology/nodes").iterdir())) == 65
    assert elapsed < 3.0, f"first start took {elapsed:.2f} s"
    return sim


def test_first_start_of_the_largest_capture_in_the_default_place(monkeypatch, memory_tmp):
    """`kfdtool sim start mi300x-cpx` with nothing built yet (8267 entries) returns a running
    machine well inside the issue's 1 s on the filesystem where machines live by default; the
    bound here is 3x that for busy CI hosts (scripts/bench_sim_start.py measures it)."""
    monkeypatch.setenv("KFDTOOL_SIM_DIR", str(memory_tmp))
    try:
        start_the_largest_capture()
    finally:
        runner.stop("mi300x-cpx")


# --- what a built tree contains ------------------------------------------------------------------------

def tree_digest(root):
    """sha256 over every entry under root but the stamp: its path, mode, and bytes if a file."""
    import hashlib
    digest = hashlib.sha256()
    for dirpath, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(dirs + files):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if rel == machine.TREE_STAMP:
                continue
            st = os.lstat(path)
            digest.update(f"{rel}\0{st.st_mode:o}\0".encode())
            if not os.path.isdir(path):
                with open(path, "rb") as f:
                    digest.update(f.read())
            digest.update(b"\n")
    return digest.hexdigest()[:16]


# The trees that `materialize` wrote at a73c6cb (before the start-time work on disk filesystems),
# for the oldest and newest kernel profile: a change to how trees are built or placed must keep
# every byte, name and mode of them, or say here why a tree changed.
EXPECTED_TREES = {
    ("mi308x", "1.11"): "b64ad791c8d5a5ae", ("mi308x", "1.23"): "b64ad791c8d5a5ae",
    ("mi300x-cpx", "1.11"): "5b2b2ef3d17da406", ("mi300x-cpx", "1.23"): "5b2b2ef3d17da406",
    ("mi210", "1.11"): "13ef7feec7a6d2b6", ("mi210", "1.23"): "13ef7feec7a6d2b6",
    ("vega10", "1.11"): "d5a15413ec8cb81d", ("vega10", "1.23"): "d5a15413ec8cb81d",
    ("composite", "1.11"): "7c37a97fa48612e0", ("composite", "1.23"): "c01f1d7e136a23d6",
    ("mi300x", "1.11"): "37a62aea9ce4c1b6", ("mi300x", "1.23"): "2b80744b23bea118",
}


def test_every_preset_builds_the_tree_it_built_before(memory_tmp):
    """Every preset's whole tree (capture, completed gpu_id / name / gfx_target_version, profile's
    CWSR keys, empty proc/, module parameters) is byte-identical to the one the code wrote before."""
    assert {preset for preset, _ in EXPECTED_TREES} == set(machine.PRESETS)
    for (preset, abi), expected in EXPECTED_TREES.items():
        root = memory_tmp / preset / abi
        machine.materialize(preset, root, machine.PROFILES[abi])
        assert tree_digest(root) == expected, (preset, abi)


# --- a machine directory on a disk filesystem -----------------------------------------------------------

@pytest.fixture
def disk_machine_dir(monkeypatch, tmp_path):
    """A machine directory that counts as on a disk filesystem and a default base directory that
    counts as on a memory one, whatever filesystems this host's temporary directories are on."""
    disk, memory = tmp_path / "disk", tmp_path / "memory"
    disk.mkdir()
    memory.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(memory))
    monkeypatch.setenv("KFDTOOL_SIM_DIR", str(disk))
    monkeypatch.setattr(runner, "filesystem_type",
                        lambda path: "tmpfs" if str(path).startswith(str(memory)) else "ext4")
    return disk / "mi210"


def build(machine_dir, preset="mi210", abi="1.23"):
    """What `kfdtool sim start` does to a machine directory before serving it: place, then build."""
    return machine.materialize(preset, runner.place_sysfs_tree(machine_dir), machine.PROFILES[abi])


def test_a_machine_on_a_disk_keeps_its_tree_in_memory_with_the_same_content(disk_machine_dir, memory_tmp):
    """sys/ of a machine directory on a disk is a link into the memory filesystem; through it the
    tree is the one built in place, and a restart keeps it (same inode) as it keeps one in place."""
    disk_machine_dir.mkdir()
    topo = build(disk_machine_dir)
    sys_dir = disk_machine_dir / "sys"
    assert sys_dir.is_symlink()
    target = Path(os.readlink(sys_dir))
    assert str(target).startswith(os.environ["XDG_RUNTIME_DIR"]) and target.is_dir()
    machine.materialize("mi210", memory_tmp / "in-place", machine.PROFILES["1.23"])
    assert tree_digest(sys_dir) == tree_digest(memory_tmp / "in-place") == EXPECTED_TREES["mi210", "1.23"]
    props = next(topo.glob("nodes/*/properties"))
    inode = props.stat().st_ino
    build(disk_machine_dir)
    assert props.stat().st_ino == inode and os.readlink(sys_dir) == str(target)


def test_a_tree_already_built_in_a_disk_directory_stays_there(disk_machine_dir):
    disk_machine_dir.mkdir()
    topo = machine.materialize("mi210", disk_machine_dir / "sys", machine.PROFILES["1.23"])
    inode = next(topo.glob("nodes/*/properties")).stat().st_ino
    build(disk_machine_dir)
    assert not (disk_machine_dir / "sys").is_symlink()
    assert next(topo.glob("nodes/*/properties")).stat().st_ino == inode


def test_a_full_memory_filesystem_means_the_tree_is_built_on_disk(disk_machine_dir, monkeypatch):
    """ENOSPC while writing through the link (a small /dev/shm in a container): the link goes and
    the tree is built in the machine directory, complete."""
    import errno
    memory = os.environ["XDG_RUNTIME_DIR"]
    real_extract = machine.extract_capture

    def memory_full(capture, dest):
        if os.path.realpath(dest).startswith(memory):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_extract(capture, dest)
    monkeypatch.setattr(machine, "extract_capture", memory_full)
    disk_machine_dir.mkdir()
    build(disk_machine_dir)
    assert not (disk_machine_dir / "sys").is_symlink()
    assert tree_digest(disk_machine_dir / "sys") == EXPECTED_TREES["mi210", "1.23"]


def test_trees_no_machine_links_to_are_pruned_and_linked_ones_kept(disk_machine_dir, monkeypatch):
    """A machine directory deleted (a benchmark's or a test's) leaves its tree in memory; pruning
    removes it once it is older than the grace period, and never a tree a machine links to."""
    import shutil
    kept, deleted = disk_machine_dir, disk_machine_dir.with_name("deleted")
    for d in (kept, deleted):
        d.mkdir()
        build(d)
    trees = Path(os.environ["XDG_RUNTIME_DIR"]) / "kfdtool-sim" / runner.LINKED_TREES
    deleted_tree = Path(os.readlink(deleted / "sys")).parent
    shutil.rmtree(deleted)
    runner.prune_linked_trees()
    assert deleted_tree.exists()                                 # too young: its link may be being made
    monkeypatch.setattr(runner, "PRUNE_GRACE_S", 0)
    runner.prune_linked_trees()
    assert list(trees.iterdir()) == [Path(os.readlink(kept / "sys")).parent]
    assert tree_digest(kept / "sys") == EXPECTED_TREES["mi210", "1.23"]


def test_filesystem_type_reads_the_mount_table():
    assert runner.filesystem_type("/proc/self/status") == "proc"
    assert runner.filesystem_type(runner.default_base_dir().parent) in (runner.MEMORY_FILESYSTEMS
                                                                        | {runner.filesystem_type("/")})


def test_first_start_with_the_machine_directory_on_a_disk(monkeypatch, tmp_path):
    """`kfdtool sim start mi300x-cpx` with nothing built yet and KFDTOOL_SIM_DIR in the temporary
    directory (a disk here): within 3x the issue's 1 s, its tree in memory where the temporary
    directory is on a disk and a memory filesystem exists, in place otherwise."""
    monkeypatch.setenv("KFDTOOL_SIM_DIR", str(tmp_path))
    try:
        sim = start_the_largest_capture()
        on_disk = runner.filesystem_type(tmp_path) not in runner.MEMORY_FILESYSTEMS
        memory = runner.filesystem_type(runner.default_base_dir().parent) in runner.MEMORY_FILESYSTEMS
        assert sim.sysfs_root.is_symlink() == (on_disk and memory)
    finally:
        runner.stop("mi300x-cpx")
        sys_dir = tmp_path / "mi300x-cpx" / "sys"
        if sys_dir.is_symlink():                                   # 17 MB of memory: not left to pruning
            import shutil
            shutil.rmtree(Path(os.readlink(sys_dir)).parent)
