"""Patch mode's wrapping of torch.distributed, on the CPU over a one-rank gloo group.

What a GPU adds (the calibrated sleep on the collective's stream, the side stream of asynchronous
calls, the caching allocator's reuse) runs in bench/patch_mode_gpu.py; here the recording twin of
the CUDA actions (racecheck.perturb.recording) checks which calls are wrapped, what each is told,
and that the program's results and the module's functions are untouched.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from racecheck.perturb import collectives, recording
from racecheck.perturb.patch import PatchMode
from racecheck.perturb.profiles import parse_profile
from racecheck.perturb.recording import RecordingActions


@pytest.fixture(scope="module")
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def patched(spec: str) -> tuple[PatchMode, RecordingActions]:
    actions = RecordingActions()
    return PatchMode(parse_profile(spec), actions=actions), actions


@pytest.mark.filterwarnings("ignore:.*is deprecated:FutureWarning")
def test_each_collective_gets_its_points_delay(one_rank_group):
    patch, actions = patched("sleep@before_reduce_scatter:2ms,sleep@before_all_reduce:3ms")
    with patch:
        t = torch.ones(8)
        dist.all_reduce(t)
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        out = torch.empty(8)
        dist.all_gather_into_tensor(out, torch.arange(8.0))  # deprecated form: wrapped once
        dist.reduce_scatter_tensor(out, torch.arange(8.0))
    assert actions.launches == [(0.003, False), (0.003, True), (0.0, False), (0.002, False)]
    assert patch.calls == {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}
    assert torch.equal(t, torch.ones(8)) and torch.equal(out, torch.arange(8.0))


def _entry_points():
    return {(id(owner), name): getattr(owner, name) for owner, name, _ in collectives.process_group_targets()}


def test_uninstall_restores_every_function(one_rank_group):
    before = _entry_points()
    patch, _ = patched("sleep@before_all_gather:1ms")

    def functional_kernel() -> bool:
        return torch._C._dispatch_has_kernel_for_dispatch_key("_c10d_functional::all_reduce", "BackendSelect")

    assert not functional_kernel()
    patch.install()
    assert all(fn._racecheck_patch is patch for fn in _entry_points().values())
    assert functional_kernel()  # the functional collectives: a kernel at the dispatcher, not a new op
    patch.uninstall()
    assert before == _entry_points()
    assert not functional_kernel()


def test_collectives_are_seen_below_torch_distributed(one_rank_group):
    """A library that calls the group's methods, or DTensor's functional collectives, passes
    the same points as torch.distributed's functions."""
    from torch.distributed import _functional_collectives as funcol

    patch, actions = patched("sleep@before_all_gather:1ms,sleep@after_all_reduce:2ms")
    group = dist.distributed_c10d._get_default_group()
    with patch:
        opts = dist.AllreduceOptions()
        group.allreduce([torch.ones(4)], opts).wait()
        gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
        gathered = gather(torch.arange(4.0), 0, group)
        assert torch.equal(funcol.wait_tensor(gathered), torch.arange(4.0))
    assert patch.calls == {"all_reduce": 1, "all_gather": 1}
    assert (0.001, True) in actions.launches  # the functional collective runs asynchronously
    assert ("default", 0.002) in actions.delays  # after the all-reduce, on the caller's stream


def test_a_free_is_acted_on_at_the_next_allocation_on_its_own_stream(one_rank_group):
    patch, actions = patched("pressure@free,poison@free")
    side = recording.HostStream("side")
    with patch:
        ptr = recording.allocate(4096)  # on the default stream
        recording.release(ptr)  # the allocator's deallocation callback: only noted
        assert actions.frees == []
        dist.all_reduce(torch.ones(4))  # a wrapped call is no allocation: nothing yet
        with recording.stream(side):
            recording.allocate(512)  # another stream's pool cannot hand the block out
        assert actions.frees == []
        recording.allocate(512)  # the default stream allocates: the block could be this one
    assert actions.frees == [(ptr, True, False), (4096, False, True)]
    assert patch.counts == {"sleep": 0, "pressure": 1, "poison": 1}
    recording.release(recording.allocate(4096))  # uninstalled: no longer seen
    assert len(actions.frees) == 2


