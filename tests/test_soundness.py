"""The perturbation never fails correct code and the detector never reports it; the same code with
one synchronization removed is reported and found. On the CPU emulation, over programs that
Hypothesis generates (racecheck.scenario_kit.programs): correctly synchronized by construction,
with events, wait_stream, host synchronizations, record_stream, pinned host buffers, and frees at
every legal moment (before the other streams are done, with the buffer's stream made to wait
before it next allocates). The GPU check runs the same programs on torch.cuda (bench/soundness.py).

The examples are drawn from a fixed seed (derandomize), so CI sees the same programs every run;
RACECHECK_SOUNDNESS_EXAMPLES raises their number for a longer search.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from racecheck.scenario_kit.program_values import expected
from racecheck.scenario_kit.programs import copies_written_as, early_record, programs
from racecheck.scenario_kit.soundness import (
    EmulationInjector,
    EmulationPatch,
    correct_failures,
    profile_specs,
    racy_verdict,
)

EXAMPLES = int(os.environ.get("RACECHECK_SOUNDNESS_EXAMPLES", "12"))
# The systematic schedule's delay in the racy programs: the delayed side stream must still be
# behind when the host makes the access it races with, however long the host thread waits for a
# core on a loaded machine (50 ms was not always enough beside the suite's other processes).
RACE_DELAY_S = 0.25


def examples(n: int):
    return settings(
        max_examples=n, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
    )


@examples(EXAMPLES)
@given(programs())
def test_correct_programs_pass_under_patch_modes_profiles_their_pairs_and_random(program):
    backend = EmulationPatch()
    assert correct_failures(backend, program, profile_specs(backend.profiles)) == [], program.text()


@examples(EXAMPLES)
@given(programs())
def test_correct_programs_pass_under_the_injectors_profiles_their_pairs_and_random(program):
    backend = EmulationInjector()
    assert correct_failures(backend, program, profile_specs(backend.profiles)) == [], program.text()


@examples(max(3, EXAMPLES // 3))
@given(programs())
def test_correct_programs_pass_with_every_single_point_delayed(program):
    backend = EmulationPatch()
    spec = "systematic:delay=2ms:pairs=0"
    keys = backend.run(program, spec=spec).handoffs
    want = expected(program)
    assert [k for k in keys if backend.run(program, spec=spec, plan=(k,)).outcome != want] == [], program.text()


@examples(EXAMPLES)
@given(programs(), st.data())
def test_a_missing_synchronization_is_reported_and_found_within_the_bound(program, data):
    assume(any(s.reason == "access" for s in program.syncs))
    i = data.draw(st.sampled_from([i for i, s in enumerate(program.syncs) if s.reason == "access"]))
    verdict = racy_verdict(EmulationPatch(), program, i, delay=RACE_DELAY_S)
    assert verdict.reported, program.text()
    if verdict.must_find:
        assert verdict.found_in is not None and verdict.found_in <= verdict.k, (verdict, program.text())


@examples(max(4, EXAMPLES // 2))
@given(programs(), st.data())
def test_an_event_recorded_before_the_write_it_must_cover_is_reported_and_found(program, data):
    """The event exists and is waited on, but was recorded on the producer's stream just before
    the access it must cover (`ev.record(s)` ahead of the write): the waiter is not ordered after
    that access. The detector reports it; delaying the work after the record exposes it."""
    early = [i for i, s in enumerate(program.syncs) if s.reason == "access" and early_record(program, i) is not None]
    assume(early)
    i = data.draw(st.sampled_from(early))
    verdict = racy_verdict(EmulationPatch(), program, i, delay=RACE_DELAY_S, mutation=early_record)
    assert verdict.reported, program.text()
    if verdict.must_find:
        assert verdict.found_in is not None and verdict.found_in <= verdict.k, (verdict, program.text())


@examples(max(4, EXAMPLES // 2))
@given(programs(), st.data())
def test_a_missing_wait_before_reuse_is_reported_and_found_within_the_bound(program, data):
    reuses = [i for i, s in enumerate(program.syncs) if s.reason == "reuse"]
    assume(reuses)
    verdict = racy_verdict(EmulationPatch(), program, data.draw(st.sampled_from(reuses)), delay=RACE_DELAY_S)
    if verdict.physical:  # the allocation was handed the freed block: a reuse race happened
        assert verdict.reported, program.text()
    if verdict.must_find:
        assert verdict.found_in is not None and verdict.found_in <= verdict.k, (verdict, program.text())


def test_the_check_fails_an_allocator_action_at_the_free(monkeypatch):
    """The check has teeth: acting on a freed block at its free, on the block's stream (before
    the waits the program makes before it next allocates there), fails correct programs."""
    from racecheck.device.pool_state import PoolState
    from racecheck.perturb.patch import PatchMode

    noted = PatchMode._freed

    def at_the_free(self, ptr):
        noted(self, ptr)
        view = self.actions.pool_view()
        for key in list(self._pending._by_stream):
            for request in self._pending.take(key):
                found = view.find(request.ptr)
                if found is not None and found[0] is PoolState.IN_POOL:
                    self.actions.poison(found[1], found[2], found[3])

    monkeypatch.setattr(PatchMode, "_freed", at_the_free)
    failing = []

    @examples(60)
    @given(programs())
    def search(program):
        if not failing and correct_failures(EmulationPatch(), program, ["enter_delay,poison"]):
            failing.append(program)

    search()
    assert failing, "no generated program exposed an allocator action at the free"


@pytest.mark.parametrize("backend", [EmulationPatch(), EmulationInjector()], ids=lambda b: b.name)
def test_the_profiles_act_on_generated_programs(backend):
    """A profile that never acted would pass vacuously: each acts somewhere in a few programs (the
    free actions, which need a block asked for again while it is still free, in fewer)."""
    acted: dict[str, int] = {spec: 0 for spec in backend.profiles}

    @examples(40)
    @given(programs())
    def count(program):
        for spec in [spec for spec, n in acted.items() if not n]:  # until each has acted
            acted[spec] += sum(backend.run(program, spec=spec).counts.values())

    count()
    assert all(acted.values()), acted


def program_with_copies():
    """A generated program with two copies or more (the first of a fixed draw, always the same)."""
    found = []

    @examples(300)
    @given(programs())
    def search(program):
        if not found and sum(op.kind == "copy" for op in program.ops) >= 2:
            found.append(program)

    search()
    assert found, "no generated program with two copies"
    return found[0]


MODERN_CODE = """
import importlib.abc, json, sys
from racecheck.device.base import Stream
from racecheck.scenario_kit.program_kernels import DISTRIBUTED_FORMS
from racecheck.scenario_kit.program_values import expected
from racecheck.scenario_kit.programs import copies_written_as
from racecheck.scenario_kit.soundness import EmulationPatch, correct_failures, profile_specs
from test_soundness import program_with_copies

