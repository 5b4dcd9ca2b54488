"""Lv3 through KFD on the simulated KFD: an XQueue whose interrupt suspends its KFD queue
(DBG_TRAP, CWSR) and whose restore resumes it; capability detection."""
import os
import time

from simhelpers import Client, start
from xsched_lv3 import Level, XQueue
from xsched_lv3.backends.kfd import KfdHwQueue, detect
from xsched_lv3.backends.sim import SimHwQueue


def test_xqueue_lv3_suspends_the_kfd_queue(sim_dir):
    cl = Client(start("mi308x"))
    try:
        qid = cl.rt.create_queue(cl.gpus[5])
        cl.ctl("set_waves", pid=os.getpid(), qid=qid, waves=200)
        hwq = KfdHwQueue(SimHwQueue(Level.INTERRUPT), cl.kfd, [qid])
        assert "DBG_TRAP" in hwq.why
        xq = XQueue(hwq)
        assert xq.level == Level.INTERRUPT
        for i in range(20):
            xq.submit((i, 2000))
        time.sleep(0.01)
        xq.suspend()
        q = cl.queues()[qid]
        assert q["suspended"] and not q["active"] and q["saved_wave_bytes"] > 0
        done = len(hwq.inner.executed)
        time.sleep(0.02)
        assert len(hwq.inner.executed) == done
        xq.resume()
        assert cl.queues()[qid]["active"]
        assert xq.wait_all(timeout=20) and [p[0] for p in hwq.inner.executed] == list(range(20))
        xq.close()
        hwq.close()
    finally:
        cl.close()


def test_detect_reports_level(sim_dir):
    cl = Client(start("mi308x"))
    try:
        level, why = detect(cl.kfd)
        assert level == Level.INTERRUPT and "1.23" in why
    finally:
        cl.close()


def test_no_kfd_means_lv1(monkeypatch):
    from kfdtool.device import KfdDevice
    real_open = KfdDevice.open.__func__
    monkeypatch.setattr(KfdDevice, "open", classmethod(lambda cls, path="/dev/kfd", sim=None:
                                                       real_open(cls, "/nonexistent/kfd")))
    level, why = detect()
    assert level == Level.BLOCK and "no KFD" in why and "does not exist" in why