def test_a_wait_between_the_free_and_the_next_allocation_comes_first(monkeypatch):
    """FSDP2's pattern: a block of the side stream's pool is freed while the default stream may
    still read it, and the side stream waits for the default stream before it next allocates.
    The poison must land after that wait, where the program's own allocation would."""
    patch, actions = patched("poison@free")
    side = recording.HostStream("side")
    at_wait = []
    original = recording.HostEvent.wait
    monkeypatch.setattr(
        recording.HostEvent,
        "wait",
        lambda self, stream=None: (at_wait.append(list(actions.frees)), original(self, stream)),
    )
    with patch:
        with recording.stream(side):
            ptr = recording.allocate(4096)  # the side stream's block
        recording.release(ptr)  # freed on the default stream (zero_grad)
        side.wait_stream(recording.current_stream())  # the program orders the side stream first
        with recording.stream(side):
            recording.allocate(4096)
    assert at_wait == [[]] and actions.frees == [(ptr, True, False)]


def test_a_block_the_program_took_back_is_left_alone(one_rank_group):
    patch, actions = patched("poison@free")
    with patch:
        ptr = recording.allocate(4096)
        recording.release(ptr)
        recording._blocks[ptr][2] = True  # handed out again before the next callback
        recording.allocate(512)
    assert actions.frees == [] and patch.counts["poison"] == 0


def test_a_free_inside_the_patch_modes_own_work_does_not_hang_or_count():
    # The allocator's callbacks can run from a garbage-collection pass that starts inside patch
    # mode's own allocator actions, on the same thread.
    import threading

    patch, actions = patched("pressure@free")
    with patch:

        def free_while_acting():
            patch._local.acting = True
            recording.release(recording.allocate(4096))
            patch._local.acting = False
            recording.release(recording.allocate(4096))

        worker = threading.Thread(target=free_while_acting, daemon=True)
        worker.start()
        worker.join(timeout=10)
        assert not worker.is_alive(), "the free waited on its own thread"
        noted = patch._pending.take(recording.DEFAULT.handle)
    assert patch.counts["pressure"] == 0 and len(noted) == 1  # the program's free only


def test_patch_mode_refuses_what_it_cannot_do():
    for spec in (
        "sleep@free:1ms",
        "reorder@before_all_reduce>end_of_backward:1ms",
        "sleep@reshard:1ms",
        "sleep@before_all_reduce:1ms/other",
    ):
        with pytest.raises(ValueError, match="patch mode"):
            PatchMode(parse_profile(spec), actions=RecordingActions())


def test_launcher_runs_the_script_under_the_patch(tmp_path, monkeypatch):
    from racecheck.perturb import patch as patch_mod

    script = tmp_path / "train.py"
    script.write_text(
        "import sys\nimport torch.distributed as dist\n"
        "patch = getattr(dist.ProcessGroup.allreduce, '_racecheck_patch', None)\n"
        "open(sys.argv[1], 'w').write(patch.profile.to_spec() if patch else 'none')\n"
    )
    seen = tmp_path / "seen"
    monkeypatch.setattr("sys.argv", ["python"])
    monkeypatch.setenv("RACECHECK_PERTURB", "off")  # restored after the launcher overwrites it
    monkeypatch.setenv("RACECHECK_SEED", "0")
    monkeypatch.setenv("RACECHECK_PATCH_ACTIONS", "recording")  # the CPU twin acts where CUDA would
    try:
        assert patch_mod.main(["--perturb", "sleep@before_all_reduce:1ms", str(script), str(seen)]) == 0
    finally:
        installed = getattr(dist.ProcessGroup.allreduce, "_racecheck_patch", None)
        if installed is not None:
            installed.uninstall()
    assert seen.read_text() == "sleep@before_all_reduce:1ms"
    assert getattr(dist.all_reduce, "_racecheck_patch", None) is None


def test_the_launcher_takes_its_defaults_from_the_environment_and_refuses_a_bad_seed(tmp_path, monkeypatch, capsys):
    from racecheck.perturb import patch as patch_mod

    script = tmp_path / "train.py"
    script.write_text("")
    monkeypatch.setenv("RACECHECK_SEED", "forty-two")
    with pytest.raises(SystemExit) as refused:
        patch_mod.main([str(script)])
    assert refused.value.code == 2 and "RACECHECK_SEED" in capsys.readouterr().err
    monkeypatch.setenv("RACECHECK_SEED", "3")
    monkeypatch.setenv("RACECHECK_PERTURB", "nonsense@x")
    with pytest.raises(SystemExit) as refused:
        patch_mod.main([str(script)])
    assert refused.value.code == 2 and "unknown perturbation action 'nonsense'" in capsys.readouterr().err


