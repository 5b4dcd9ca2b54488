"""No circular checks between the simulator and kfdtool's CWSR formula.

The simulated kernel computes a node's CWSR sizes with its own code (kfd_queue.c:
kfd_queue_ctx_save_restore_size), checks CREATE_QUEUE against them (kfd_queue.c:
kfd_queue_acquire_buffers), and its sysfs carries cwsr_size / ctl_stack_size only where a real
kernel published them (kfd_topology.c: node_show). So kfdtool's formula agreeing with the
simulator, and the simulator agreeing with published captures, are real checks."""
import ast
import errno
import json
from pathlib import Path

import pytest

from conftest import run_cli
from kfdtool import errors
from kfdtool.cwsr.sizing import formula
from kfdtool.ioctls import constants as c
from kfdtool.sim.cwsr import node_cwsr, queue_save_area_bytes
from kfdtool.sim.machine import PRESETS, PROFILES, extract_capture, materialize
from kfdtool.sysfs import parse_properties

SIM_PACKAGE = Path(__file__).resolve().parents[1] / "kfdtool" / "sim"
CAPTURES = sorted({p.capture for p in PRESETS.values()})
CWSR_KEYS = ("cwsr_size", "ctl_stack_size")


def _gpu_nodes(topology):
    """{node name: properties} of the GPU nodes of a topology directory."""
    nodes = {}
    for path in sorted(Path(topology).glob("nodes/*/properties")):
        props = parse_properties(path.read_text())
        if props.get("simd_count", 0) > 0:
            nodes[path.parent.name] = props
    return nodes


@pytest.fixture(scope="module")
def captures(tmp_path_factory):
    """Every shipped capture, unpacked once: {capture: {node: properties}} of its GPU nodes."""
    root = tmp_path_factory.mktemp("captures")
    return {capture: _gpu_nodes(extract_capture(capture, root / capture)) for capture in CAPTURES}


