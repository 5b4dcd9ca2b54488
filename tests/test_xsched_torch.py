"""The PyTorch integration's logic with a fake torch (see fake_torch.py): module gates, request
activity, the progressive window, the Lv1 TorchHwQueue. Its real behaviour is measured on a GPU by
scripts/bench_two_models.py and scripts/bench_preempt_latency.py."""
import os
import sys
import threading
import time
import types

import pytest

import fake_torch


@pytest.fixture
def torch_fake(monkeypatch, tmp_path):
    gpu = fake_torch.FakeGPU()
    torch = fake_torch.make(gpu)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setenv("XSCHED_LV3_BOARD", str(tmp_path / "board"))
    import xsched_lv3.pytorch as xt
    monkeypatch.setattr(xt, "_installed", False)
    monkeypatch.setattr(xt, "_process_gate", None)
    return torch, gpu, xt


@pytest.fixture
def program_interval():
    """The program's GIL switch interval, pinned to the interpreter's default for the test; at its end
    nothing may hold gil.short_switch any more (a hold leaked by an earlier test would otherwise make
    the short interval look like the program's own)."""
    from xsched_lv3.gil import short_switch
    previous = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield 0.005
    deadline = time.monotonic() + 2
    while short_switch._holders and time.monotonic() < deadline:
        time.sleep(0.005)
    held = short_switch._holders
    sys.setswitchinterval(previous)
    assert held == 0, f"gil.short_switch still held {held} time(s) after the test"


def _interval_becomes(value, timeout=2.0):
    """Whether the switch interval is `value` within `timeout` (the watcher lets go just after its mark)."""
    deadline = time.monotonic() + timeout
    while sys.getswitchinterval() != pytest.approx(value) and time.monotonic() < deadline:
        time.sleep(0.002)
    return sys.getswitchinterval() == pytest.approx(value)


def model(torch, name, layers, kernel_s):
    return torch.nn.Module(*[torch.nn.Module(kernel_s=kernel_s, name=f"{name}{i}") for i in range(layers)])


def other_client(xt, priority):
    """A registered client of another thread or process that has issued no request yet."""
    from xsched_lv3.gate import Gate
    return Gate(xt.TorchRecorder(), priority, window_us=None)


def test_low_priority_yields_while_high_priority_is_active(torch_fake):
    torch, gpu, xt = torch_fake
    lp_model, hp_model = model(torch, "lp", 200, 0.0005), model(torch, "hp", 10, 0.0005)
    stop = threading.Event()

    def lp():
        with xt.client(priority=0, window_us=1000) as gate:
            while not stop.is_set():
                lp_model(None)
                if not gate.guarded:                 # nobody above it: unwindowed, so read its results
                    torch.cuda.Stream().synchronize()
            lp.gate = gate
    t = threading.Thread(target=lp)
    t.start()
    time.sleep(0.05)
    with xt.client(priority=10):
        time.sleep(0.15)                         # the LP's next request sees us registered, its window learns
        hp_model(None)
        torch.cuda.Stream().synchronize()
    stop.set()
    t.join()
    hp_index = [i for i, (n, s, e) in enumerate(gpu.launched) if n.startswith("hp")]
    hp = [gpu.launched[i] for i in hp_index]
    lp_during = [n for n, s, e in gpu.launched if n.startswith("lp") and hp[0][1] < s < hp[-1][2]]
    assert not lp_during                       # no LP kernel started inside the HP request
    # GPU work queued ahead of HP's first kernel: at most the LP window (1 ms), one segment between
    # sync points (0.5 ms) and the kernel of a module that passed its check just before the HP
    # became active (0.5 ms) -- read off the GPU timeline, so CPU jitter cannot flake it
    assert gpu.queued_for[hp_index[0]] <= 0.002 + 1e-6
    assert lp.gate.waits >= 1


def test_top_priority_client_pays_only_the_fast_path(torch_fake):
    torch, gpu, xt = torch_fake
    m = model(torch, "k", 60, 0.001)
    lp = other_client(xt, priority=0)          # a lower client shares the GPU: only it yields
    with xt.client(priority=10) as gate:
        t0 = time.monotonic()
        m(None)
        launched_in = time.monotonic() - t0
        assert not gate.guarded and gate.window is None
    assert launched_in < 0.03                  # never throttled to the GPU's pace (60 ms of kernels)
    assert gpu.events_recorded == 1            # one completion event for the request, no sync points
    lp.close()


def test_a_client_alone_records_nothing(torch_fake):
    torch, gpu, xt = torch_fake
    m = model(torch, "k", 30, 0.0001)
    with xt.client(priority=0) as gate:
        for _ in range(3):
            m(None)
        assert not gate.guarded and not gate.tracking and gate._watcher is None
        assert gate.board.read_slot(gate.slot)[2] == 0       # nobody reads its activity: not marked
    assert gpu.events_recorded == 0


@pytest.mark.parametrize("above", [False, True], ids=["free", "guarded"])
def test_a_nested_module_without_hooks_runs_its_forward_without_torchs_two_frames(torch_fake, above):
    """The wrapper takes torch's own fast path itself: a nested module with no hook, outside tracing,
    runs `forward` directly (torch's full call path runs only for the request's top-level call), and
    what it launches is the same."""
    torch, gpu, xt = torch_fake
    calls = torch.nn.modules.module
    m = model(torch, "k", 30, 0.0)
    m(None)
    unscheduled, runs = list(gpu.launched), calls.call_impl_runs
    assert runs == 31                                   # as torch ships it: every module call
    hp = other_client(xt, priority=10) if above else None
    with xt.client(priority=0) as gate:
        assert gate.guarded == above
        m(None)
    assert calls.call_impl_runs - runs == 1             # the top-level call only
    assert [name for name, *_ in gpu.launched[len(unscheduled):]] == [name for name, *_ in unscheduled]
    if hp is not None:
        hp.close()


OWN_HOOKS = ["_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks"]
GLOBAL_HOOKS = ["_global_forward_pre_hooks", "_global_forward_hooks", "_global_backward_pre_hooks",
                "_global_backward_hooks"]


@pytest.mark.parametrize("hooked", OWN_HOOKS + GLOBAL_HOOKS + ["rebound global dict", "compiled call", "tracing",
                                                                "profiler", "patched _call_impl",
                                                                "overridden _call_impl"])
def test_a_nested_module_torch_must_call_itself_still_goes_through_torch(torch_fake, hooked):
    """Hooks (the module's own and global ones, a global dict rebound after install), a compiled call,
    tracing, a profiler, and a _call_impl patched on Module or overridden by a class: each such
    call still runs Module.__call__ as torch ships it."""
    torch, gpu, xt = torch_fake
    calls = torch.nn.modules.module
    m = model(torch, "k", 3, 0.0)
    inner = m._modules["1"]
    with xt.client(priority=0):
        m(None)                                   # installed: the nested calls take the direct path
    runs = calls.call_impl_runs
    assert runs == 1
    seen = []
    if hooked in OWN_HOOKS:
        getattr(inner, hooked)[0] = lambda *a: None
    elif hooked in GLOBAL_HOOKS:
        getattr(calls, hooked)[0] = lambda *a: None
    elif hooked == "rebound global dict":
        calls._global_forward_hooks = {0: lambda module, args, out: seen.append(module.name)}
    elif hooked == "compiled call":
        inner._compiled_call_impl = lambda *args: seen.append("compiled")
    elif hooked == "tracing":
        calls.tracing = object()
    elif hooked == "patched _call_impl":
        shipped = torch.nn.Module._call_impl
        torch.nn.Module._call_impl = lambda self, *a, **k: seen.append(self.name) or shipped(self, *a, **k)
    elif hooked == "overridden _call_impl":
        class Overriding(torch.nn.Module):
            def _call_impl(self, *args, **kwargs):
                seen.append("overridden")
                return super()._call_impl(*args, **kwargs)
        m._modules["1"] = Overriding(kernel_s=0.0, name="k1")
    if hooked == "profiler":
        sys.setprofile(lambda *a: None)
    try:
        with xt.client(priority=0):
            m(None)
    finally:
        sys.setprofile(None)
    expected_runs = {"compiled call": 1}.get(hooked, 2 if hooked in OWN_HOOKS or "overridden" in hooked else 4)
    assert calls.call_impl_runs - runs == expected_runs
    assert seen == {"rebound global dict": ["k0", "k1", "k2", "m"], "compiled call": ["compiled"],
                    "patched _call_impl": ["m", "k0", "k1", "k2"], "overridden _call_impl": ["overridden"]}.get(hooked, [])


