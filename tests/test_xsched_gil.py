"""gil.short_switch: one process-wide count over who needs the GIL handed over soon."""
import ast
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


def test_a_forked_child_gets_the_programs_interval_back(default_interval):
    """A child forked while a watcher held the interval short has no such watcher: the program's
    own interval, and a count that a late release cannot drive below zero."""
    import os

    from xsched_lv3.gil import short_switch
    with short_switch:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:                                   # the child
            first = sys.getswitchinterval()
            short_switch.release()                     # a late release: nothing is held in the child
            with short_switch:
                inside = sys.getswitchinterval()
            os.write(write, repr((first, inside, sys.getswitchinterval())).encode())
            os._exit(0)
        os.close(write)
        first, inside, after = ast.literal_eval(os.read(read, 256).decode())
        os.waitpid(pid, 0)
        assert sys.getswitchinterval() == pytest.approx(SHORT_SWITCH_S)    # the parent's still held
    assert first == pytest.approx(default_interval) and after == pytest.approx(default_interval)
    assert inside == pytest.approx(SHORT_SWITCH_S)
    assert sys.getswitchinterval() == pytest.approx(default_interval)