LATE = ("torch.distributed._functional_collectives", "torch.distributed.tensor", "torch.distributed.fsdp",
        "torch._inductor")
imported = {m: m in sys.modules for m in LATE}  # True: before any run, which must not be

class Watch(importlib.abc.MetaPathFinder):  # notes whether patch mode was installed at each import
    def find_spec(self, name, path, target=None):
        if name in LATE and name not in imported_under:
            imported_under[name] = getattr(Stream.wait_event, "_racecheck_patch", None) is not None
        return None

imported_under = {}
sys.meta_path.insert(0, Watch())
program, backend, bad, forms = program_with_copies(), EmulationPatch(), [], []
for form in (*DISTRIBUTED_FORMS, "compiled"):  # every copy written in the form: the same program
    variant = copies_written_as(program, form)
    forms.append(form)
    bad += correct_failures(backend, variant, profile_specs(backend.profiles))  # and the detector
    spec = "systematic:delay=2ms:pairs=0"
    keys = backend.run(variant, spec=spec).handoffs
    bad += [k for k in keys if backend.run(variant, spec=spec, plan=(k,)).outcome != expected(variant)]
print(json.dumps({"before": imported, "under_patch": imported_under, "forms": forms, "bad": bad}))
"""


def test_generated_programs_import_the_distributed_modules_under_patch_mode_and_stay_correct():
    """The soundness check reaches modern code: a generated program with its copies written
    through the functional collectives, a DTensor's full_tensor(), FSDP2's own operator (over a
    world of one rank) and a compiled function, in a fresh process where those modules are first
    imported inside a run with patch mode installed, as a user's test imports FSDP2 in its body.
    Each variant computes what it should under every profile, every pair, random and every single
    point delayed, and the detector reports nothing."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", MODERN_CODE], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.splitlines()[-1])
    assert not any(got["before"].values()), got
    assert got["under_patch"] == dict.fromkeys(got["before"], True), got
    assert got["forms"] == ["collective", "dtensor", "fsdp2", "compiled"], got
    assert got["bad"] == [], got


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU: torch.cuda, NCCL and Triton (bench/modern_code.sh runs it)"
)
@pytest.mark.parametrize("path", ["native", "python"])
def test_on_cuda_a_program_with_its_copies_in_every_form_is_correct_and_unreported(monkeypatch, path):
    """The same on torch.cuda, on both detector paths: the program's copies written in each form
    (a Triton kernel of its own among them, the distributed ones over an NCCL group of one rank),
    under profiles at the hand-off points, the collective points and the allocator, and random."""
    from racecheck.scenario_kit.program_kernels import world_of_one
    from racecheck.scenario_kit.program_ops import FORMS
    from racecheck.scenario_kit.soundness import COLLECTIVE_PROFILES, TorchCudaPatch

    monkeypatch.setenv("RACECHECK_DETECT_PATH", path)
    program, backend = program_with_copies(), TorchCudaPatch()
    specs = ["enter_delay,poison", "ar_delay,pressure", "sleep@before_all_gather:5ms,wait_delay", "random"]
    with world_of_one(set(FORMS["copy"]), cuda=True):
        for form in FORMS["copy"]:
            variant = copies_written_as(program, form)
            assert correct_failures(backend, variant, specs) == [], (form, variant.text())
        # the collective points act on the collective form: its profiles are no vacuous pass
        collective = copies_written_as(program, "collective")
        acted = {spec: backend.run(collective, spec=spec).counts["sleep"] for spec in COLLECTIVE_PROFILES}
        assert all(acted.values()), acted