def test_another_wrapper_on_module_call_keeps_every_call_going_through_it(torch_fake):
    """A Module.__call__ that is not torch's own when install() wraps it (another tool's wrapper) is
    never bypassed: every module call, nested ones included, still goes through it."""
    torch, gpu, xt = torch_fake
    through = []
    shipped = torch.nn.Module.__call__

    def someone_elses(self, *args, **kwargs):
        through.append(self.name)
        return shipped(self, *args, **kwargs)
    torch.nn.Module.__call__ = someone_elses
    m = model(torch, "k", 3, 0.0)
    with xt.client(priority=0):
        m(None)
    assert through == ["m", "k0", "k1", "k2"]


def test_window_bounds_in_flight_work(torch_fake):
    torch, gpu, xt = torch_fake
    m = model(torch, "k", 60, 0.001)            # 1 ms kernels
    hp = other_client(xt, priority=10)          # registered, idle: the LP may run, windowed
    with xt.client(priority=0, window_us=3000) as gate:
        assert gate.guarded
        t0 = time.monotonic()
        m(None)
        launch_done = time.monotonic()
    ahead = gpu.busy_until - launch_done         # GPU work still queued when the CPU finished
    assert ahead < 0.0065                        # ~window + one sync interval, not 60 ms
    assert launch_done - t0 > 0.04               # the CPU was held back to the GPU's pace
    hp.close()


def test_a_launch_bound_client_does_not_stall_on_finished_sync_points(torch_fake):
    torch, gpu, xt = torch_fake
    m = model(torch, "k", 200, 0.0)              # the GPU is never behind
    hp = other_client(xt, priority=10)
    with xt.client(priority=0) as gate:          # the default window: doubling needs a look within it
        for _ in range(5):
            m(None)
        assert gate.blocked_syncs <= 1           # at most the first, which calibrates nothing
        # its GPU keeps up: sync points thin out to one per MAX_COMMANDS_PER_SYNC leaves
        from xsched_lv3.window import MAX_COMMANDS_PER_SYNC
        assert gate.sync_points <= 5 * 200 / MAX_COMMANDS_PER_SYNC + 6
    hp.close()


def test_a_gpu_bound_client_learns_its_kernel_time(torch_fake):
    torch, gpu, xt = torch_fake
    m = model(torch, "k", 80, 0.0004)            # 0.4 ms kernels, launched much faster than they run
    hp = other_client(xt, priority=10)
    with xt.client(priority=0, window_us=2000) as gate:
        m(None)
        assert gate.blocked_syncs >= 1
        assert 300 <= gate.window.cmd_us <= 900  # µs per leaf (0.4 ms), timed by back-to-back waits
        assert gate.launches.per_sync == max(1, int(1000 / gate.window.cmd_us))    # half a window (1 ms) of them
    hp.close()


def test_a_report_keeps_the_learned_time_after_the_client_above_leaves(torch_fake):
    """A batch job that outlives the service above it is no longer windowed when it reports at exit:
    what its window learned is still in the report (it read None, as if nothing had been learned)."""
    torch, gpu, xt = torch_fake
    m = model(torch, "k", 80, 0.0004)
    hp = other_client(xt, priority=10)
    with xt.client(priority=0, window_us=2000) as gate:
        m(None)
        learned = gate.window.cmd_us
        assert gate.window.calibrated
        hp.close()
        m(None)                                  # a request after the board changed: no longer guarded
        assert gate.window is None
        assert gate.stats()["window_cmd_us"] == learned


class ScriptedGPU:
    """A recorder on a scripted clock: each sync point's segment takes `per_segment_s` of GPU time,
    and a wait may run `on_wait` (another client's arrival) and add its GPU time first."""
    def __init__(self, per_segment_s):
        self.now, self.per_segment_s, self.handles, self.on_wait = 100.0, per_segment_s, 0, None
        self.passed = 0                            # the GPU has completed every sync point up to this one

    def monotonic(self):
        return self.now

    def record(self):
        self.handles += 1
        return self.handles

    def done(self, handle):
        return handle <= self.passed               # the GPU is behind: a sync point completes when waited for

    def wait(self, handle):
        extra = self.on_wait() if self.on_wait else 0.0
        self.on_wait = None
        self.now += self.per_segment_s + extra
        self.passed = handle

    def device_key(self):
        return 7


def test_higher_priority_work_run_ahead_of_ours_is_not_learned_as_ours(torch_fake, monkeypatch):
    """A client above us starts a request while our window waits, and the GPU runs its kernels ahead
    of ours (a time slice, a higher-priority stream): that wait lasts its 5 ms longer. The interval is
    not our GPU time: learned as ours, it would shrink our segments and starve our GPU long after
    the request (seen on an H200: a GPU-bound batch job lost 18 % next to a service busy 7 % of the
    time)."""
    torch, gpu, xt = torch_fake
    import xsched_lv3.gate as gate_module
    from xsched_lv3.gate import Gate
    clock = ScriptedGPU(per_segment_s=0.0008)
    monkeypatch.setattr(gate_module.time, "monotonic", clock.monotonic)
    hp = Gate(clock, priority=10, window_us=None)
    lp = Gate(clock, priority=0, window_us=2000)
    assert lp.guarded
    learned = []
    real_learn = lp.window._learn
    lp.window._learn = lambda us: (learned.append(us), real_learn(us))

    def sync_points(n):
        for _ in range(n):
            lp.launches.count = 2                  # two leaves since the last sync point
            lp.launches.sync_point()
    sync_points(6)
    assert learned and all(abs(us - 400) < 1 for us in learned)     # 0.8 ms per 2 leaves, back to back

    def hp_arrives():
        hp.begin_request()                         # marks it active on the board
        return 0.005                               # its kernels run ahead of our queued ones
    learned.clear()
    clock.on_wait = hp_arrives
    sync_points(3)
    assert max(learned, default=0) < 1000          # nothing of the HP's 5 ms taken for ours
    hp.close()
    lp.close()


def test_request_activity_marks_the_board(torch_fake):
    torch, gpu, xt = torch_fake
    m = model(torch, "k", 5, 0.01)
    lp = other_client(xt, priority=0)
    with xt.client(priority=3) as gate:
        m(None)
        assert gate.board.read_slot(gate.slot)[2] == 1       # active while its work runs
        deadline = time.monotonic() + 1
        while gate.board.read_slot(gate.slot)[2] and time.monotonic() < deadline:
            time.sleep(0.005)
        assert gate.board.read_slot(gate.slot)[2] == 0       # idle once it completed
    lp.close()


