"""`kfdtool cwsr --probe`: which preemption mechanisms would work here, per GPU and for a target
process, and why the others would not. Opens /dev/kfd only to ask GET_VERSION and to probe the
patched-driver ioctls (skipped with open_device=False)."""
import os

from ..errors import Error
from ..topology import read_topology
from . import debugtrap, patched, update_queue
from .params import read_parameters
from .sizing import cwsr_sizes


def probe(ctx, target_pid=None, open_device=True):
    params = read_parameters(ctx.sysfs)
    topo = read_topology(ctx.sysfs)
    gpus = []
    for node in topo.for_each_gpu():
        gfxv = node.gfx_target_version or 0
        sizes = None if node.hidden else cwsr_sizes(node.props)
        gpus.append({"gpu_id": node.gpu_id, "gfx_name": node.gfx_name,
                     "scheduler": "no HWS" if params.get("sched_policy") == 2 else ("MES" if gfxv >= 110000 else "HWS"),
                     "grace_period_honoured": gfxv < 110000 and params.get("sched_policy") != 2,
                     "cwsr": bool(params.get("cwsr_enable", 1)) and sizes is not None,
                     "max_save_bytes_per_queue": sizes.max_save_bytes if sizes else None,
                     "debugger_supported": gfxv >= 90000})
    report = {"schema": "kfdtool.probe/1", "target_pid": target_pid, "gpus": gpus, "mechanisms": [], "notes": []}
    not_kfd = None
    if target_pid is not None and not (ctx.sysfs.proc / str(target_pid)).is_dir():
        not_kfd = f"pid {target_pid} {ctx.not_kfd_process(target_pid)}"
        report["notes"].append(not_kfd)
    kfd, abi_minor = None, None
    if open_device:
        try:
            kfd = ctx.open_device()
            abi_minor = kfd.abi.minor
            report["kfd_abi"] = str(kfd.abi)
        except Error as e:
            report["notes"].append(f"/dev/kfd not opened: {e}")
    else:
        report["notes"].append("/dev/kfd not opened: ABI version and patched ioctls not probed")
    try:
        gfx = [n.gfx_target_version for n in topo.for_each_gpu() if n.gfx_target_version]
        for found in (debugtrap.availability(abi_minor, params.get("sched_policy"), gfx, target_pid),
                      update_queue.availability(target_pid)):
            if not_kfd and found.available:        # no queues to act on, whatever the mechanism
                found.available, found.why = False, not_kfd
            report["mechanisms"].append(found.to_dict())
        for variant in patched.VARIANTS:
            report["mechanisms"].append(patched.availability(kfd, variant, target_pid).to_dict())
    finally:
        if kfd is not None:
            kfd.close()
    if params.get("cwsr_enable") == 0:
        report["notes"].append("cwsr_enable=0: preempted waves are drained, not saved (latency = longest wave)")
    if target_pid == os.getpid():
        report["notes"].append("the target is this process")
    return report
