"""amdgpu module parameters that decide whether and how queues can be preempted
(/sys/module/amdgpu/parameters, kfd-abi.md §6.1)."""
from ..sysfs import SysfsRoot, read_text

PARAMETERS = {
    "cwsr_enable": "1 = waves are saved to the CWSR area on preemption; 0 = queues must drain",
    "sched_policy": "0 = HWS with oversubscription, 1 = HWS without, 2 = no HWS (debug only: DBG_TRAP "
                    "suspend is refused)",
    "hws_max_conc_proc": "processes per HWS runlist quantum (-1 = number of KFD VMIDs)",
    "queue_preemption_timeout_ms": "HWS unmap timeout before the driver declares a hang and resets (writable)",
    "debug_evictions": "log every queue eviction with its pid",
    "max_num_of_queues_per_device": "queue limit per device",
}
SCHED_POLICIES = {0: "HWS", 1: "HWS (no oversubscription)", 2: "no HWS"}


def read_parameters(root=None):
    """name -> value (int where numeric, Y/N as bool, None where the file is missing)."""
    sysfs = root if isinstance(root, SysfsRoot) else SysfsRoot(root)
    values = {}
    for name in PARAMETERS:
        try:
            text = read_text(sysfs.amdgpu_parameters / name)
        except PermissionError:
            text = None
        if text is None:
            values[name] = None
            continue
        text = text.strip()
        if not text or not text.isprintable() or not text.isascii():
            values[name] = None            # empty (a FIFO), or bytes no kernel writes: unknown, never echoed
            continue
        if text in ("Y", "N"):
            values[name] = text == "Y"
        else:
            try:
                values[name] = int(text)
            except ValueError:
                values[name] = text
    return values