def _idle(gate):
    deadline = time.monotonic() + 1
    while gate.board.read_slot(gate.slot)[2] and time.monotonic() < deadline:
        time.sleep(0.002)
    assert gate.board.read_slot(gate.slot)[2] == 0
    with gate._lock:                # the watcher's mark (and what it took as seen) is complete
        pass


def test_a_top_clients_own_marks_do_not_make_it_reread_the_board_yet_others_writes_are_seen(torch_fake, monkeypatch):
    """A service marks itself active and idle on the board every request; its next request's start
    re-read the whole board for that alone (50-200 us on the critical path). Its own marks no longer
    count, another client's change still does at the next start, and an announcement lost to a
    racing write (overwritten by ours) is seen within REAP_IDLE_EVERY_S."""
    import xsched_lv3.gate as gate_module
    torch, gpu, xt = torch_fake
    monkeypatch.setattr(gate_module, "REAP_IDLE_EVERY_S", 3600.0)
    m = model(torch, "hp", 3, 0.001)
    lp = other_client(xt, priority=0)
    with xt.client(priority=10) as gate:
        refreshes = []
        real = gate._refresh
        monkeypatch.setattr(gate, "_refresh", lambda now: (refreshes.append(now), real(now)))
        for _ in range(5):
            m(None)
            _idle(gate)
        assert gate.tracking and len(refreshes) == 0        # only its own marks changed the board
        lp.board.set_hint(lp.slot, "priority", 20)           # the client below now ranks above it
        m(None)
        assert len(refreshes) == 1 and gate.guarded          # seen at the next request's start
        _idle(gate)
        lp.board.set_hint(lp.slot, "priority", 0)
        gate._refresh(time.monotonic())
        assert not gate.guarded
        refreshes.clear()
        lp.board.write(lp.slot, priority=30, announce=False)  # as if its announcement were overwritten by ours
        m(None)
        _idle(gate)
        assert not refreshes and not gate.guarded            # not seen yet ...
        monkeypatch.setattr(gate_module, "REAP_IDLE_EVERY_S", 0.0)
        m(None)
        assert refreshes and gate.guarded                    # ... but at the next reap
    lp.close()


def test_a_raising_request_ends_and_releases_lower_clients(torch_fake):
    torch, gpu, xt = torch_fake
    failing = torch.nn.Module(torch.nn.Module(kernel_s=0.001, name="hp0"), torch.nn.Raising(kernel_s=0.001, name="hp1"))
    lp = other_client(xt, priority=0)
    with xt.client(priority=10) as gate:
        with pytest.raises(RuntimeError, match="request failed"):
            failing(None)
        deadline = time.monotonic() + 1
        while gate.board.read_slot(gate.slot)[2] and time.monotonic() < deadline:
            time.sleep(0.005)
        assert gate.board.read_slot(gate.slot)[2] == 0       # idle again: the LP is not held for good
        lp._refresh(time.monotonic())
        assert lp._may_run
    lp.close()


def test_work_a_parent_launches_between_its_children_is_gated(torch_fake):
    torch, gpu, xt = torch_fake
    hp = other_client(xt, priority=10)
    ended = {}

    class HighPriorityArrives(torch.nn.Module):
        def forward(self, x):                      # the HP becomes active while the LP is in child 0
            _hp_active_for(hp, 0.05, ended)
            return x
    block = torch.nn.Attention(HighPriorityArrives(), torch.nn.Module(kernel_s=0.0, name="out"), name="attn")
    with xt.client(priority=0):
        block(None)
    sdpa = gpu.launched_at[[n for n, *_ in gpu.launched].index("attn.sdpa")]
    assert sdpa >= ended["at"]                     # held from the moment the HP became active
    hp.close()


def _hp_active_for(hp, seconds, ended):
    """The high-priority client starts a request now and ends it `seconds` later (another thread)."""
    hp.begin_request()

    def finish():
        time.sleep(seconds)
        ended["at"] = time.monotonic()
        hp._mark(False)
    threading.Thread(target=finish).start()


def _train_once(torch):
    """A backward pass in the calling thread's client: from now on it counts as one that trains."""
    torch.nn.Module(kernel_s=0.0, name="first")(torch.Tensor(requires_grad=True)).backward()


def _nodes_along(out):
    nodes = []
    while out.grad_fn is not None:
        nodes.append(out.grad_fn)
        out = out.source
    return nodes


def _hooks_along(out):
    return [hook for node in _nodes_along(out) for hook in node.prehooks]


def test_a_training_clients_backward_is_held_while_a_higher_client_is_active(torch_fake):
    torch, gpu, xt = torch_fake
    hp = other_client(xt, priority=10)
    ended, armed = {}, []

    class ArrivesDuringBackward(torch.nn.Module):
        def forward(self, x):                      # the HP becomes active once backward reaches us
            out = super().forward(x)
            if armed:
                out.grad_fn.register_prehook(lambda grad: _hp_active_for(hp, 0.05, ended))
            return out
    net = torch.nn.Module(*[torch.nn.Module(kernel_s=0.0002, name=f"lp{i}") for i in range(3)],
                          ArrivesDuringBackward(kernel_s=0.0002, name="arrive"),
                          *[torch.nn.Module(kernel_s=0.0002, name=f"lp{i}") for i in range(3, 6)])
    with xt.client(priority=0) as gate:
        assert gate.guarded
        _train_once(torch)
        armed.append(True)
        net(torch.Tensor(requires_grad=True)).backward()
    names = [n for n, *_ in gpu.launched]
    held = [gpu.launched_at[names.index(n)] for n in ("arrive.backward", "lp2.backward", "lp0.backward")]
    assert min(held) >= ended["at"]                # none of that backward ran while the HP was active
    assert gpu.launched_at[names.index("lp3.backward")] < ended["at"]     # what came before it did
    assert gate.waits >= 1
    hp.close()


def test_a_training_clients_optimizer_step_waits_for_the_higher_client(torch_fake):
    torch, gpu, xt = torch_fake
    hp = other_client(xt, priority=10)
    ended = {}
    net, opt = model(torch, "lp", 4, 0.0001), torch.optim.Optimizer(kernel_s=0.0001)
    with xt.client(priority=0):
        net(torch.Tensor(requires_grad=True)).backward()
        _hp_active_for(hp, 0.05, ended)
        opt.step()
    assert gpu.launched_at[[n for n, *_ in gpu.launched].index("step")] >= ended["at"]
    hp.close()


def test_the_window_bounds_a_backward_pass(torch_fake):
    torch, gpu, xt = torch_fake
    net = model(torch, "k", 40, 0.001)             # 40 ms forward, 80 ms backward
    hp = other_client(xt, priority=10)             # registered, idle: the LP may run, windowed
    with xt.client(priority=0, window_us=3000):
        _train_once(torch)
        out = net(torch.Tensor(requires_grad=True))
        torch.cuda.Stream().synchronize()
        t0 = time.monotonic()
        out.backward()
        launch_done = time.monotonic()
    assert gpu.busy_until - launch_done < 0.012    # ~the window and a segment, not 80 ms
    assert launch_done - t0 > 0.06                 # backward was launched at the GPU's pace
    hp.close()