@pytest.mark.parametrize("path", sorted(SIM_PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_the_simulator_never_imports_kfdtools_cwsr_formula(path):
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            imported.add(f"{'.' * node.level}{node.module or ''}")
            imported.update(f"{'.' * node.level}{node.module or ''}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
    assert not {m for m in imported if "cwsr.sizing" in m or "cwsr.params" in m or m.endswith("..cwsr")}


def test_kfdtools_formula_equals_the_simulated_kernel_on_every_shipped_gpu(captures):
    """Two implementations of kfd_queue_ctx_save_restore_size, written apart, give the same four
    sizes on each of the shipped GPU nodes (gfx900 to gfx1201, 1 to 8 XCCs)."""
    compared = 0
    for capture, nodes in captures.items():
        for name, props in nodes.items():
            ours, kernels = formula(props), node_cwsr(props)
            assert (ours is None) == (kernels is None), (capture, name)
            if ours is None:
                continue
            assert (ours.ctl_stack_size, ours.cwsr_size, ours.debug_memory_size, ours.wg_data_size) == \
                   (kernels.ctl_stack_size, kernels.cwsr_size, kernels.debug_memory_size, kernels.wg_data_size), \
                   (capture, name)
            assert ours.queue_mapping_bytes == queue_save_area_bytes(kernels, kernels.cwsr_size)
            compared += 1
    assert compared >= 100          # every partition node of the MI300X/MI308X captures, not a handful


def test_the_simulated_kernel_reproduces_what_real_kernels_published(captures):
    """MI300X (gfx942, 8 XCCs), MI350X (gfx950) and RX 9070 XT (gfx1201) nodes of the composite
    capture carry the sizes their kernels printed; the simulator computes the same."""
    published = {name: props for name, props in captures["rocprofsdk-composite"].items()
                 if all(k in props for k in CWSR_KEYS)}
    assert {props["gfx_target_version"] for props in published.values()} == {90402, 90500, 120001}
    for props in published.values():
        sizes = node_cwsr(props)
        assert (sizes.cwsr_size, sizes.ctl_stack_size) == (props["cwsr_size"], props["ctl_stack_size"])


@pytest.mark.parametrize("preset", ["mi308x", "composite", "mi300x"])
def test_sysfs_carries_cwsr_sizes_only_where_the_capture_has_them(preset, tmp_path, captures):
    """A 7.2 kernel prints the keys on every node, but the simulator prints only what a real kernel
    published: each node has them exactly when its capture did, with the captured values."""
    topology = materialize(preset, tmp_path / "sys", PROFILES["1.23"])
    nodes = _gpu_nodes(topology)
    source = captures[PRESETS[preset].capture]
    for name, props in nodes.items():
        captured = source["4"] if preset == "mi300x" else source[name]     # mi300x: 8 copies of node 4
        assert {k: props.get(k) for k in CWSR_KEYS} == {k: captured.get(k) for k in CWSR_KEYS}, name
    assert any(all(k in p for k in CWSR_KEYS) for p in nodes.values()) == (preset != "mi308x")


def test_a_kernel_before_the_keys_does_not_print_them(tmp_path):
    """Linux 6.1 (KFD 1.11) has no cwsr_size / ctl_stack_size in node_show: a capture's values go."""
    nodes = _gpu_nodes(materialize("composite", tmp_path / "sys", PROFILES["1.11"]))
    assert nodes and not any(k in props for props in nodes.values() for k in CWSR_KEYS)


def test_cwsr_source_is_formula_where_no_kernel_published(sim_dir):
    """`kfdtool --sim mi308x cwsr`: the MI308X capture publishes no sizes, so every row is kfdtool's
    formula; on the composite machine, exactly the published nodes say sysfs."""
    from kfdtool.sim import runner
    runner.stop("composite")             # a running one may speak another ABI; a stopped one is 7.2's tree
    mi308x = json.loads(run_cli("--sim", "mi308x", "cwsr", "--json").stdout)
    assert mi308x["gpus"] and {g["source"] for g in mi308x["gpus"]} == {"formula"}
    table = run_cli("--sim", "mi308x", "cwsr").stdout
    assert "formula" in table and "sysfs" not in table
    composite = json.loads(run_cli("--sim", "composite", "cwsr", "--json").stdout)
    by_source = {g["gfx_name"]: g["source"] for g in composite["gpus"] if g["source"]}
    assert by_source == {"gfx906": "formula", "gfx1102": "formula", "gfx1032": "formula",
                         "gfx942": "sysfs", "gfx950": "sysfs", "gfx1201": "sysfs"}


def test_create_queue_accepts_kfdtools_formula_and_refuses_one_page_off(sim_dir):
    """The simulated kernel checks CREATE_QUEUE against its own sizes: a save area sized by
    kfdtool's formula on a node that publishes nothing is accepted, a ctl_stack_size one page off
    is EINVAL (kfd_queue_acquire_buffers: it must equal the node's)."""
    from simhelpers import Client, start
    cl = Client(start("mi308x"))
    try:
        gpu = cl.rt.topology.find_gpu(cl.gpus[0])
        assert "cwsr_size" not in gpu.props
        sizes = formula(gpu.props)

        def create(ctl_stack_size):
            ring, rptr, wptr = (cl.rt.alloc(gpu.gpu_id, n, map_to_gpu=True) for n in (1 << 16, 4096, 4096))
            args = cl.kfd.abi.layout("kfd_ioctl_create_queue_args")(
                ring_base_address=ring, write_pointer_address=wptr, read_pointer_address=rptr, ring_size=1 << 16,
                gpu_id=gpu.gpu_id, queue_type=c.KFD_IOC_QUEUE_TYPE_COMPUTE_AQL, queue_percentage=100,
                queue_priority=7, ctx_save_restore_address=cl.rt.alloc(gpu.gpu_id, sizes.queue_mapping_bytes,
                                                                                   map_to_gpu=True),
                ctx_save_restore_size=sizes.cwsr_size, ctl_stack_size=ctl_stack_size)
            cl.kfd.ioctl("CREATE_QUEUE", args)
            return args.queue_id

        qid = create(sizes.ctl_stack_size)
        cl.kfd.ioctl("DESTROY_QUEUE", cl.kfd.abi.layout("kfd_ioctl_destroy_queue_args")(qid, 0))
        with pytest.raises(errors.KfdIoctlError) as refused:
            create(sizes.ctl_stack_size + 4096)
        assert refused.value.errno == errno.EINVAL
    finally:
        cl.close()
