"""The simulated kernel depends only on the wire format (issue 9).

The simulator stands for the kernel: tests that compare kfdtool against it are real checks only if
its kernel side never runs kfdtool's own logic (its sysfs parser, topology reader, CWSR formula,
error tree). Its kernel side may import the stdlib, ioctl-opt, kfdtool.ioctls (ctypes structs,
enums, request numbers: the ABI both sides share, as uapi/linux/kfd_ioctl.h is shared) and
kfdtool.pids (a stdlib-only pidfd helper: process liveness, not KFD logic). Its user-space side
(client.py, control.py, runner.py, workload.py, hip.py: the stand-in for libhsakmt/HIP) may use kfdtool."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "kfdtool"
KERNEL_SIDE = ("kernel", "dbg_trap", "smi", "memory", "state", "timing", "proc_sysfs", "machine", "server",
               "cwsr", "nodes", "errors", "protocol", "execution", "clock")
USER_SIDE = ("client", "control", "runner", "workload", "hip")
# What the kernel side may import from kfdtool, besides its own kernel-side modules.
ALLOWED = ("kfdtool.ioctls", "kfdtool.pids", "kfdtool.ratelog", "kfdtool.selectloop")


def module_path(name):
    """The source file of a kfdtool module name, or None if it names no module (an attribute)."""
    base = PACKAGE.parent.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def kfdtool_imports(name):
    """Every kfdtool module that module `name` imports (at any depth of its code, so an import
    inside a function counts), with the packages above each (importing a module runs them)."""
    path = module_path(name)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                origin = f"{base}.{node.module}" if node.module else base
            else:
                origin = node.module
            # `from X import y`: y is a submodule when it has a file, else an attribute of X
            targets = [origin] + [f"{origin}.{alias.name}" for alias in node.names
                                  if module_path(f"{origin}.{alias.name}")]
        else:
            continue
        for target in targets:
            if target == "kfdtool" or target.startswith("kfdtool."):
                parts = target.split(".")
                found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return {m for m in found if module_path(m)}


def allowed(module):
    if module in ("kfdtool", "kfdtool.sim"):            # package __init__ files: checked like the rest
        return True
    if any(module == a or module.startswith(a + ".") for a in ALLOWED):
        return True
    return module.startswith("kfdtool.sim.") and module.rsplit(".", 1)[1] in KERNEL_SIDE


def forbidden_imports(start):
    """{importer: {forbidden kfdtool module}} over everything `start` pulls in, transitively
    (an allowed module that imported kfdtool logic would smuggle it in)."""
    seen, pending, bad = set(), [start], {}
    while pending:
        module = pending.pop()
        if module in seen:
            continue
        seen.add(module)
        for imported in kfdtool_imports(module):
            if allowed(imported):
                pending.append(imported)
            else:
                bad.setdefault(module, set()).add(imported)
    return bad


def test_every_simulator_module_is_classified():
    """A new module under kfdtool/sim must be put on one side, so this test keeps covering it."""
    modules = {p.stem for p in (PACKAGE / "sim").glob("*.py")} - {"__init__"}
    assert modules == set(KERNEL_SIDE) | set(USER_SIDE)


@pytest.mark.parametrize("module", KERNEL_SIDE)
def test_the_simulated_kernel_imports_only_the_wire_format(module):
    assert forbidden_imports(f"kfdtool.sim.{module}") == {}


def test_the_scan_sees_what_kfdtool_logic_would_be_imported():
    """The scan itself: the user-space side does use kfdtool (workload.py builds queues with
    KfdDevice), so a scan that found nothing there would be blind."""
    assert "kfdtool.device" in forbidden_imports("kfdtool.sim.workload")["kfdtool.sim.workload"]


def test_the_running_simulator_loads_no_kfdtool_logic():
    """What the server process really loads (dynamic imports included): nothing from kfdtool
    outside the simulator's kernel side, the wire format and the pid helper."""
    code = ("import sys, kfdtool.sim.server\n"
            "print('\\n'.join(m for m in sys.modules if m == 'kfdtool' or m.startswith('kfdtool.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent).stdout.split()
    assert "kfdtool.sim.kernel" in out
    assert [m for m in out if not allowed(m)] == []