def test_every_backward_pass_restarts_a_spacing_grown_in_launch_bound_forwards(torch_fake):
    torch, gpu, xt = torch_fake
    layers = [torch.nn.Module(kernel_s=0.0, name=f"k{i}") for i in range(60)]
    for layer in layers:
        layer.backward_s = 0.001                   # free forward kernels, 1 ms backward ones (60 ms)
    net = torch.nn.Module(*layers)
    hp = other_client(xt, priority=10)
    with xt.client(priority=0, window_us=3000) as gate:
        _train_once(torch)
        for _ in range(2):                         # the second backward too: each is a new phase
            for _ in range(8):                     # the GPU keeps up: sync points grow far apart
                net(None)
            assert gate.launches.per_sync >= 64
            net(torch.Tensor(requires_grad=True)).backward()
            launch_done = time.monotonic()
            assert gpu.busy_until - launch_done < 0.012    # not the whole backward (60 ms) queued at once
            torch.cuda.Stream().synchronize()
    hp.close()


def test_hooks_go_to_leaves_of_a_client_that_trains_and_once_per_node(torch_fake):
    torch, gpu, xt = torch_fake

    class ReturnsItsInput(torch.nn.Module):        # Identity, Dropout in eval
        def forward(self, x):
            return x
    net = torch.nn.Module(torch.nn.Module(kernel_s=0.0, name="a"), ReturnsItsInput(name="same"),
                          torch.nn.Module(kernel_s=0.0, name="b"))
    hp = other_client(xt, priority=10)
    with xt.client(priority=0) as gate:
        assert gate.guarded
        out = net(torch.Tensor(requires_grad=True))
        # autograd on, no backward yet (an eval() job): one hook a request, on its output, none on its leaves
        assert [hook.__name__ for hook in _hooks_along(out)] == ["backward_reached"]
        _train_once(torch)
        assert gate.trains
        out = net(torch.Tensor(requires_grad=True))
        assert [hook.func.__name__ for hook in _hooks_along(out)] == ["before_backward"] * 2   # a and b, not the identity
        assert [len(n.prehooks) for n in _nodes_along(out)] == [1, 1]
        top_level_leaf = torch.nn.Module(kernel_s=0.0, name="leaf")
        assert len(top_level_leaf(torch.Tensor(requires_grad=True)).grad_fn.prehooks) == 1
    hp.close()


def test_backward_hooks_go_to_weighted_leaves_and_never_more_than_a_few_leaves_apart(torch_fake):
    torch, gpu, xt = torch_fake
    pattern = "wuuuuuwuw"                          # w: a convolution or linear layer; u: activation, norm, pool
    net = torch.nn.Module(*[torch.nn.Module(name=f"{kind}{i}", weighted=kind == "w")
                            for i, kind in enumerate(pattern)])
    hp = other_client(xt, priority=10)
    with xt.client(priority=0):
        _train_once(torch)
        out = net(torch.Tensor(requires_grad=True))
    hooked = [(node.module.name, node.prehooks[0].args[0]) for node in reversed(_nodes_along(out)) if node.prehooks]
    # every weighted leaf, and an unweighted one once MAX_LEAVES_PER_HOOK went by without a hook; each
    # counts its leaves' backward (BACKWARD_COMMANDS = 2 each) since the previous hook, so none is lost
    assert xt.MAX_LEAVES_PER_HOOK == 3
    assert hooked == [("w0", 2), ("u3", 6), ("w6", 6), ("w8", 4)]
    assert sum(commands for _, commands in hooked) == 2 * len(pattern)
    hp.close()


def test_a_frozen_backbones_leaves_count_for_no_backward_work(torch_fake):
    torch, gpu, xt = torch_fake
    backbone = [torch.nn.Module(name=f"frozen{i}", frozen=True) for i in range(50)]
    net = torch.nn.Module(*backbone, torch.nn.Module(name="head0"), torch.nn.Module(name="head1", weighted=False))
    hp = other_client(xt, priority=10)
    with xt.client(priority=0):
        _train_once(torch)
        out = net(torch.Tensor(requires_grad=False))     # fine-tuning: only the head has a backward
    hooked = [(node.module.name, node.prehooks[0].args[0]) for node in _nodes_along(out) if node.prehooks]
    assert hooked == [("head0", 2)]                      # not 2 x 51: the window would think 100 commands launched
    hp.close()


def test_a_client_is_found_to_train_through_a_dict_or_tuple_output(torch_fake):
    torch, gpu, xt = torch_fake

    class ReturnsOutputs(torch.nn.Module):         # a Hugging Face model returns a ModelOutput (a dict)
        def forward(self, x):
            out = super().forward(x)
            return {"logits": out, "hidden": (out,)} if self.name == "dict" else (out, None)
    hp = other_client(xt, priority=10)
    for name in ("dict", "tuple"):
        with xt.client(priority=0) as gate:
            net = torch.nn.Module(ReturnsOutputs(torch.nn.Module(kernel_s=0.0, name="inner"), name=name))
            out = net(torch.Tensor(requires_grad=True))
            assert gate.guarded and not gate.trains
            (out["logits"] if name == "dict" else out[0]).backward()
            assert gate.trains, name
    hp.close()


def test_a_top_level_leaf_is_hooked_in_every_iteration(torch_fake, monkeypatch):
    torch, gpu, xt = torch_fake
    leaf = torch.nn.Module(kernel_s=0.0, name="leaf")
    hp = other_client(xt, priority=10)
    # CPython gives a new node the id of one freed just before (each iteration's graph is freed before
    # the next is built): seen as the same number every time here
    monkeypatch.setattr(xt, "id", lambda node: 7, raising=False)
    with xt.client(priority=0) as gate:
        fired = []
        before = gate.before_backward
        gate.before_backward = lambda commands, grad: (fired.append(1), before(commands, grad))[1]
        for _ in range(4):
            leaf(torch.Tensor(requires_grad=True)).backward()
        assert gate.trains and len(fired) == 3     # the first backward found it training; then every one
    hp.close()


def test_a_backward_step_across_the_look_back_point_still_looks_back(torch_fake, monkeypatch):
    torch, gpu, xt = torch_fake
    hp = other_client(xt, priority=10)
    with xt.client(priority=0) as gate:
        looked, launches = [], gate.launches
        monkeypatch.setattr(launches, "look_back", lambda: looked.append(launches.count))
        launches.per_sync, launches.count, launches.look_after = 100, 2, 3
        gate.after_leaf(2)                          # 2 -> 4 passes 3 without landing on it
        assert looked == [4]
    hp.close()


def test_a_compiled_training_models_backward_is_hooked(torch_fake):
    """torch.compile's module owns no parameters (they are its inner module's) and its one backward
    node holds the whole model's backward: it is hooked whatever it owns."""
    torch, gpu, xt = torch_fake

    class Compiled(torch.nn.Module):
        def forward(self, x):
            gpu.launch(self.name, self.kernel_s)
            return torch.Tensor(True, self, x)
    compiled = Compiled(torch.nn.Module(name="inner"), name="compiled")
    assert not compiled._parameters
    hp = other_client(xt, priority=10)
    with xt.client(priority=0):
        _train_once(torch)
        out = compiled(torch.Tensor(requires_grad=True))
    assert [len(node.prehooks) for node in _nodes_along(out)] == [1]
    hp.close()


def test_a_compiled_model_is_one_command_to_the_window(torch_fake):
    torch, gpu, xt = torch_fake

    class Compiled(torch.nn.Module):
        """As torch.compile's module: children it never calls (dynamo runs their forward inline)."""
        def forward(self, x):
            gpu.launch(self.name, self.kernel_s)
            return x
    compiled = Compiled(torch.nn.Module(name="inner"), kernel_s=0.005, name="compiled")
    hp = other_client(xt, priority=10)
    with xt.client(priority=0, window_us=3000) as gate:
        assert gate.guarded
        for _ in range(20):                        # 100 ms of GPU work, no synchronize
            compiled(None)
        launch_done = time.monotonic()
    assert gpu.busy_until - launch_done < 0.025    # about a call or two in flight, not all 20
    hp.close()


