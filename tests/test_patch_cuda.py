"""Patch mode's CUDA actions on a GPU: what the CPU tests drive through the recording twin, here
with torch.cuda's own streams, the caching allocator and calibrated sleeps. Skipped without a GPU
(run on the GPU machine with `pytest tests/test_patch_cuda.py`).

The pattern has no collective: a side stream copies a buffer that the default stream then frees
and reuses; `record_stream` is the fix. A delay where the host enters the side stream holds the
copy back until the reuse has overwritten the buffer.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from racecheck.perturb.patch import PatchMode
from racecheck.perturb.profiles import parse_profile

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

N = 1 << 22  # 16 MiB of float32

PATTERN = '''
import torch

N = 1 << 22


def side_copy_of_freed(fixed: bool, reuse: bool = True) -> bool:
    """True when the copy read something else than the buffer's ones (the race happened). With
    reuse=False the program's next allocation on the default stream is of another size (the small
    pool): it cannot be handed a's block, so only pressure or poison, done there, collide."""
    side = torch.cuda.Stream()
    a = torch.ones(N, device="cuda")  # allocated and written on the default stream
    out = torch.empty(N, device="cuda")
    side.wait_stream(torch.cuda.current_stream())  # producer: default (a, out); consumer: side
    with torch.cuda.stream(side):
        out.copy_(a)  # reads a on the side stream
    if fixed:
        a.record_stream(side)  # the fix: a's block waits for the side stream's copy
    del a  # without the fix, a's block is back in the default stream's pool at once
    # the next allocation on the default stream: a's block (reuse), or another pool's
    b = torch.full((N,), 2.0, device="cuda") if reuse else torch.zeros(8, device="cuda")
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    del b
    return bool((out != 1.0).any())
'''


@pytest.fixture(scope="module")
def pattern(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pattern")
    (folder / "pattern_mod.py").write_text(textwrap.dedent(PATTERN))
    import importlib.util

    spec = importlib.util.spec_from_file_location("pattern_mod", folder / "pattern_mod.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.side_copy_of_freed


def runs(
    pattern, spec: str | None, *, fixed: bool, trials: int = 10, plan=None, reuse: bool = True
) -> tuple[int, dict]:
    failures, counts = 0, {"sleep": 0, "pressure": 0, "poison": 0}
    for seed in range(trials):
        patch = PatchMode(parse_profile(spec), seed=seed, plan=plan) if spec else None
        if patch:
            patch.install()
        try:
            failures += pattern(fixed, reuse)
        finally:
            if patch:
                patch.uninstall()
                counts = {k: counts[k] + v for k, v in patch.counts.items()}
    return failures, counts


def test_a_delay_at_stream_entry_exposes_the_race_and_the_fix_holds(pattern):
    failures, counts = runs(pattern, "sleep@stream_enter:5ms", fixed=False)
    assert failures >= 9 and counts["sleep"] >= 10
    assert runs(pattern, "sleep@stream_enter:5ms", fixed=True)[0] == 0


@pytest.mark.parametrize("action", ["pressure", "poison"])
def test_pressure_and_poison_make_a_free_collide_where_nothing_reuses_it(pattern, action):
    spec = f"sleep@stream_enter:5ms,{action}@free"
    assert runs(pattern, "sleep@stream_enter:5ms", fixed=False, reuse=False)[0] == 0  # no reuse: no harm
    failures, counts = runs(pattern, spec, fixed=False, reuse=False)
    assert failures >= 9 and counts[action] >= 9
    # record_stream holds the block back (pending free: left alone) until the copy is done
    assert runs(pattern, spec, fixed=True, reuse=False)[0] == 0


@pytest.mark.parametrize(
    "spec",
    [
        "sleep@stream_enter:3ms,sleep@stream_wait:3ms,pressure@free",
        "sleep@stream_enter:3ms,sleep@stream_wait:3ms,poison@free",
        "random",
    ],
)
def test_fsdp2s_free_before_the_wait_never_fails(spec):
    """The false alarm of an allocator action ahead of the program's own wait
    (bench/fsdp2_free_before_wait.py): it failed 10/10 under the first two profiles when poison
    and pressure acted at the next stream call; at the next allocation they act behind the wait."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "fsdp2_free_before_wait.py"
    loaded = importlib.util.spec_from_file_location("fsdp2_free_before_wait", path)
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    module.freed_before_the_wait()  # warm-up
    failures, acted = 0, 0
    for seed in range(10):
        with PatchMode(parse_profile(spec), seed=seed) as patch:
            failures += module.freed_before_the_wait()
        acted += patch.counts["pressure"] + patch.counts["poison"]
    assert failures == 0 and (acted > 0 or spec == "random")


def test_systematic_records_the_points_and_one_of_them_exposes_the_race(pattern):
    recorder = PatchMode(parse_profile("systematic"))
    with recorder:
        pattern(False, True)
    keys = list(recorder.handoffs)
    kinds = [k.split("@")[0] for k in keys]
    assert {"stream_enter", "before_stream_wait", "stream_wait"} <= set(kinds)
    assert all("pattern_mod.py:" in k for k in keys)
    exposing = [k for k in keys if runs(pattern, "systematic", fixed=False, trials=5, plan=(k,))[0] >= 4]
    assert any(k.startswith("stream_enter@") for k in exposing), keys
    assert all(runs(pattern, "systematic", fixed=True, trials=5, plan=(k,))[0] == 0 for k in keys)


def test_the_tracker_reports_the_race_through_racecheck_run(tmp_path):
    from run_kit import racecheck, write_suite

    suite = PATTERN + textwrap.dedent("""

    def test_copy(racecheck_arm):
        assert not side_copy_of_freed(racecheck_arm == "fixed")
    """)
    root = write_suite(
        tmp_path / "p", arms={"asis": {"expect": "race"}, "fixed": {"expect": "safe"}}, tests={"test_copy.py": suite}
    )
    res = racecheck("run", "--trials", 2, "--detect", "--no-perturb", "--out", tmp_path / "d", "-q", cwd=root)
    assert res.code == 0, res
    from racecheck.runner.trial_log import read_log

    got = {(r.arm, r.trial): r for r in read_log(tmp_path / "d" / "trials.jsonl")}
    assert all(got["asis", t].detected >= 1 and got["asis", t].outcome == "failed" for t in range(2))
    assert all(got["fixed", t].detected == 0 for t in range(2))
    res = racecheck(
        "run", "--trials", 3, "--perturb", "sleep@stream_enter:5ms", "--out", tmp_path / "p5", "-q", cwd=root
    )
    assert res.code == 0, res
    got = {(r.arm, r.trial): r for r in read_log(tmp_path / "p5" / "trials.jsonl")}
    assert all(got["asis", t].outcome == "failed" and got["asis", t].actions["sleep"] >= 1 for t in range(3))
    assert all(got["fixed", t].outcome == "passed" for t in range(3))
    assert all(r.device == "cuda" for r in got.values())
