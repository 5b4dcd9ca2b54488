"""Timing model of queue preemption on the simulated GPU. Every constant says where it comes from;
the ones we could not source are marked ESTIMATE and are parameters, not facts.

suspend latency = HWS unmap+map of the whole device + grace period (waves allowed to finish)
                  + CWSR save (resident wave state bytes / memory bandwidth)
resume latency  = HWS map + CWSR restore (the same bytes / bandwidth)

The caller really sleeps that long in its call (the reply names the moment it returns; the DQM
lock is device-wide, so other callers' costed calls wait for it too), which lets schedulers built
on the simulator feel realistic latencies. Work
running on an HWS device (execution.py) stalls for that long too, with or without the wait.
"""
import time
from dataclasses import dataclass

from . import clock

# Memory bandwidth per device model, bytes/s. MI300X: 5.3 TB/s HBM3 (AMD product page); the
# MI308X and MI210 values are their product pages' peak numbers (MI210: 1.6 TB/s).
HBM_BANDWIDTH = {29857: 5.3e12, 29858: 5.3e12, 29711: 1.6e12}     # device_id -> B/s
DEFAULT_BANDWIDTH = 1.0e12                                       # ESTIMATE for other GPUs
TOTAL_XCC = {29857: 8, 29858: 4}                                  # XCCs per physical device
HWS_REMAP_BASE_S = 40e-6            # ESTIMATE: UNMAP_QUEUES + QUERY_STATUS fence + new runlist
HWS_REMAP_PER_QUEUE_S = 1.5e-6      # ESTIMATE: per active queue in the runlist
MES_REMOVE_ADD_S = 60e-6            # ESTIMATE: MES REMOVE_QUEUE/ADD_QUEUE round trip
WAVES_PER_CU_GFX9 = 40              # formula's cu_num*40 wave slots (kfd_queue.c)


def bandwidth(node):
    """HBM bandwidth available to one topology node; partitions share their device's HBM."""
    device_id = node.props.get("device_id", 0)
    full = HBM_BANDWIDTH.get(device_id, DEFAULT_BANDWIDTH)
    return full * min(1.0, node.num_xcc / TOTAL_XCC.get(device_id, node.num_xcc))


def bytes_per_wave(node, cwsr):
    """Wave state CWSR saves per resident wave: a CU's context area over its wave slots."""
    if cwsr is None or not node.cu_count:
        return 0
    return cwsr.wg_data_size // max(1, node.cu_per_xcc) // WAVES_PER_CU_GFX9


def max_waves(node):
    return node.cu_count * WAVES_PER_CU_GFX9


@dataclass
class PreemptCost:
    remap_s: float = 0.0
    grace_s: float = 0.0
    save_s: float = 0.0
    restore_s: float = 0.0
    saved_bytes: int = 0

    @property
    def total_s(self):
        return self.remap_s + self.grace_s + self.save_s + self.restore_s


class TimingModel:
    def __init__(self, kfd, realtime=True):
        self.kfd = kfd
        self.realtime = realtime
        self.pending = PreemptCost()      # cost of the request being handled, slept by its caller
        self.pending_devices = set()      # devices whose queues were unmapped by this request
        self.last = PreemptCost()
        self.on_stall = None              # (gpu_id, seconds, now_ns): the execution model's stall
        self.catch_up = None              # (gpu_id, now_ns): the execution model brings resident_waves to now

    # --- per-device facts -------------------------------------------------------------------------
    def grace_seconds(self, dev, grace_period):
        """SCH_WAVE counts 1K GPU clocks, 8 bits wide; 0 is forced to 1; MES ignores it."""
        if grace_period is None or dev.uses_mes:
            return 0.0
        field = (grace_period or 1) & 0xFF
        clock_hz = (dev.node.props.get("max_engine_clk_fcompute") or 1500) * 1e6
        return field * 1024 / clock_hz

    # --- events -----------------------------------------------------------------------------------
    def device_remap(self, dev, grace_period=None):
        active = sum(1 for p in self.kfd.processes.values() for q in p.queues_on(dev.gpu_id) if q.is_active)
        cost = MES_REMOVE_ADD_S if dev.uses_mes else HWS_REMAP_BASE_S + HWS_REMAP_PER_QUEUE_S * active
        self.pending.remap_s += cost
        if not dev.uses_mes:
            self.pending_devices.add(dev)     # HWS: every process's queues on it stall meanwhile
        return cost

    def save_waves(self, dev, q, grace_period):
        """Waves still resident after the grace period are saved to the CWSR area (or drained
        when CWSR is off). Waves finish at a steady rate, so the grace period drains a share."""
        if self.catch_up is not None:     # the waves on slots at this moment, not at the last look
            self.catch_up(dev.gpu_id, clock.now_ns())
        grace = self.grace_seconds(dev, grace_period)
        self.pending.grace_s = max(self.pending.grace_s, grace)
        waves = q.resident_waves
        if grace and waves:
            waves = int(waves * max(0.0, 1.0 - grace / 1e-3))       # ESTIMATE: 1 ms mean wave life
        if not dev.cwsr_enabled:
            q.saved_wave_bytes = q.saved_ctl_stack_bytes = 0
            self.pending.grace_s = max(self.pending.grace_s, 1e-3 if waves else 0.0)  # drain
            return
        saved = waves * bytes_per_wave(dev.node, dev.cwsr)
        q.saved_wave_bytes = saved
        per_xcc_waves = -(-waves // dev.node.num_xcc) if waves else 0
        q.saved_ctl_stack_bytes = min(q.ctl_stack_size, 40 + 8 * per_xcc_waves + 8) if waves else 0
        self.pending.saved_bytes += saved
        self.pending.save_s += saved / bandwidth(dev.node)

    def restore_waves(self, dev, q):
        if q.saved_wave_bytes:
            self.pending.restore_s += q.saved_wave_bytes / bandwidth(dev.node)
        q.saved_wave_bytes = q.saved_ctl_stack_bytes = 0

    def settle(self, block=True):
        """Pay the accumulated cost of the request just handled (called by the server). Queues of
        every process on a remapped HWS device make no progress meanwhile. `block=False`: do not
        sleep here; only the caller's call lasts the returned cost longer (an ioctl sleeps in its
        caller's thread, while other processes' doorbells, which need no kernel, go on)."""
        cost, self.pending = self.pending, PreemptCost()
        devices, self.pending_devices = self.pending_devices, set()
        self.last = cost
        stalled = [q for p in self.kfd.processes.values() for q in p.queues.values()
                   if q.mapped_since_ns is not None and self.kfd.devices[q.gpu_id] in devices]
        for q in stalled:
            q.sync_progress()
        now = clock.now_ns()                   # the moment the request is applied at (clock.py)
        if self.on_stall is not None and cost.total_s > 0:
            for dev in devices:                # the device's work stalls, realtime or not
                self.on_stall(dev.gpu_id, cost.total_s, now)
        if self.realtime and block and cost.total_s > 0:
            deadline = time.perf_counter() + cost.total_s
            while True:
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                time.sleep(left if left > 2e-3 else 0)
        # from the moment applied at, not from after the sleep above: that moment may be earlier
        stall_end = now + int(cost.total_s * 1e9) if self.realtime else now
        for q in stalled:
            if q.mapped_since_ns is not None:
                q.mapped_since_ns = stall_end          # the stall is not progress
        return cost