def test_dynamo_imported_first_learns_the_installed_module_call(monkeypatch, tmp_path):
    """torch.compile inlines a model's modules only while nn.Module.__call__ is what dynamo recorded at
    its import; a program that compiled something before install() has dynamo's record updated."""
    gpu = fake_torch.FakeGPU()
    torch = fake_torch.make(gpu)
    shipped = torch.nn.Module.__call__
    dynamo = {name: types.SimpleNamespace(unpatched_nn_module_call=shipped)
              for name in ("torch._dynamo.utils", "torch._dynamo.variables.nn_module")}
    monkeypatch.setitem(sys.modules, "torch", torch)
    for name, module in dynamo.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setenv("XSCHED_LV3_BOARD", str(tmp_path / "board"))
    import xsched_lv3.pytorch as xt
    monkeypatch.setattr(xt, "_installed", False)
    xt.install()
    assert torch.nn.Module.__call__ is not shipped
    assert all(m.unpatched_nn_module_call is torch.nn.Module.__call__ for m in dynamo.values())


def test_a_client_with_nobody_above_it_adds_no_backward_hooks(torch_fake):
    torch, gpu, xt = torch_fake
    net = model(torch, "k", 5, 0.0)
    with xt.client(priority=0) as gate:
        _train_once(torch)
        out = net(torch.Tensor(requires_grad=True))
        assert not gate.guarded
    assert _hooks_along(out) == []


def test_unbound_threads_are_not_gated(torch_fake):
    torch, gpu, xt = torch_fake
    xt.install()
    m = model(torch, "k", 3, 0.0)
    m(None)
    assert len(gpu.launched) == 3


def test_torch_hwqueue_with_xqueue(torch_fake):
    torch, gpu, xt = torch_fake
    from xsched_lv3 import XQueue
    from xsched_lv3.backends.torch import TorchHwQueue
    xq = XQueue(TorchHwQueue(), window_us=2000)
    for i in range(30):
        xq.submit(lambda i=i: gpu.launch(f"c{i}", 0.001), est_us=1000)
    time.sleep(0.005)
    t = time.perf_counter()
    xq.suspend(sync=True)
    assert time.perf_counter() - t < 0.006                    # drained within ~the window
    n = len(gpu.launched)
    time.sleep(0.01)
    assert len(gpu.launched) == n
    xq.resume()
    assert xq.wait_all(timeout=5)
    assert [x[0] for x in gpu.launched] == [f"c{i}" for i in range(30)]
    xq.close()


def test_two_scheduled_threads_shorten_the_gil_switch_interval(torch_fake, program_interval):
    from xsched_lv3.gil import SHORT_SWITCH_S
    torch, gpu, xt = torch_fake
    inside, leave = threading.Barrier(2, timeout=10), threading.Event()

    def other_thread():
        with xt.client(priority=10):
            inside.wait()
            leave.wait(10)
    t = threading.Thread(target=other_thread, daemon=True)   # (left waiting by a failed assertion: daemon)
    try:
        with xt.client(priority=0):
            assert sys.getswitchinterval() == program_interval
            t.start()
            inside.wait()
            assert sys.getswitchinterval() == pytest.approx(SHORT_SWITCH_S)
            leave.set()
            t.join()
            assert sys.getswitchinterval() == program_interval
    finally:
        leave.set()


def _dead_pid():
    import subprocess
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_dead_clients_slot_guards_nobody(torch_fake):
    torch, gpu, xt = torch_fake
    from xsched_lv3.board import Board
    board = Board()
    board.allocate(_dead_pid(), 10, 0, xt.TorchRecorder().device_key())    # an HP that exited without closing
    with xt.client(priority=0) as gate:
        assert not gate.guarded                  # alone: the fast path, not a window for a ghost
    board.close()


def test_a_client_of_unknown_device_holds_every_device():
    from xsched_lv3.policy import HighestPriorityFirst, QueueState
    queues = [QueueState("hp", 0, True, 0.0, {"priority": 10}), QueueState("lp", 7, True, 0.0, {"priority": 0})]
    assert HighestPriorityFirst().decide(queues, 1.0).run == {"hp"}


class Blocking:
    """A module whose forward waits (a thread inside a long request)."""
    def __init__(self, torch):
        self.go = threading.Event()
        outer = self

        class M(torch.nn.Module):
            def forward(self, x):
                outer.go.wait(5)
                return x
        self.module = M()


def test_threads_sharing_the_process_gate_keep_it_active_while_any_request_runs(torch_fake):
    torch, gpu, xt = torch_fake
    from xsched_lv3.gate import Gate
    lp = other_client(xt, priority=0)
    xt.install()
    xt._process_gate = gate = Gate(xt.TorchRecorder(), priority=10)
    long_request = Blocking(torch)
    t = threading.Thread(target=long_request.module, args=(None,))
    t.start()
    model(torch, "k", 3, 0.001)(None)           # another thread's short request starts and ends
    time.sleep(0.05)                            # its completion is seen by the watcher
    assert gate.board.read_slot(gate.slot)[2] == 1     # the long one still runs: still active
    long_request.go.set()
    t.join()
    deadline = time.monotonic() + 2
    while gate.board.read_slot(gate.slot)[2] and time.monotonic() < deadline:
        time.sleep(0.005)
    assert gate.board.read_slot(gate.slot)[2] == 0
    gate.close()
    lp.close()


def test_a_request_interrupted_while_held_ends(torch_fake, monkeypatch):
    torch, gpu, xt = torch_fake
    from xsched_lv3.gate import Gate
    hp, low = other_client(xt, priority=10), other_client(xt, priority=0)
    hp.begin_request()                           # active: the middle client is held
    monkeypatch.setattr(Gate, "_wait_turn", lambda self, start: (_ for _ in ()).throw(KeyboardInterrupt))
    with xt.client(priority=5) as mid:
        with pytest.raises(KeyboardInterrupt):
            model(torch, "m", 2, 0.0)(None)
        deadline = time.monotonic() + 2
        while mid.board.read_slot(mid.slot)[2] and time.monotonic() < deadline:
            time.sleep(0.005)
        assert mid.board.read_slot(mid.slot)[2] == 0       # not left active, holding `low` for good
    hp.close()
    low.close()


def test_closing_clients_leaves_no_threads(torch_fake):
    torch, gpu, xt = torch_fake
    lp = other_client(xt, priority=0)           # so every client below tracks, with a watcher thread
    m = model(torch, "k", 2, 0.0)
    before = threading.active_count()
    for _ in range(30):
        with xt.client(priority=10):
            m(None)
    deadline = time.monotonic() + 2
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() <= before
    lp.close()


def test_close_waits_for_the_watcher_inside_a_gpu_wait(torch_fake):
    """A scheduled process exiting right after a request: its watcher, waiting on that request's GPU
    work, must be finished before the interpreter finalizes (a daemon thread returning from a CUDA
    wait then aborts the process)."""
    torch, gpu, xt = torch_fake
    lp = other_client(xt, priority=0)
    with xt.client(priority=10) as gate:
        model(torch, "slow", 1, 0.3)(None)      # 0.3 s of GPU work still running at close
        watcher = gate._watcher
    assert watcher is not None and not watcher.is_alive()
    lp.close()