def test_the_launcher_refuses_a_profile_that_cannot_act_here(tmp_path, monkeypatch, capsys):
    """Without CUDA a profile would wrap torch and perturb nothing, and the script would pass as if
    checked: refused in one line (exit 2), as `racecheck run` refuses it; `off` runs the script."""
    import torch

    from racecheck.perturb import patch as patch_mod

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the refusal is for machines without it")
    monkeypatch.delenv("RACECHECK_PATCH_ACTIONS", raising=False)
    script = tmp_path / "train.py"
    script.write_text("open(__file__ + '.ran', 'w').close()\n")
    with pytest.raises(SystemExit) as refused:
        patch_mod.main(["--perturb", "sleep@before_all_reduce:3s", str(script)])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and "error: the profile 'sleep@before_all_reduce:3s' acts on CUDA streams" in err
    assert not (tmp_path / "train.py.ran").exists()
    monkeypatch.setattr("sys.argv", ["python"])
    assert patch_mod.main(["--perturb", "off", str(script)]) == 0 and (tmp_path / "train.py.ran").exists()


def test_each_hand_off_point_delays_the_stream_the_work_after_it_runs_on():
    side, other = recording.HostStream("side"), recording.HostStream("other")
    before = {(o, n): getattr(o, n) for o, n, _ in RecordingActions().handoff_targets()}
    patch, actions = patched("sleep@stream_enter:1ms,sleep@stream_wait:2ms,sleep@event_record:3ms")
    with patch:
        with recording.stream(side):  # entered: side; left for the default stream: no point
            pass
        other.wait_stream(side)  # the waiting stream; its inner record and wait are not points
        side.wait_event(other.record_event())  # a record on other, a wait on side
        recording.HostEvent().record()  # on the current (default) stream
    assert actions.delays == [("side", 0.001), ("other", 0.002), ("other", 0.003), ("side", 0.002), ("default", 0.003)]
    assert patch.counts["sleep"] == 5
    assert before == {(o, n): getattr(o, n) for o, n in before}  # uninstalled: the originals again


def test_systematic_records_then_delays_only_the_planned_keys():
    from racecheck.perturb.patch import PatchMode

    def step():
        side = recording.HostStream("side")
        with recording.stream(side):
            pass
        recording.current_stream().wait_stream(side)
        return side

    recorder = PatchMode(parse_profile("systematic"), actions=RecordingActions())
    with recorder:
        alive = [step(), step()]  # a second pass adds its new stream's keys, not the same ones again
    keys = list(recorder.handoffs)
    # every hand-off on both of its sides: a wait has a point before it and one after it
    assert [k.split("@")[0] for k in keys] == ["stream_enter", "before_stream_wait", "stream_wait", "stream_enter"]
    assert keys[0].endswith("/s1") and keys[2].endswith("/default") and keys[3].endswith("/s2")
    assert recorder.counts["sleep"] == 0
    actions = RecordingActions()
    with PatchMode(parse_profile("systematic:delay=2ms"), actions=actions, plan=(keys[2],)):
        alive += [step(), step()]
    assert actions.delays == [("default", 0.002), ("default", 0.002)]


def test_systematic_selection_and_its_stated_bound():
    from racecheck.perturb.systematic import coverage, selection

    assert [selection(t, 3, pairs=True) for t in range(8)] == [(), (0,), (1,), (2,), (0, 1), (0, 2), (1, 2), (0,)]
    assert [selection(t, 2, pairs=False) for t in range(4)] == [(), (0,), (1,), (0,)]
    assert (
        coverage(7, 8, pairs=False)
        == "systematic: k=7 points (before and after each hand-off), all singles covered in trials 1..7"
    )
    assert coverage(3, 10, pairs=True) == (
        "systematic: k=3 points (before and after each hand-off), all singles covered in trials 1..3, "
        "all 3 pairs in trials 4..6"
    )
    assert "only in trials 1..2 (2 of 7)" in coverage(7, 3, pairs=True)
