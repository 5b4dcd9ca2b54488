"""Topology parsing on every real capture, asserting values read off the capture files."""
import filecmp
import tarfile

import pytest

from conftest import CAPTURES, SHARED_FIXTURES
from kfdtool.errors import SysfsError
from kfdtool.sysfs import parse_properties
from kfdtool.topology import decode_oem, gfx_name, read_topology


def test_mi308x_cpx(capture_root):
    topo = read_topology(capture_root("k8sdp-mi308x-8x-cpx"))
    gpus = list(topo.for_each_gpu())
    assert topo.generation_id == 33
    assert len(topo.nodes) == 34 and len(gpus) == 32
    assert {g.props["simd_count"] for g in gpus} == {80}
    assert {g.gfx_name for g in gpus} == {"gfx942"} and {g.cu_count for g in gpus} == {20}
    assert {g.partition_mode for g in gpus} == {"CPX"} and {g.partitions for g in gpus} == {4}
    first = topo.nodes[2]
    assert first.gpu_id == 24248 and first.name == "ip discovery"
    assert first.bdf == "0000:0a:00.0" and topo.nodes[3].bdf == "0000:0a:00.1"
    assert len(first.io_links) == 32 and len(first.p2p_links) == 1 and len(first.caches) == 46
    assert first.mem_banks[0].props["size_in_bytes"] == 51539607552
    assert first.caches[0].sibling_map[:2] == [1, 0]
    assert topo.hives() == {2095653680343411291: [n.index for n in gpus]}
    assert topo.oem == {"platform_oem": "A M I ", "platform_id": "ALASKA"}
    assert {n.props["cpu_cores_count"] for n in topo.for_each_cpu()} == {112}
    assert sum(1 for g in gpus if g.props["domain"] == 1) == 16


def test_mi300x_cpx(capture_root):
    topo = read_topology(capture_root("k8sdp-mi300x-8x-cpx"))
    gpus = list(topo.for_each_gpu())
    assert topo.generation_id == 80 and len(topo.nodes) == 65 and len(gpus) == 63
    assert {(g.props["simd_count"], g.num_xcc, g.cu_count) for g in gpus} == {(152, 1, 38)}
    assert sum(len(n.io_links) for n in topo.nodes) == 4034
    assert topo.oem == {"platform_oem": "SMCI--MB", "platform_id": "SUPERM"}
    # the last device holds only 7 partitions in this capture
    assert sorted({g.partitions for g in gpus}) == [7, 8]
    assert all(g.gpu_id is None and g.name is None for g in gpus)      # partial capture: no such files


def test_mi210_xgmi(capture_root):
    topo = read_topology(capture_root("k8sdp-mi210-8x-xgmi"))
    gpus = list(topo.for_each_gpu())
    assert len(topo.nodes) == 10 and len(gpus) == 8 and topo.generation_id is None
    assert {g.gfx_name for g in gpus} == {"gfx90a"} and {g.partition_mode for g in gpus} == {"SPX"}
    assert [g.props["drm_render_minor"] for g in gpus] == list(range(128, 136))
    assert sorted(len(v) for v in topo.hives().values()) == [4, 4]
    assert 12609507387757274807 in topo.hives()
    assert sum(1 for ln in topo.nodes[2].io_links if ln.type_name == "XGMI") == 3


def test_vega10_old_kernel(capture_root):
    topo = read_topology(capture_root("k8sdp-vega10-1gpu"))
    gpu = next(topo.for_each_gpu())
    assert topo.generation_id == 2 and len(topo.nodes) == 2
    assert gpu.gpu_id == 13261 and gpu.name == "" and gpu.gfx_name is None   # no gfx_target_version
    assert gpu.props["simd_count"] == 256 and gpu.cu_count == 64 and len(gpu.caches) == 96
    assert gpu.num_xcc == 1 and gpu.hive_id is None


def test_composite_every_generation(capture_root):
    topo = read_topology(capture_root("rocprofsdk-composite"))
    names = [g.gfx_name for g in topo.for_each_gpu()]
    assert names == ["gfx906", "gfx1102", "gfx1032", "gfx942", "gfx950", "gfx1201"]
    mi300x = topo.nodes[4]
    assert (mi300x.num_xcc, mi300x.props["simd_count"], mi300x.cu_count, mi300x.cu_per_xcc) == (8, 1216, 304, 38)
    assert mi300x.props["capability2"] == 1 and mi300x.props["cwsr_size"] == 23203840
    # nodes 5 and 6 share a location_id (different hosts) but are different devices
    assert topo.nodes[5].partition_mode == topo.nodes[6].partition_mode == "SPX"


def test_tinygrad_template_is_tolerated(capture_root):
    root = capture_root("tinygrad-rx7900xtx-partial")
    topo = read_topology(root)
    assert len(topo.nodes) == 1 and topo.nodes[0].problems == ["no properties file"]
    text = next(root.glob("class/kfd/kfd/topology/nodes/1/properties.template")).read_text()
    assert not text.endswith("\n")
    props = parse_properties(text)
    assert props["drm_render_minor"] == "{drm_render_minor}"       # templated value kept as text
    assert props["gfx_target_version"] == 110000 and props["simd_count"] == 192
    assert props["p2p_links_count"] == 5