def test_module_calls_on_the_cpu_record_nothing(torch_fake):
    torch, gpu, xt = torch_fake
    gpu.initialized = False                     # this process has not used a GPU
    lp = other_client(xt, priority=0)
    with xt.client(priority=10):
        model(torch, "k", 5, 0.0)(None)
    assert gpu.events_recorded == 0
    lp.close()


def test_a_lower_client_on_the_cpu_is_neither_held_nor_recorded_until_it_uses_the_gpu(torch_fake):
    """A job that has not used a GPU (CUDA not initialised) next to a higher client that is active: it
    is not held (nothing of it is queued on a GPU: a CPU-only job, a spawned DataLoader worker), and a
    sync point would initialise CUDA in it, or raise with a torch built without CUDA (seen with torch
    2.13's CPU build under `xsched-lv3 run`). Its first request on the GPU is gated."""
    torch, gpu, xt = torch_fake
    gpu.initialized = False
    hp = other_client(xt, priority=10)
    hp.board.set_active(hp.slot, True)             # the higher client is in a request
    net = model(torch, "k", 300, 0.0)
    with xt.client(priority=0) as gate:
        safety = threading.Timer(2.0, hp.board.set_active, (hp.slot, False))   # if it is held, not for good
        safety.start()
        t0 = time.monotonic()
        net(None)
        safety.cancel()
        assert time.monotonic() - t0 < 0.5 and gate.waits == 0      # not held
        assert not gate.guarded and gate.window is None and gpu.events_recorded == 0
        gpu.initialized = True                      # its first GPU work
        release = threading.Timer(0.2, hp.board.set_active, (hp.slot, False))
        t0 = time.monotonic()
        release.start()
        net(None)                                   # this request finds the GPU in use: held until then
        assert time.monotonic() - t0 >= 0.19 and gate.guarded and gate.waits >= 1
        release.join()
        net(None)
        assert gate.window is not None and gpu.events_recorded > 0
    hp.close()


def test_a_job_that_starts_using_the_gpu_inside_a_request_is_gated_from_there_on(torch_fake):
    """The first GPU work comes from inside the first request (a tensor made on the GPU in a forward):
    the module calls after it are gated, held while the higher client is active."""
    torch, gpu, xt = torch_fake
    gpu.initialized = False
    hp = other_client(xt, priority=10)
    hp.board.set_active(hp.slot, True)

    class FirstGpuUse(torch.nn.Module):
        def forward(self, x):
            gpu.initialized = True                 # e.g. torch.zeros(..., device="cuda")
            return super().forward(x)
    net = torch.nn.Module(FirstGpuUse(kernel_s=0.0, name="first"),
                          *[torch.nn.Module(kernel_s=0.0, name=f"k{i}") for i in range(5)])
    release = threading.Timer(0.2, hp.board.set_active, (hp.slot, False))
    with xt.client(priority=0) as gate:
        t0 = time.monotonic()                      # before the timer: the hold ends at t0 + 0.2 or later
        release.start()
        net(None)
        assert time.monotonic() - t0 >= 0.19 and gate.guarded and gate.waits >= 1
    release.join()
    names = [n for n, *_ in gpu.launched]
    assert gpu.launched_at[names.index("k0")] >= t0 + 0.19     # held before its next module's work
    hp.close()


def test_a_forked_child_runs_unscheduled(torch_fake):
    """A DataLoader worker forked by a scheduled process (its transforms may be modules) must not mark
    the parent's slot active or record CUDA events (which raise in a forked child)."""
    torch, gpu, xt = torch_fake
    lp = other_client(xt, priority=0)              # the HP tracks its requests for it
    with xt.client(priority=10) as gate:
        model(torch, "k", 3, 0.0)(None)            # the GPU is in use, the HP tracking
        assert gate.tracking
        deadline = time.monotonic() + 2            # its busy period over (kept open a moment: gate.RELEASE_COST_S)
        while gate.board.read_slot(gate.slot)[2] and time.monotonic() < deadline:
            time.sleep(0.001)
        assert not gate.board.read_slot(gate.slot)[2]
        recorded = gpu.events_recorded
        pid = os.fork()
        if pid == 0:                               # the child: a module call, then report
            model(torch, "t", 3, 0.0)(None)
            untouched = gpu.events_recorded == recorded and gate.board.read_slot(gate.slot)[2] == 0
            os._exit(0 if untouched else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    lp.close()


def test_a_thread_held_by_its_own_process_sleeps_until_woken(torch_fake):
    """Threads of one process: the held thread does not poll the board (each poll would take the GIL
    from the thread serving the latency-critical request); the holder's end of request wakes it."""
    torch, gpu, xt = torch_fake
    from xsched_lv3.gate import Gate
    hp = other_client(xt, priority=10)
    lp = Gate(xt.TorchRecorder(), priority=0, window_us=None)
    hp.begin_request()
    assert hp.board.read_slot(hp.slot)[2] == 1
    refreshes = []
    real_refresh = lp._refresh
    lp._refresh = lambda now: (refreshes.append(now), real_refresh(now))
    released = []
    held = threading.Thread(target=lambda: (lp.check(), released.append(time.monotonic())))
    held.start()
    time.sleep(0.2)
    assert not released                          # held while the HP request runs
    ended = time.monotonic()
    hp.end_request()                             # its watcher marks it idle once the GPU work completes
    held.join(2)
    assert released and released[0] - ended < 0.05
    assert len(refreshes) < 60                   # woken by timeouts of 5 ms at most, not polling (~2,000)
    hp.close()
    lp.close()


def test_a_held_thread_is_woken_by_its_holders_idle_mark_not_by_its_timeout(torch_fake, monkeypatch):
    """The holder wakes the threads held on it only where there are any (a service alone in its
    process skips the condition): one that waits is woken by the idle mark, not by its timeout."""
    torch, gpu, xt = torch_fake
    import xsched_lv3.gate as gate_module
    monkeypatch.setattr(gate_module, "LOCAL_WAIT_MAX_S", 30.0)     # only a wake-up can release it in time
    hp = other_client(xt, priority=10)
    lp = gate_module.Gate(xt.TorchRecorder(), priority=0, window_us=None)
    for _ in range(5):
        hp.begin_request()
        released = []
        held = threading.Thread(target=lambda: (lp.check(), released.append(time.monotonic())))
        held.start()
        time.sleep(0.05)
        assert not released
        ended = time.monotonic()
        hp.end_request()
        held.join(2)
        assert released and released[0] - ended < 0.5
    assert gate_module._local_waiters[0] == 0
    hp.close()
    lp.close()


def test_a_services_request_ends_reuse_their_completion_events(torch_fake, monkeypatch):
    """The watcher hands each request's completion event back once it has waited for it: a new CUDA
    event a request cost the service's end of request its creation (and its destruction later)."""
    torch, gpu, xt = torch_fake
    made = []

    class CountedEvent(torch.cuda.Event):
        def __init__(self, *a, **k):
            made.append(self)
            super().__init__(*a, **k)
    monkeypatch.setattr(torch.cuda, "Event", CountedEvent)
    m = model(torch, "k", 3, 0.001)
    lp = other_client(xt, priority=0)
    with xt.client(priority=10) as gate:
        for _ in range(20):
            m(None)
            torch.cuda.Stream().synchronize()
            _idle(gate)                          # its watcher has marked it idle: done with the event
        assert gate.tracking and gate.stats()["busy_periods"] == 20
    assert len(made) <= 2
    lp.close()


HOLDER = """
import os, signal, sys
from xsched_lv3.board import Board
board = Board(sys.argv[1])
slot = board.allocate(os.getpid(), 10, 0, int(sys.argv[2]))
board.set_active(slot, True)                      # a request in progress: lower clients are held
print("active", flush=True)
if sys.argv[3] == "stop":
    os.kill(os.getpid(), signal.SIGSTOP)
os._exit(0)                                       # gone without releasing its slot
"""


@pytest.mark.parametrize("fate", ["stop", "exit"])
def test_a_stopped_or_zombie_high_priority_process_holds_nobody_for_long(torch_fake, tmp_path, fate):
    """An HP marked active, then SIGSTOPped (a debugger, ^Z) or exited and not yet reaped by its
    parent (a zombie, which kill(pid, 0) still finds): the held client goes on within a bound
    (REAP_EVERY_S plus a poll), instead of for as long as the HP stays stopped or unreaped."""
    import os
    import signal
    import subprocess
    torch, gpu, xt = torch_fake
    from xsched_lv3.gate import REAP_EVERY_S, Gate
    lp = Gate(xt.TorchRecorder(), priority=0, window_us=None)
    hp = subprocess.Popen([sys.executable, "-c", HOLDER, os.environ["XSCHED_LV3_BOARD"], str(lp.device), fate],
                          stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=os.getcwd()))
    try:
        assert hp.stdout.readline() == "active\n"
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and _state(hp.pid) not in ("T", "Z"):
            time.sleep(0.01)                      # stopped, or exited and left a zombie (never polled)
        assert _state(hp.pid) == ("T" if fate == "stop" else "Z")
        lp._refresh(time.monotonic())
        assert not lp._may_run                    # its slot still says active
        start = time.monotonic()
        lp.check()
        assert time.monotonic() - start < REAP_EVERY_S + 0.5
    finally:
        os.kill(hp.pid, signal.SIGKILL)           # a zombie ignores it; wait() reaps either
        hp.wait()
        lp.close()


