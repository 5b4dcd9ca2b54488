"""The one backend seam: KfdDevice does its I/O through a backend object (ioctl, fd, process
memory) and neither it nor kfdtool/cwsr/ knows that a simulator exists; every mechanism has the
same suspend(qids, grace_period) and answers a MechanismResult; dbg_trap refuses misspelt fields."""
import ast
import ctypes
import inspect
import os
import re
from pathlib import Path

import pytest

from kfdtool.cwsr.debugtrap import DebugTrapSuspend
from kfdtool.cwsr.mechanisms import Mechanism, MechanismResult
from kfdtool.cwsr.patched import PatchedIoctlSuspend
from kfdtool.cwsr.update_queue import OwnQueue, UpdateQueueSuspend
from kfdtool.device import DBG_TRAP_MEMBER_OF_OP, KfdDevice, OsBackend
from kfdtool.ioctls import constants as c

PACKAGE = Path(__file__).resolve().parents[1] / "kfdtool"


class RecordingBackend:
    """A backend that answers GET_VERSION with 1.23 and records every other ioctl it is sent."""
    fd = 99

    def __init__(self, memory=None):
        self.sent = []
        self.memory = memory or {}

    def ioctl(self, request, arg):
        if hasattr(arg, "major_version"):
            arg.major_version, arg.minor_version = 1, 23
        else:
            self.sent.append(bytes(arg))
        return 0

    def read_memory(self, pid, addr, length):
        return self.memory.get((pid, addr))

    def close(self):
        pass


def _code_identifiers(path):
    """Imported module names and every identifier used in code (comments and strings excluded)."""
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names.add(f"{'.' * node.level}{node.module or ''}")
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
    return names


@pytest.mark.parametrize("path", [PACKAGE / "device.py", *sorted((PACKAGE / "cwsr").glob("*.py"))],
                         ids=lambda p: p.name)
def test_device_and_cwsr_code_never_mention_the_simulator(path):
    """Not an import, not a class, not an attribute: the simulator reaches them only as a backend."""
    words = {word for name in _code_identifiers(path) for word in re.split(r"[._]", name)}
    assert not {w for w in words if w.lower() in ("sim", "simulator", "simulated", "machine") or w.startswith("Sim")}


def test_kfd_device_reads_process_memory_through_its_backend():
    backend = RecordingBackend({(4242, 0x1000): b"\x01\x02"})
    kfd = KfdDevice(backend)
    assert kfd.read_memory(4242, 0x1000, 2) == b"\x01\x02"
    assert kfd.read_memory(4242, 0x2000, 2) is None


def test_os_backend_reads_proc_pid_mem():
    """The real backend's process memory is /proc/<pid>/mem: our own buffer reads back, an
    unmapped address is None (not an exception)."""
    backend = OsBackend("/dev/null")                  # any openable node: only read_memory is used
    try:
        buf = ctypes.create_string_buffer(b"cwsr header", 16)
        assert backend.read_memory(os.getpid(), ctypes.addressof(buf), 11) == b"cwsr header"
        assert backend.read_memory(os.getpid(), 8, 16) is None
    finally:
        backend.close()


def test_dbg_trap_refuses_an_unknown_field_before_the_kernel_sees_it():
    backend = RecordingBackend()
    kfd = KfdDevice(backend)
    with pytest.raises(TypeError, match="has no field 'num_queue'.*num_queues"):
        kfd.dbg_trap("SUSPEND_QUEUES", 1, "suspend_queues", num_queue=3)
    with pytest.raises(ValueError, match="no member 'suspend_queue'"):
        kfd.dbg_trap("SUSPEND_QUEUES", 1, "suspend_queue", num_queues=3)
    with pytest.raises(ValueError, match="no operation 'SUSPEND'"):
        kfd.dbg_trap("SUSPEND", 1)
    with pytest.raises(TypeError, match="without a union member"):
        kfd.dbg_trap("DISABLE", 1, dbg_fd=3)
    assert backend.sent == []                                # nothing reached the backend
    _, arg = kfd.dbg_trap("SUSPEND_QUEUES", 7, "suspend_queues", num_queues=3, grace_period=5)
    assert (arg.pid, arg.suspend_queues.num_queues, arg.suspend_queues.grace_period) == (7, 3, 5)
    assert len(backend.sent) == 1


