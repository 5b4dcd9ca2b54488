"""DBG_TRAP SET_FLAGS against the Linux kernel (drivers/gpu/drm/amd/amdkfd/kfd_debug.c:
kfd_dbg_trap_set_flags; kfd_chardev.c: kfd_ioctl_set_debug_trap). A flag is refused with EACCES
when any GPU of the target lacks the topology capability for it; the previous flags come back
either way; SET_FLAGS on a target whose runtime is off is EPERM before any flag is looked at.
The test process is the debugged process, on its own simulated machines."""
import errno
import os

import pytest

from kfdtool import errors
from kfdtool.device import dbg_trap_args
from kfdtool.ioctls import constants as c
from kfdtool.ioctls import structs as s
from kfdtool.sim import runner
from simhelpers import Client, start

MEM = c.KFD_DBG_TRAP_FLAG_SINGLE_MEM_OP
ALU = c.KFD_DBG_TRAP_FLAG_SINGLE_ALU_OP
LDS = c.KFD_DBG_TRAP_FLAG_LDS_OUT_OF_ADDR_RANGE          # KFD 1.21
NO_CAPABILITY_BIT = 0x100                                 # a flag no kernel defines
PRECISE_MEMORY_CAP = 0x00040000     # kfd_sysfs.h: HSA_CAP_TRAP_DEBUG_PRECISE_MEMORY_OPERATIONS_SUPPORTED
RUNTIME_OFF, RUNTIME_ON = 0, c.KFD_RUNTIME_ENABLE_MODE_ENABLE_MASK


def set_flags(client, flags):
    """SET_FLAGS on this process: (0 or the errno, the flags the kernel wrote back). kfd_ioctl
    copies the argument back with an error too, so the flags are read either way."""
    arg = dbg_trap_args("SET_FLAGS", os.getpid(), "set_flags", flags=flags)
    try:
        client.kfd.ioctl("DBG_TRAP", arg)
    except errors.KfdIoctlError as e:
        return e.errno, arg.set_flags.flags
    return 0, arg.set_flags.flags


def runtime_enable(client, mode):
    client.kfd.ioctl("RUNTIME_ENABLE", s.kfd_ioctl_runtime_enable_args(0, mode, 0))


def remaps(client, gpu):
    return client.ctl("status")["remaps"][str(gpu)]


# --- mi308x (conftest's `client`, KFD 1.23): GC 9.4.3, PRECISE_MEMORY but not PRECISE_ALU --------
def test_a_supported_flag_is_taken_and_the_previous_flags_come_back(client):
    """kfd_dbg_trap_set_flags: the flags are stored and the previous ones written back; a per-VMID
    GPU under HWS (GC 9.4.3) takes them through a runlist refresh (debug_refresh_runlist)."""
    gpu = client.gpus[0]
    client.enable_debug()
    try:
        before = remaps(client, gpu)
        assert set_flags(client, MEM) == (0, 0)
        assert remaps(client, gpu) == before + 1
        assert set_flags(client, 0) == (0, MEM)
    finally:
        client.dbg("DISABLE")


def test_a_flag_the_gpu_lacks_is_eacces_and_the_flags_stay(client):
    """kfd_dbg_trap_set_flags: SINGLE_ALU_OP without HSA_CAP_TRAP_DEBUG_PRECISE_ALU_OPERATIONS_SUPPORTED,
    or (since 1.21) LDS_OUT_OF_ADDR_RANGE without HSA_CAP2_TRAP_DEBUG_LDS_OUT_OF_ADDR_RANGE_SUPPORTED,
    is -EACCES with the previous flags written back, nothing stored and no runlist refreshed."""
    gpu = client.gpus[0]
    client.enable_debug()
    try:
        assert set_flags(client, MEM) == (0, 0)
        before = remaps(client, gpu)
        assert set_flags(client, MEM | ALU) == (errno.EACCES, MEM)
        assert set_flags(client, LDS) == (errno.EACCES, MEM)
        assert remaps(client, gpu) == before
        assert set_flags(client, 0) == (0, MEM)          # still the flags set before the refusals
    finally:
        client.dbg("DISABLE")


def test_a_bit_without_a_capability_is_stored_as_given(client):
    """kfd_dbg_trap_set_flags checks only the flags that have a capability bit and stores *flags
    whole: an undefined bit is neither refused nor dropped."""
    client.enable_debug()
    try:
        assert set_flags(client, NO_CAPABILITY_BIT | MEM) == (0, 0)
        assert set_flags(client, 0) == (0, NO_CAPABILITY_BIT | MEM)
    finally:
        client.dbg("DISABLE")


def test_with_the_runtime_off_set_flags_is_eperm_before_the_flags_are_checked(client):
    """kfd_chardev.c: kfd_ioctl_set_debug_trap answers -EPERM for SET_FLAGS while the target's
    runtime_state is not ENABLED, before kfd_dbg_trap_set_flags runs: a flag the GPU would refuse
    gets EPERM too, and the argument comes back as it was given."""
    runtime_enable(client, RUNTIME_OFF)                   # not debugged: returns at once
    try:
        client.enable_debug()                             # activation waits for the runtime
        assert set_flags(client, ALU) == (errno.EPERM, ALU)
        assert set_flags(client, MEM) == (errno.EPERM, MEM)
    finally:
        client.dbg("DISABLE")
        runtime_enable(client, RUNTIME_ON)                # as other tests expect


# --- composite (KFD 1.23): Radeon VII, Navi23 and Navi33 lack PRECISE_MEMORY, MI300X and MI350X have it
@pytest.fixture(scope="module")
def composite(sim_dir):
    yield start("composite")
    runner.stop("composite")              # other tests start it with another ABI


def test_one_gpu_without_the_capability_refuses_the_flag_for_the_whole_process(composite):
    """kfd_dbg_trap_set_flags checks every device of the target (its pdds: each GPU it opened):
    SINGLE_MEM_OP is -EACCES while any of them lacks PRECISE_MEMORY in its sysfs capability, even
    though others have it."""
    cl = Client(composite)
    try:
        caps = [n.props.get("capability", 0) & PRECISE_MEMORY_CAP for n in cl.rt.topology.for_each_gpu()]
        assert any(caps) and not all(caps)
        cl.enable_debug()
        assert set_flags(cl, NO_CAPABILITY_BIT) == (0, 0)
        assert set_flags(cl, MEM) == (errno.EACCES, NO_CAPABILITY_BIT)
        assert set_flags(cl, 0) == (0, NO_CAPABILITY_BIT)
    finally:
        cl.close()


# --- mi300x-cpx under KFD 1.17 (Linux 6.12) -----------------------------------------------------------
def test_before_1_21_the_lds_flag_is_not_checked(sim_dir):
    """Linux 6.12 (KFD 1.17): kfd_dbg_trap_set_flags checks SINGLE_MEM_OP and SINGLE_ALU_OP only;
    the capability2 check came with LDS_OUT_OF_ADDR_RANGE in 1.21, so there bit 4 is stored like
    any other, while SINGLE_ALU_OP is still refused on GC 9.4.3."""
    machine = start("mi300x-cpx", "1.17")
    cl = Client(machine)
    try:
        cl.enable_debug()
        assert set_flags(cl, LDS) == (0, 0)
        assert set_flags(cl, ALU) == (errno.EACCES, LDS)
        assert set_flags(cl, 0) == (0, LDS)
    finally:
        cl.close()
        runner.stop("mi300x-cpx")         # other tests start it with another ABI
