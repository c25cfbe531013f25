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
import torch.distributed.distributed_c10d as c10d

from racecheck.perturb.patch import WRAPPED, CollectivePatch
from racecheck.perturb import recording
from racecheck.perturb.profiles import parse_profile
from racecheck.perturb.recording import RecordingActions


@pytest.fixture(scope="module")
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def patched(spec: str) -> tuple[CollectivePatch, RecordingActions]:
    actions = RecordingActions()
    return CollectivePatch(parse_profile(spec), actions=actions), actions


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


def test_uninstall_restores_every_function(one_rank_group):
    before = {(m.__name__, n): getattr(m, n) for m in (dist, c10d) for n in WRAPPED if hasattr(m, n)}
    patch, _ = patched("sleep@before_all_gather:1ms")
    patch.install()
    assert all(getattr(m, n)._racecheck_patch is patch for m in (dist, c10d) for n in WRAPPED if hasattr(m, n))
    patch.uninstall()
    assert before == {(m.__name__, n): getattr(m, n) for m in (dist, c10d) for n in WRAPPED if hasattr(m, n)}


def test_pressure_follows_a_free_at_the_next_point(one_rank_group):
    patch, actions = patched("pressure@free")
    with patch:
        ptr = recording.release(4000)  # the allocator's deallocation callback
        assert actions.frees == []  # never inside the callback: at the next point the host passes
        dist.all_reduce(torch.ones(4))
    assert actions.frees == [(ptr, False, True)]
    assert patch.counts == {"sleep": 0, "pressure": 1, "poison": 0}
    recording.release(4000)  # uninstalled: no longer seen
    assert len(actions.frees) == 1


def test_patch_mode_refuses_what_it_cannot_do():
    for spec in ("sleep@free:1ms", "reorder@before_all_reduce>end_of_backward:1ms", "sleep@reshard:1ms",
                 "sleep@before_all_reduce:1ms/other", "pressure@free/other"):
        with pytest.raises(ValueError, match="patch mode"):
            CollectivePatch(parse_profile(spec), actions=RecordingActions())


def test_launcher_runs_the_script_under_the_patch(tmp_path, monkeypatch):
    from racecheck.perturb import patch as patch_mod

    script = tmp_path / "train.py"
    script.write_text("import sys\nimport torch.distributed as dist\n"
                      "patch = getattr(dist.all_reduce, '_racecheck_patch', None)\n"
                      "open(sys.argv[1], 'w').write(patch.profile.to_spec() if patch else 'none')\n")
    seen = tmp_path / "seen"
    monkeypatch.setattr("sys.argv", ["python"])
    monkeypatch.setenv("RACECHECK_PERTURB", "off")  # restored after the launcher overwrites it
    monkeypatch.setenv("RACECHECK_SEED", "0")
    try:
        assert patch_mod.main(["--perturb", "sleep@before_all_reduce:1ms", str(script), str(seen)]) == 0
    finally:
        installed = getattr(dist.all_reduce, "_racecheck_patch", None)
        if installed is not None:
            installed.uninstall()
    assert seen.read_text() == "sleep@before_all_reduce:1ms"
    assert getattr(dist.all_reduce, "_racecheck_patch", None) is None