def test_dbg_trap_refuses_a_union_member_of_another_op():
    """kfd_chardev.c: kfd_ioctl_set_debug_trap reads the op's own union member: resume_queues'
    fields given to SUSPEND_QUEUES would be read as suspend_queues' (exception_mask, grace...)."""
    backend = RecordingBackend()
    kfd = KfdDevice(backend)
    with pytest.raises(ValueError, match="SUSPEND_QUEUES takes the union member 'suspend_queues', not 'resume_queues'"):
        kfd.dbg_trap("SUSPEND_QUEUES", 1, "resume_queues", num_queues=3)
    with pytest.raises(ValueError, match="DISABLE takes no union member, not 'enable'"):
        kfd.dbg_trap("DISABLE", 1, "enable")
    assert backend.sent == []
    for op, member in DBG_TRAP_MEMBER_OF_OP.items():     # every op's own member is accepted
        kfd.dbg_trap(op, 1, member)
    assert len(backend.sent) == len(DBG_TRAP_MEMBER_OF_OP) == len(c.kfd_dbg_trap_operations) - 1


@pytest.mark.parametrize("mechanism", [DebugTrapSuspend, UpdateQueueSuspend, PatchedIoctlSuspend])
def test_every_mechanism_has_one_suspend_and_resume_signature(mechanism):
    assert inspect.signature(mechanism.suspend) == inspect.signature(Mechanism.suspend)
    assert inspect.signature(mechanism.resume) == inspect.signature(Mechanism.resume)


def test_a_mechanism_without_a_grace_period_says_so_in_its_notes():
    """UPDATE_QUEUE has no grace period: asked for one, the result's notes say it was not applied."""
    kfd = KfdDevice(RecordingBackend())
    mech = UpdateQueueSuspend(kfd, [OwnQueue(0, 0x10000, 4096, compute=False)], read_wave_state=False)
    quiet, noted = mech.suspend([0]), mech.suspend([0], 10)
    assert isinstance(noted, MechanismResult) and noted.ok and quiet.notes == []
    assert ["UPDATE_QUEUE has no grace period" in n for n in noted.notes] == [True]
    resumed = mech.resume()
    assert [o.outcome for o in resumed.outcomes] == ["resumed"] and mech.suspended() == set()


def test_debug_trap_grace_on_an_mes_gpu_is_noted(sim_dir):
    """The composite machine has MES GPUs (gfx11, gfx12) and HWS ones (gfx9): a grace period on a
    queue of an MES GPU comes back with a note, learnt from the kernel's device snapshot."""
    from kfdtool.sim import runner
    from simhelpers import Client, start
    cl = Client(start("composite"))
    try:
        gfx = {n.gpu_id: n.gfx_target_version for n in cl.rt.topology.for_each_gpu()}
        mes_gpu = next(g for g, v in gfx.items() if v >= 110000)
        hws_gpu = next(g for g, v in gfx.items() if 90000 <= v < 110000)
        mes_q, hws_q = cl.rt.create_queue(mes_gpu), cl.rt.create_queue(hws_gpu)
        with DebugTrapSuspend(cl.kfd, os.getpid(), read_wave_state=False) as mech:
            assert mech.suspend([hws_q], 10).notes == []
            assert mech.suspend([mes_q]).notes == []                       # no grace asked, nothing to say
            noted = mech.suspend([mes_q], 10)
            assert noted.ok and noted.notes == ["the MES scheduler (gfx11+) ignores the grace period"]
            assert mech.resume().ok
        assert mech.mes_gpus() == {g for g, v in gfx.items() if v >= 110000}
    finally:
        cl.close()
        runner.stop("composite")            # other tests start it with another ABI