def test_a_dead_clients_pid_taken_by_another_process_holds_nobody_for_long(torch_fake):
    """An HP killed mid-request whose pid another process got since (pid reuse): its slot, still
    active, held every lower client until that unrelated process exited. A slot records its
    process's start time too, so the pid alone no longer keeps it."""
    import subprocess
    torch, gpu, xt = torch_fake
    from xsched_lv3.board import Board
    from xsched_lv3.gate import REAP_EVERY_S, Gate
    lp = Gate(xt.TorchRecorder(), priority=0, window_us=None)
    board = Board()
    stranger = subprocess.Popen(["sleep", "30"])        # has the pid now; the HP that had it started earlier
    try:
        hp = board.allocate(stranger.pid, 10, 0, lp.device)
        assert board.read_slot(hp).started                    # what a client's slot records of it
        board.write(hp, started=board.read_slot(hp).started - 1)
        board.set_active(hp, True)
        lp._refresh(time.monotonic())
        assert not lp._may_run
        start = time.monotonic()
        lp.check()
        assert time.monotonic() - start < REAP_EVERY_S + 0.5
        assert stranger.pid not in {s.pid for _, s in board.slots()}
    finally:
        stranger.kill()
        stranger.wait()
        lp.close()
        board.close()


def test_a_forked_child_leaving_keeps_its_parents_slot(torch_fake):
    """A forked child (a DataLoader worker) inherits the gate and the atexit hook that closes it:
    its exit released the parent's slot, and the parent ran unscheduled from then on."""
    torch, gpu, xt = torch_fake
    with xt.client(priority=10) as gate:
        slot = gate.slot
        child = os.fork()
        if child == 0:                                 # the child: leave as a worker does
            try:
                gate.close()
            finally:
                os._exit(0)
        os.waitpid(child, 0)
        assert gate.slot == slot and gate.board.read_slot(slot).pid == os.getpid()


def _state(pid):
    from kfdtool.pids import process_state
    return process_state(pid) or "?"


def test_the_recorder_reuses_completed_events_and_never_a_pending_one(torch_fake):
    """A sync point per event created and destroyed cost a launch-bound job on a GPU: a completed
    event the gate dropped is recorded again, one still pending never is (its query would lie)."""
    torch, gpu, xt = torch_fake
    recorder = xt.TorchRecorder()
    gpu.launch("long", 0.05)
    pending = recorder.record()
    assert not recorder.done(pending)
    second = recorder.record()
    assert second is not pending
    torch.cuda.Stream().synchronize()
    assert recorder.done(pending)
    assert recorder.record() is pending          # reused once done
    assert recorder.record() is not second       # `second` was never reported done: not reused


def test_a_reused_event_from_another_gpu_is_replaced_not_raised(torch_fake, monkeypatch):
    """An event belongs to the GPU it was first recorded on, and recording it on another GPU's stream
    raises: a process that switches GPUs gets a new event there, never an error from the scheduler."""
    torch, gpu, xt = torch_fake
    recorder = xt.TorchRecorder()
    first = recorder.record()
    torch.cuda.Stream().synchronize()
    assert recorder.done(first)                  # dropped by the window: up for reuse
    device = {"now": 1}
    original = torch.cuda.Event.record

    def record_on_its_device(event, stream=None):
        if getattr(event, "device", device["now"]) != device["now"]:
            raise RuntimeError("Event device 0 does not match recording stream's device 1")
        event.device = device["now"]
        return original(event, stream)
    first.device = 0
    monkeypatch.setattr(torch.cuda.Event, "record", record_on_its_device)
    second = recorder.record()
    assert second is not first and second.device == 1


def test_sync_points_are_recorded_on_each_threads_current_stream_found_without_torch_current_stream(torch_fake):
    """An event is recorded on the stream the launching thread uses now (a sync point on another
    stream would not cover its work), found through the private calls torch.cuda.current_stream()
    wraps: the public call was 6.5 % of a GPU-bound batch job's samples on an H100. Without those
    calls (another torch) the public one still serves."""
    torch, gpu, xt = torch_fake
    rec = xt.TorchRecorder()
    side = torch.cuda.Stream()
    default = rec.record().stream
    with torch.cuda.stream(side):
        assert rec.record().stream is side
        other_thread = []
        t = threading.Thread(target=lambda: other_thread.append(rec.record().stream))
        t.start()
        t.join()
        assert other_thread == [default]              # streams are per thread
    assert rec.record().stream is default
    calls = gpu.current_stream_calls
    for _ in range(200):
        rec.record()
    assert gpu.current_stream_calls == calls          # a stream seen before costs no public call
    del torch._C._cuda_getCurrentStream
    fallback = xt.TorchRecorder()
    with torch.cuda.stream(side):
        assert fallback.record().stream is side
    assert gpu.current_stream_calls == calls + 1


