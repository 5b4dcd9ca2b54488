"""gil.short_switch: one process-wide count over who needs the GIL handed over soon."""
import sys

import pytest

from xsched_lv3.gil import SHORT_SWITCH_S, ShortSwitch


@pytest.fixture
def default_interval():
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield 0.005
    sys.setswitchinterval(before)


def test_the_interval_is_short_while_anyone_holds_it_and_restored_after_the_last(default_interval):
    switch = ShortSwitch()
    with switch:
        assert sys.getswitchinterval() == pytest.approx(SHORT_SWITCH_S)
        switch.hold()                                  # a second holder (a watcher, two thread clients)
        with switch:
            assert sys.getswitchinterval() == pytest.approx(SHORT_SWITCH_S)
        switch.release()
        assert sys.getswitchinterval() == pytest.approx(SHORT_SWITCH_S)
    assert sys.getswitchinterval() == pytest.approx(default_interval)


def test_an_interval_the_program_set_meanwhile_is_kept(default_interval):
    switch = ShortSwitch()
    with switch:
        sys.setswitchinterval(0.002)                   # the program's own choice, while we held ours
    assert sys.getswitchinterval() == pytest.approx(0.002)


def test_a_program_already_switching_faster_is_left_alone(default_interval):
    sys.setswitchinterval(SHORT_SWITCH_S / 5)
    switch = ShortSwitch()
    with switch:
        assert sys.getswitchinterval() == pytest.approx(SHORT_SWITCH_S / 5)
    assert sys.getswitchinterval() == pytest.approx(SHORT_SWITCH_S / 5)
