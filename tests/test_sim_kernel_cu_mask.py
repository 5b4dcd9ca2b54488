"""SET_CU_MASK and the debugger's CU workaround against the Linux kernel's rules, on the composite
machine, whose GPUs span GC 9 (Radeon VII, MI300X, MI350X), GC 10.3 (Navi23), GC 11.0.2 (Navi33)
and GC 12.0.1 (RX 9070 XT). Each test names the kernel file and function it follows
(drivers/gpu/drm/amd/amdkfd/)."""
import ctypes

import pytest

from kfdtool import errors
from kfdtool.ioctls import constants as c
from kfdtool.ioctls import structs as s
from kfdtool.sim import runner
from simhelpers import Client, start


@pytest.fixture(scope="module")
def sim(sim_dir):
    yield start("composite")
    runner.stop("composite")              # other tests start it with another ABI


@pytest.fixture
def client(sim):
    cl = Client(sim)
    yield cl
    cl.close()


def gpu_of(client, gfx_target_version):
    return next(n.gpu_id for n in client.rt.topology.for_each_gpu()
                if n.props.get("gfx_target_version") == gfx_target_version)


def set_cu_mask(client, qid, *words, bits=None):
    mask = (ctypes.c_uint32 * len(words))(*words)
    client.kfd.ioctl("SET_CU_MASK", s.kfd_ioctl_set_cu_mask_args(
        queue_id=qid, num_cu_mask=bits if bits is not None else 32 * len(words), cu_mask_ptr=ctypes.addressof(mask)))


def enable_debug_with_runtime_info(client):
    info = s.kfd_runtime_info()
    client.dbg("ENABLE", "enable", dbg_fd=client.kfd.fd, rinfo_ptr=ctypes.addressof(info),
               rinfo_size=ctypes.sizeof(info))
    return info


@pytest.mark.parametrize("gfx, pairs", [(90006, False), (90402, False), (90500, False),
                                        (100302, True), (110002, True), (120001, True)])
def test_half_enabled_cu_pair_is_einval_from_gc10_to_before_12_1(client, gfx, pairs):
    """kfd_process_queue_manager.c: pqm_update_mqd: on GC 10.0.0 up to (not incl.) 12.1.0 every
    pair of CUs (a WGP) must be both on or both off, else -EINVAL; older GPUs take any mask."""
    qid = client.rt.create_queue(gpu_of(client, gfx))
    set_cu_mask(client, qid, 0x3, 0xC000_0000)                # whole pairs: fine everywhere
    half_pairs = [(0x1,), (0x2,), (0x3, 0x8000_0000)]        # CU 0, CU 1, CU 63 without its pair
    for words in half_pairs:
        if pairs:
            with pytest.raises(errors.InvalidArgument):
                set_cu_mask(client, qid, *words)
        else:
            set_cu_mask(client, qid, *words)


def test_mask_bits_beyond_1024_are_not_checked(client):
    """kfd_chardev.c: kfd_ioctl_set_cu_mask cuts num_cu_mask to 1024 bits (max_num_cus) before
    copying the words in, so pqm_update_mqd's pair check never sees the rest."""
    qid = client.rt.create_queue(gpu_of(client, 110002))
    words = [0x3] * 32 + [0x1]                                # word 32 = bits 1024..1055
    set_cu_mask(client, qid, *words)


def test_cu_mask_of_an_unknown_queue_is_efault(client):
    """kfd_process_queue_manager.c: pqm_update_mqd: no queue with this id -> -EFAULT."""
    with pytest.raises(errors.BadAddress):
        set_cu_mask(client, 1000, 0x3)


@pytest.mark.parametrize("bits", [0, 31, 48])
def test_cu_mask_bit_count_must_be_a_nonzero_multiple_of_32(client, bits):
    """kfd_chardev.c: kfd_ioctl_set_cu_mask: num_cu_mask 0 or not a multiple of 32 -> -EINVAL,
    checked before the queue is looked up."""
    with pytest.raises(errors.InvalidArgument):
        set_cu_mask(client, 1000, 0x3, 0x3, bits=bits)


def test_cu_mask_is_busy_while_the_debugger_masks_cus_on_gc11_0(client):
    """kfd_process_queue_manager.c: pqm_update_mqd: -EBUSY for a queue with is_dbg_wa, which
    kfd_device_queue_manager.c: create_queue_cpsch sets for a debugged process's queue on
    GC 11.0.0-11.0.3 (kfd_debug.h: kfd_dbg_has_cwsr_workaround) and kfd_debug.c:
    kfd_dbg_trap_deactivate clears when the debugger leaves. Other GPUs are not affected."""
    navi33, navi23 = gpu_of(client, 110002), gpu_of(client, 100302)
    client.enable_debug()
    masked, unaffected = client.rt.create_queue(navi33), client.rt.create_queue(navi23)
    with pytest.raises(errors.Busy):
        set_cu_mask(client, masked, 0x3)
    set_cu_mask(client, unaffected, 0x3)
    client.dbg("DISABLE")
    set_cu_mask(client, masked, 0x3)


def test_debugger_activation_on_a_user_cu_masked_queue_is_enabled_busy(client):
    """kfd_debug.c: kfd_dbg_trap_enable activates a runtime-enabled target at once, ignoring the
    result; kfd_dbg_set_workaround fails with -EBUSY on a queue with a user CU mask, unwinds and
    sets runtime_state ENABLED_BUSY, which ENABLE copies out; the hardware ops then need
    runtime_state ENABLED (kfd_chardev.c: kfd_ioctl_set_debug_trap: -EPERM). Since no workaround
    was applied, the CU mask can still be changed."""
    qid = client.rt.create_queue(gpu_of(client, 110002))
    set_cu_mask(client, qid, 0x3)
    info = enable_debug_with_runtime_info(client)
    assert info.runtime_state == c.DEBUG_RUNTIME_STATE_ENABLED_BUSY
    with pytest.raises(errors.PermissionDenied):
        client.suspend([qid])
    set_cu_mask(client, qid, 0xF)
    client.dbg("DISABLE")
    client.rt.destroy_queue(qid)
    info = enable_debug_with_runtime_info(client)         # kfd_dbg_trap_disable set it back to ENABLED
    assert info.runtime_state == c.DEBUG_RUNTIME_STATE_ENABLED