@pytest.mark.parametrize("capture", CAPTURES)
def test_every_capture_parses_without_problems(capture_root, capture):
    topo = read_topology(capture_root(capture))
    assert topo.nodes
    assert topo.to_dict()["schema"] == "kfdtool.topology/1"
    if capture != "tinygrad-rx7900xtx-partial":
        assert not [p for n in topo.nodes for p in n.problems]


@pytest.mark.skipif(not SHARED_FIXTURES.is_dir(), reason="needs ../shared to compare against")
@pytest.mark.parametrize("capture", CAPTURES)
def test_shipped_presets_are_byte_copies(tmp_path, capture):
    from kfdtool.sim.machine import extract_capture
    extract_capture(capture, tmp_path)
    cmp = filecmp.dircmp(SHARED_FIXTURES / capture, tmp_path)
    stack = [cmp]
    while stack:
        d = stack.pop()
        assert not d.left_only and not d.right_only and not d.diff_files, d.left
        _, mismatch, errors = filecmp.cmpfiles(d.left, d.right, d.common_files, shallow=False)
        assert not mismatch and not errors
        stack.extend(d.subdirs.values())


def test_hidden_gpu_node(capture_root, monkeypatch):
    """EPERM from the device cgroup: the node is reported hidden, the rest still parses."""
    import os
    root = capture_root("k8sdp-mi308x-8x-cpx")
    real_open = os.open

    def guarded(path, *a, **k):
        if "/nodes/5/" in str(path):
            raise PermissionError(1, "Operation not permitted", str(path))
        return real_open(path, *a, **k)
    monkeypatch.setattr(os, "open", guarded)
    topo = read_topology(root)
    assert topo.nodes[5].hidden and not topo.nodes[4].hidden
    assert len(list(topo.for_each_gpu())) == 32


def test_generation_change_is_retried(capture_root, monkeypatch):
    import kfdtool.topology as t
    values = iter([1, 2, 2, 2])
    monkeypatch.setattr(t, "read_int", lambda path: next(values) if path.name == "generation_id" else None)
    topo = t.read_topology(capture_root("k8sdp-vega10-1gpu"))
    assert topo.generation_id == 2 and not topo.problems
    values2 = iter(range(100))
    monkeypatch.setattr(t, "read_int", lambda path: next(values2) if path.name == "generation_id" else None)
    topo = t.read_topology(capture_root("k8sdp-mi210-8x-xgmi"), retries=3)
    assert "kept changing" in topo.problems[0]


def test_missing_roots(tmp_path):
    with pytest.raises(SysfsError, match="does not exist"):
        read_topology(tmp_path / "nope")
    with pytest.raises(SysfsError, match="no KFD"):
        read_topology(tmp_path)


def test_dangling_link_targets_are_tolerated(tmp_path, capture_root):
    root = capture_root("k8sdp-vega10-1gpu")
    copy = tmp_path / "copy"
    import shutil
    shutil.copytree(root, copy, symlinks=False)
    link = copy / "class/kfd/kfd/topology/nodes/1/io_links/0"
    shutil.rmtree(link)
    link.symlink_to(tmp_path / "gone")
    topo = read_topology(copy)
    assert topo.nodes[1].io_links == [] and topo.nodes[1].gpu_id == 13261


def test_helpers():
    assert gfx_name(90402) == "gfx942" and gfx_name(90010) == "gfx90a" and gfx_name(120001) == "gfx1201"
    assert gfx_name(None) is None and decode_oem(0) is None
    assert decode_oem(71791775140929) == "ALASKA"


def test_packaged_tarballs_exist():
    from importlib import resources
    files = {p.name for p in resources.files("kfdtool.sim").joinpath("presets").iterdir()}
    assert {f"{c}.tar.gz" for c in CAPTURES} <= files
    for c in CAPTURES:
        with resources.as_file(resources.files("kfdtool.sim").joinpath("presets").joinpath(f"{c}.tar.gz")) as p:
            assert tarfile.open(p).getmembers()


@pytest.mark.parametrize("node", [4, 5, 6])
def test_cwsr_formula_equals_published_sizes(capture_root, node):
    """MI300X (gfx942), MI350X (gfx950), RX 9070 XT (gfx1201): the kernel formula reproduces the
    cwsr_size / ctl_stack_size these nodes publish."""
    from kfdtool.cwsr.sizing import cwsr_sizes, formula
    props = read_topology(capture_root("rocprofsdk-composite")).nodes[node].props
    computed = formula(props)
    assert (computed.cwsr_size, computed.ctl_stack_size) == (props["cwsr_size"], props["ctl_stack_size"])
    assert cwsr_sizes(props).source == "sysfs"
