"""Hypothesis fuzzing of every sysfs parser: never crash; a clear error or a partial result."""
import contextlib
import os
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kfdtool.cwsr.params import read_parameters
from kfdtool.cwsr.sizing import cwsr_sizes
from kfdtool.processes import scan_processes
from kfdtool.sysfs import parse_properties
from kfdtool.topology import read_topology

junk = st.binary(max_size=300)
lines = st.lists(st.tuples(st.sampled_from(["simd_count", "num_xcc", "gfx_target_version", "simd_per_cu",
                                            "array_count", "location_id", "domain", "hive_id", "sibling_map",
                                            "type", "node_to", "size_in_bytes", "weird key", ""]),
                           st.one_of(st.integers(-2**70, 2**70).map(str), st.text(max_size=12))), max_size=20)
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(st.text(max_size=500))
def test_parse_properties_never_crashes(text):
    props = parse_properties(text)
    assert all(isinstance(k, str) and " " not in k for k in props)


@FUZZ
@given(lines)
def test_cwsr_sizes_never_crash(pairs):
    props = parse_properties("\n".join(f"{k} {v}" for k, v in pairs))
    sizes = cwsr_sizes(props)
    assert sizes is None or sizes.ctl_stack_size >= 0


def _write_tree(root, files):
    for rel, data in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if isinstance(data, str):
            os.makedirs(path, exist_ok=True)       # a directory where a file belongs
        else:
            with open(path, "wb") as f:
                f.write(data)


@contextlib.contextmanager
def _sysfs_root(under, files):
    """A temporary sysfs root with a KFD topology directory and `files` written below `under`
    (hypothesis reruns a test many times, so no function-scoped tmp_path)."""
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "class/kfd/kfd/topology"))
        _write_tree(os.path.join(root, under), files)
        yield root


topology_files = st.dictionaries(
    st.sampled_from(["generation_id", "system_properties", "nodes/0/properties", "nodes/1/properties",
                     "nodes/1/gpu_id", "nodes/1/name", "nodes/1/io_links/0/properties",
                     "nodes/1/caches/0/properties", "nodes/1/mem_banks/0/properties",
                     "nodes/1/mem_banks/0/used_memory", "nodes/x/properties", "nodes/2"]),
    st.one_of(junk, lines.map(lambda p: "\n".join(f"{k} {v}" for k, v in p).encode()), st.just("dir")),
    max_size=10)


@FUZZ
@given(topology_files)
def test_read_topology_never_crashes(files):
    with _sysfs_root("class/kfd/kfd/topology", files) as root:
        topo = read_topology(root, retries=1)
        for node in topo.nodes:
            node.to_dict()
        topo.to_dict()


proc_files = st.dictionaries(
    st.sampled_from(["123/pasid", "123/vram_5", "123/sdma_5", "123/stats_5/evicted_ms", "123/stats_5/cu_occupancy",
                     "123/counters_5/faults", "123/queues/0/size", "123/queues/0/type", "123/queues/0/gpuid",
                     "123/queues/x/size", "456/queues/3/type", "abc/vram_1", "123/vram_x"]),
    st.one_of(junk, st.integers(-5, 2**65).map(lambda i: str(i).encode())), max_size=10)


@FUZZ
@given(proc_files)
def test_scan_processes_never_crashes(files):
    with _sysfs_root("class/kfd/kfd/proc", files) as root:
        scan_processes(root, with_identity=False).to_dict()


@FUZZ
@given(st.dictionaries(st.sampled_from(["cwsr_enable", "sched_policy", "debug_evictions"]), junk, max_size=3))
def test_read_parameters_never_crashes(files):
    with _sysfs_root("module/amdgpu/parameters", files) as root:
        assert set(read_parameters(root)) >= set(files)