def test_a_simulated_hip_job_is_gated_from_its_first_launch(monkeypatch, tmp_path):
    """xsched_lv3.simhip: the process's GPU is known only once it launches; that first launch is
    already gated (held while a higher client sharing the GPU is active)."""
    from kfdtool.sim import hip as sim_hip
    from xsched_lv3 import simhip
    from xsched_lv3.gate import Gate
    monkeypatch.setenv("XSCHED_LV3_BOARD", str(tmp_path / "board"))
    launched = []

    def launch(hip, stream, *args, **kwargs):
        launched.append(time.monotonic())

    def call(model, stream):
        for _ in range(3):
            sim_hip.SimHip.launch(model.hip, stream)
    monkeypatch.setattr(sim_hip.SimHip, "launch", launch)
    monkeypatch.setattr(sim_hip.SimModel, "__call__", call)
    monkeypatch.setattr(simhip, "_installed", False)
    simhip.install()
    hip = types.SimpleNamespace(record=lambda stream: None)
    model = sim_hip.SimModel.__new__(sim_hip.SimModel)
    model.hip = hip
    hp = Gate(simhip.SimHipRecorder(), priority=10, window_us=None)     # GPU unknown: shares every GPU
    hp.board.set_active(hp.slot, True)
    lp = Gate(simhip.SimHipRecorder(), priority=0)
    monkeypatch.setattr(simhip, "_process_gate", lp)
    release = threading.Timer(0.2, hp.board.set_active, (hp.slot, False))
    t0 = time.monotonic()
    release.start()
    model(types.SimpleNamespace(gpu_id=4242))
    release.join()
    assert len(launched) == 3 and launched[0] >= t0 + 0.19 and lp.waits >= 1
    lp.close()
    hp.close()


def test_the_installed_module_call_names_its_module_self(torch_fake):
    """torch's profiler (with_stack) reads the local named `self` from what it takes for
    Module.__call__'s frame: a wrapper whose first parameter had another name crashed the process
    (found with torch 2.13's CPU build in review)."""
    import inspect
    torch, gpu, xt = torch_fake
    xt.install()
    assert next(iter(inspect.signature(torch.nn.Module.__call__).parameters)) == "self"


def test_a_services_watcher_waits_with_a_short_switch_interval(torch_fake, program_interval):
    """The watcher gets the GIL back within the short interval once its request's GPU work is done,
    even where the service's own thread runs Python then (a reply to serialise): with the default
    5 ms its lower clients stayed held up to that long after the work was done. Outside its waits
    the program's interval is left as it was."""
    from xsched_lv3.gil import SHORT_SWITCH_S
    torch, gpu, xt = torch_fake
    seen = []
    lp = other_client(xt, priority=0)                 # someone below: the service tracks its requests
    with xt.client(priority=10) as gate:
        wait = gate.recorder.wait
        gate.recorder.wait = lambda handle: (seen.append(sys.getswitchinterval()), wait(handle))
        m = model(torch, "k", 3, 0.002)
        for _ in range(3):
            m(None)
            torch.cuda.Stream().synchronize()
            _idle(gate)                               # marked idle by the watcher
            assert _interval_becomes(program_interval)
        assert gate.tracking
    assert seen and all(s == pytest.approx(SHORT_SWITCH_S) for s in seen)
    lp.close()


def _gap_kept_open(torch, gpu, gate_module, xt, monkeypatch):
    """A service whose first request's busy period is kept open across the gap after it (no gap
    history yet: it may come straight back); returns (service, lower client) once the work is done."""
    lp = other_client(xt, priority=0)
    service = gate_module.Gate(xt.TorchRecorder(), priority=10, window_us=None, latency_slack=0)
    monkeypatch.setattr(gate_module, "RELEASE_COST_S", 0.3)       # a gap kept open long enough to look at
    service.begin_request()
    gpu.launch("k", 0.002)
    service.end_request()
    torch.cuda.Stream().synchronize()
    time.sleep(0.05)
    assert service.board.read_slot(service.slot)[2]   # the work is done; still marked active: kept open
    return service, lp


def test_a_gap_kept_open_ends_with_the_switch_interval_short_and_gives_it_back(torch_fake, monkeypatch,
                                                                               program_interval):
    """A busy period kept open across a gap ends when the watcher's wait for the next request times
    out; that wake-up needs the GIL too, so the interval is short until then, and the program's
    own afterwards."""
    from xsched_lv3.gil import SHORT_SWITCH_S
    import xsched_lv3.gate as gate_module
    torch, gpu, xt = torch_fake
    service, lp = _gap_kept_open(torch, gpu, gate_module, xt, monkeypatch)
    assert sys.getswitchinterval() == pytest.approx(SHORT_SWITCH_S)
    _idle(service)
    assert _interval_becomes(program_interval)
    service.close()
    lp.close()


def test_a_service_closed_while_a_gap_is_kept_open_gives_the_interval_back(torch_fake, monkeypatch,
                                                                           program_interval):
    import xsched_lv3.gate as gate_module
    torch, gpu, xt = torch_fake
    service, lp = _gap_kept_open(torch, gpu, gate_module, xt, monkeypatch)
    service.close()                                   # before the gap ends
    assert sys.getswitchinterval() == program_interval
    lp.close()


@pytest.mark.parametrize("failing_call", ["wait", "done"])
def test_a_gpu_error_in_the_watchers_wait_does_not_hold_lower_clients(torch_fake, program_interval, failing_call):
    """A request whose completion cannot be waited for or queried (a GPU error the service itself
    will see in its own synchronize) ends the busy period as if done: the watcher lived on and lower
    clients are not held until the service exits."""
    torch, gpu, xt = torch_fake
    lp = other_client(xt, priority=0)
    with xt.client(priority=10, latency_slack=0) as gate:
        call = getattr(gate.recorder, failing_call)
        failing = [True]

        def call_or_fail(handle):
            if failing[0]:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            return call(handle)
        setattr(gate.recorder, failing_call, call_or_fail)
        m = model(torch, "k", 3, 0.002)
        for fail in (True, False):
            failing[0] = fail
            m(None)
            torch.cuda.Stream().synchronize()
            _idle(gate)
        assert gate._watcher.is_alive()
    lp.close()


def test_a_simulated_hip_services_forked_child_runs_unscheduled(monkeypatch, tmp_path):
    """xsched_lv3.simhip, like the PyTorch path: a service that forks a child which runs model calls
    leaves its slot as its own requests leave it. The child's calls went through the parent's gate
    and marked the parent active, and no watcher in the child marked it idle: the lower clients
    stayed suspended until the parent exited (a review's program under `xsched-lv3 run`)."""
    import warnings

    from kfdtool.sim import hip as sim_hip
    from xsched_lv3 import simhip
    from xsched_lv3.gate import Gate
    monkeypatch.setenv("XSCHED_LV3_BOARD", str(tmp_path / "board"))
    monkeypatch.setattr(sim_hip.SimModel, "__call__", lambda model, stream: None)
    monkeypatch.setattr(simhip, "_installed", False)
    simhip.install()
    model = sim_hip.SimModel.__new__(sim_hip.SimModel)
    fake_hip = types.SimpleNamespace(record=lambda stream: object(), query=lambda event: True,
                                     synchronize=lambda event: None)
    gates = []
    for priority in (0, 10):
        recorder = simhip.SimHipRecorder()
        recorder.hip, recorder.stream = fake_hip, types.SimpleNamespace(gpu_id=4242)    # both on one GPU
        gates.append(Gate(recorder, priority=priority, window_us=None))
        gates[-1].notice_device()
    lp, hp = gates
    monkeypatch.setattr(simhip, "_process_gate", hp)
    model(None)                                          # the service's own request marks it active ...
    deadline = time.monotonic() + 2
    while hp.board.read_slot(hp.slot)[2] and time.monotonic() < deadline:
        time.sleep(0.005)                                # ... until its work is done
    assert hp.tracking and hp.stats()["requests"] == 1 and not hp.board.read_slot(hp.slot)[2]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)      # fork with the gate's threads running
        pid = os.fork()
    if pid == 0:                                         # the child: its requests, then exit at once
        try:
            for _ in range(3):
                model(None)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    time.sleep(0.05)
    assert not hp.board.read_slot(hp.slot)[2]            # not left active by the child
    hp.close()
    lp.close()
