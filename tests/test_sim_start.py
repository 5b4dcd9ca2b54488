"""`kfdtool sim start` builds the machine's sysfs tree from a shipped capture: the fast extractor
writes exactly what tarfile's data filter would and refuses what it would refuse; a built tree is
kept until what it is made of changes."""
import ast
import io
import os
import tarfile
from pathlib import Path

import pytest

from kfdtool.sim import machine
from kfdtool.sim.machine import ArchiveError, extract_archive, extract_capture

from test_sim_server import tree_contents

PACKAGE = Path(machine.__file__).resolve().parents[1]
CAPTURES = sorted({p.capture for p in machine.PRESETS.values()} | {"tinygrad-rx7900xtx-partial"})


def tarfile_extract(archive, dest):
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")


@pytest.mark.parametrize("capture", CAPTURES)
def test_every_capture_extracts_as_tarfiles_data_filter_would(tmp_path, capture):
    """Names, modes and bytes of every file and directory, the large CPX captures included."""
    archive = machine._capture_archive(capture)
    tarfile_extract(archive, tmp_path / "tarfile")
    extract_capture(capture, tmp_path / "ours")
    assert tree_contents(tmp_path / "ours") == tree_contents(tmp_path / "tarfile")


def test_modes_do_not_depend_on_the_umask_for_files_and_do_for_directories(tmp_path):
    archive = machine._capture_archive("k8sdp-mi210-8x-xgmi")
    old = os.umask(0o077)
    try:
        tarfile_extract(archive, tmp_path / "tarfile")
        extract_archive(archive, tmp_path / "ours")
    finally:
        os.umask(old)
    ours = tree_contents(tmp_path / "ours")
    assert ours == tree_contents(tmp_path / "tarfile")
    assert {mode & 0o777 for mode, data in ours.values() if data is not None} == {0o644}
    assert {mode & 0o777 for mode, data in ours.values() if data is None} == {0o700}


def make_archive(*members, fmt=tarfile.GNU_FORMAT):
    """A gzip'd tar of (TarInfo, bytes or None) pairs."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz", format=fmt) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def member(name, type_=tarfile.REGTYPE, linkname="", mode=0o444):
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = type_, linkname, mode
    return info


FINE = (member("nodes/0/properties"), b"cpu_cores_count 4\n")


@pytest.mark.parametrize("bad", [
    (member("../escaped"), b"x"),
    (member("nodes/../../escaped"), b"x"),
    (member("/etc/escaped"), b"x"),
    (member("nodes/link", tarfile.SYMTYPE, "/etc/passwd"), None),
    (member("nodes/hard", tarfile.LNKTYPE, "nodes/0/properties"), None),
    (member("nodes/fifo", tarfile.FIFOTYPE), None),
    (member("nodes/dev", tarfile.CHRTYPE), None),
    (member("nodes/" + "long" * 30), b"x"),              # a GNU long-name header
], ids=["dotdot", "dotdot-inside", "absolute", "symlink", "hardlink", "fifo", "device", "long-name"])
def test_a_member_that_is_not_a_plain_file_or_directory_inside_is_refused_before_writing(tmp_path, bad):
    archive = make_archive(FINE, bad)
    with pytest.raises(ArchiveError, match="refusing member"):
        extract_archive(archive, tmp_path / "dest")
    assert not list((tmp_path / "dest").rglob("*")) and not (tmp_path / "escaped").exists()


def test_pax_headers_are_refused(tmp_path):
    archive = make_archive(FINE, (member("nodes/" + "long" * 30), b"x"), fmt=tarfile.PAX_FORMAT)
    with pytest.raises(ArchiveError, match="refusing member"):
        extract_archive(archive, tmp_path / "dest")


@pytest.mark.parametrize("archive", [b"", b"not gzip at all", make_archive(FINE)[:-20],
                                     __import__("gzip").compress(b"\x01" * 1024)],
                         ids=["empty", "not-gzip", "truncated", "not-tar"])
def test_a_damaged_archive_is_one_clear_error(tmp_path, archive):
    with pytest.raises(ArchiveError):
        extract_archive(archive, tmp_path / "dest", "capture broken")


def test_a_link_already_in_the_destination_is_not_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "dest").mkdir()
    (tmp_path / "dest" / "nodes").symlink_to(outside)
    with pytest.raises(OSError):
        extract_archive(make_archive(FINE), tmp_path / "dest")
    assert not list(outside.iterdir())


def module_files(parts):
    """The files Python runs to import kfdtool.<parts...>: each package's __init__.py on the way
    down, then the module (parts that name no module, like `from . import ABIS`, add nothing)."""
    files = []
    for depth in range(1, len(parts) + 1):
        for candidate in (Path(*parts[:depth], "__init__.py"), Path(*parts[:depth - 1], parts[depth - 1] + ".py")):
            if (PACKAGE / candidate).is_file():
                files.append(candidate.as_posix())
    return files


def kfdtool_imports(module):
    """The kfdtool modules (as part tuples) that `module` (a path under kfdtool/) imports, anywhere
    in the file: an import inside a function counts too."""
    package = Path(module).parent.parts
    for node in ast.walk(ast.parse((PACKAGE / module).read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[:len(package) - node.level + 1]
            parts = (*base, *node.module.split(".")) if node.module else base
            yield parts
            yield from ((*parts, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module.split(".")[0] == "kfdtool":
            yield tuple(node.module.split(".")[1:])
        elif isinstance(node, ast.Import):
            yield from (tuple(a.name.split(".")[1:]) for a in node.names if a.name.split(".")[0] == "kfdtool")


def test_tree_code_lists_every_kfdtool_module_the_tree_builder_imports():
    """A tree is rebuilt when a file of TREE_CODE changes, so it must hold machine.py and every
    kfdtool module it reaches through imports."""
    reached, pending = set(), ["sim/machine.py"]
    while pending:
        module = pending.pop()
        if module not in reached:
            reached.add(module)
            pending += [f for parts in kfdtool_imports(module) for f in module_files(parts)]
    assert set(machine.TREE_CODE) == reached


@pytest.fixture
def fresh_digests():
    machine.tree_source_digest.cache_clear()
    yield
    machine.tree_source_digest.cache_clear()


def test_a_tree_is_rebuilt_when_its_code_or_capture_changes_and_kept_otherwise(tmp_path, monkeypatch,
                                                                              fresh_digests):
    root = tmp_path / "sys"
    topo = machine.materialize("vega10", root, machine.PROFILES["1.23"])
    props = topo / "nodes" / "1" / "properties"
    inode = props.stat().st_ino
    machine.materialize("vega10", root, machine.PROFILES["1.23"])
    assert props.stat().st_ino == inode                                         # nothing changed: kept

    monkeypatch.setattr(machine, "TREE_CODE", machine.TREE_CODE[:-1])          # the tree code changed
    machine.tree_source_digest.cache_clear()
    machine.materialize("vega10", root, machine.PROFILES["1.23"])
    assert props.stat().st_ino != inode

    real = machine._capture_archive                                             # the capture changed
    monkeypatch.setattr(machine, "_capture_archive", lambda capture: real(capture) if capture != "k8sdp-vega10-1gpu"
                        else make_archive((member("nodes/0/properties"), b"cpu_cores_count 20\nsimd_count 0\n")))
    machine.tree_source_digest.cache_clear()
    machine.materialize("vega10", root, machine.PROFILES["1.23"])
    assert not props.exists() and (topo / "nodes" / "0" / "properties").exists()
