"""The soundness check: generated programs (programs.py) run under every named profile, every
pair of them and the random schedule, and under the detector, on one backend; and the same
programs with one synchronization removed, which the detector must report and the systematic
schedule must find within its bound.

A backend runs a program once and says what it computed, what the detector reported and what
the perturbation did. Four are defined: patch mode and the injector on racecheck's runtime (the
CPU emulation in CI, `EmulationPatch` and `EmulationInjector`), and patch mode with the PyTorch
tracker on torch.cuda itself (`TorchCudaPatch`, in the GPU check, bench/soundness.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools

from racecheck.perturb.profiles import Profile, parse_profile
from racecheck.scenario_kit.program_ops import Program
from racecheck.scenario_kit.program_values import Outcome, changes_value, expected
from racecheck.scenario_kit.programs import without

# The named profiles that act on generated programs, per kind of backend.
PATCH_PROFILES = (
    "enter_delay",
    "wait_delay",
    "before_wait_delay",
    "record_delay",
    "after_record_delay",
    "poison",
    "pressure",
)
INJECTOR_PROFILES = ("sleep@event_wait:5ms", "poison", "pressure")
# On torch.cuda the programs' distributed copies (program_kernels.py) pass patch mode's collective
# points as well; on the emulation they run inside its stream workers, where those points do not act.
COLLECTIVE_PROFILES = (
    "ar_delay",
    "sleep@before_all_gather:5ms",
    "sleep@after_all_reduce:5ms",
    "sleep@after_all_gather:5ms",
)


def profile_specs(names: tuple[str, ...]) -> list[str]:
    """Every profile alone, every pair joined, and the random schedule."""
    return [*names, *(f"{a},{b}" for a, b in itertools.combinations(names, 2)), "random"]


@functools.cache
def profile_of(spec: str | None) -> Profile:
    """The Profile of one of the specs above (None: off), parsed once: the programs meet the
    same few specs run after run."""
    return parse_profile(spec or "off")


@dataclasses.dataclass
class Run:
    outcome: Outcome
    reports: list
    counts: dict[str, int]  # actions taken
    handoffs: list[str]  # systematic recording: the keys passed


class EmulationPatch:
    """Patch mode (its runtime actions) on a fresh CPU-emulation runtime per run."""

    name = "emulation, patch mode"
    profiles = PATCH_PROFILES
    supports_systematic = True

    def __init__(self, *, delay: float | None = 0.002) -> None:
        self.delay = delay  # every delay of a profile resized (None: as named)

    def run(
        self, program: Program, *, spec: str | None = None, seed: int = 0, plan=None, detect=False, engine=None
    ) -> Run:
        """`program` run once on a fresh runtime: under `spec` (None: unperturbed) and, with
        `detect`, the race detector on `engine` (RaceDetector's: None, its default)."""
        from racecheck.detect.observer import RaceDetector
        from racecheck.device.sim import SimRuntime
        from racecheck.perturb.patch import PatchMode
        from racecheck.perturb.runtime_actions import RuntimeActions
        from racecheck.scenario_kit.program_runs import run_on_runtime

        rt = SimRuntime()
        patch = None
        if spec is not None:
            profile = profile_of(spec)
            if self.delay is not None and profile.systematic is None:
                profile = profile.with_delay(self.delay)
            patch = PatchMode(profile, actions=RuntimeActions(rt), seed=seed, plan=plan)
        detector = RaceDetector(engine=engine) if detect else None

        @contextlib.contextmanager
        def around():
            with contextlib.ExitStack() as stack:
                if detector is not None:
                    stack.enter_context(detector.attached(rt))
                if patch is not None:
                    stack.enter_context(patch)
                yield

        try:
            outcome = run_on_runtime(program, rt, around=around)
        finally:
            rt.close()
        return Run(
            outcome,
            detector.reports() if detector else [],
            dict(patch.counts) if patch else {},
            list(patch.handoffs) if patch else [],
        )


class EmulationInjector(EmulationPatch):
    """racecheck's own injector (runtime points: event waits, frees) on the CPU emulation."""

    name = "emulation, injector"
    profiles = INJECTOR_PROFILES
    supports_systematic = False

    def run(self, program: Program, *, spec: str | None = None, seed: int = 0, plan=None, detect=False) -> Run:
        from racecheck.device.sim import SimRuntime
        from racecheck.perturb.injector import Injector
        from racecheck.scenario_kit.program_runs import run_on_runtime

        rt = SimRuntime()
        profile = profile_of(spec)
        if self.delay is not None:
            profile = profile.with_delay(self.delay)
        injector = Injector(profile, seed=seed, rank=0)

        @contextlib.contextmanager
        def around():
            rt.add_observer(injector)
            try:
                yield
            finally:
                rt.remove_observer(injector)
                injector.open_gates()

        try:
            outcome = run_on_runtime(program, rt, around=around)
        finally:
            rt.close()
        counts: dict[str, int] = {}
        for fired in injector.log:
            kind = type(fired.action).__name__.lower()
            counts[kind] = counts.get(kind, 0) + 1
        return Run(outcome, [], counts, [])


class TorchCudaPatch(EmulationPatch):
    """Patch mode (CUDA actions) and the PyTorch tracker on torch.cuda's own streams."""

    name = "torch.cuda, patch mode"
    profiles = PATCH_PROFILES + COLLECTIVE_PROFILES

    def __init__(self, *, delay: float | None = None) -> None:
        super().__init__(delay=delay)

    def run(self, program: Program, *, spec: str | None = None, seed: int = 0, plan=None, detect=False) -> Run:
        from racecheck.detect.torch_tracker import TorchRaceTracker
        from racecheck.perturb.patch import PatchMode
        from racecheck.scenario_kit.program_runs import run_on_torch_cuda

        patch = None
        if spec is not None:
            profile = profile_of(spec)
            if self.delay is not None and profile.systematic is None:
                profile = profile.with_delay(self.delay)
            patch = PatchMode(profile, seed=seed, plan=plan)
        tracker = TorchRaceTracker() if detect else None

        @contextlib.contextmanager
        def around():
            with contextlib.ExitStack() as stack:
                if tracker is not None:
                    stack.enter_context(tracker)
                if patch is not None:
                    stack.enter_context(patch)
                yield

        outcome = run_on_torch_cuda(program, around=around)
        return Run(
            outcome,
            tracker.reports() if tracker else [],
            dict(patch.counts) if patch else {},
            list(patch.handoffs) if patch else [],
        )


def correct_failures(backend, program: Program, specs: list[str], *, seed: int = 0) -> list[str]:
    """The profiles under which a correctly synchronized program computed something else, and
    whether the detector reported it: [] when sound."""
    want = expected(program)
    bad = []
    for i, spec in enumerate(specs):
        got = backend.run(program, spec=spec, seed=seed + i).outcome
        if got != want:
            bad.append(f"{spec}: computed {got.values} / {got.witnesses}, expected {want.values} / {want.witnesses}")
    plain = backend.run(program, detect=True)
    if plain.outcome != want:
        bad.append("unperturbed: computed something else")
    if plain.reports:
        bad.append("detector: " + "; ".join(r.text().splitlines()[0] for r in plain.reports))
    return bad


@dataclasses.dataclass
class RacyVerdict:
    """What the tools said of a program with one synchronization removed."""

    reason: str  # the removed synchronization's: access or reuse
    reported: bool  # the detector, one unperturbed run
    physical: bool  # an access race, or a reuse whose allocation was handed the freed block
    k: int  # the systematic schedule's points (0: not run)
    found_in: int | None  # the first systematic trial that computed something else
    must_find: bool  # a delayed point alone must expose it (see racy_verdict)


def racy_verdict(backend, program: Program, i: int, *, delay: float = 0.05, mutation=without) -> RacyVerdict:
    """Remove the program's i-th synchronization (or break it otherwise: `mutation`, e.g.
    programs.early_record) and ask the detector and the systematic schedule.

    The systematic schedule runs, and must find it, when one delayed point exposes the race
    whatever the program does next: the earlier access is on a side stream (its entry is a
    hand-off point) and nothing else orders the two; for an access race, the earlier one writes
    a new value and the later one is a read that keeps what it saw (a witness); for a reuse, the
    allocation was handed the freed block and the earlier access is such a read of it. A race on
    the default stream before any hand-off, or one whose effect a later write hides, is the
    detector's alone."""
    sync = program.syncs[i]
    racy = mutation(program, i)
    plain = backend.run(racy, detect=True)
    early, late = program.ops[sync.early_op], program.ops[sync.late_op]
    if sync.reason == "access":
        physical = True
        must_find = (
            sync.early_stream > 0
            and late.kind in ("read", "host_read")
            and late.src == early.buf
            and changes_value(program, sync.early_op)
        )
    else:  # a reuse: the allocation must have been handed a freed block, and read early
        freed = {plain.outcome.addresses.get(b) for b in sync.freed}
        physical = plain.outcome.addresses.get(late.buf) in freed
        must_find = physical and sync.early_stream > 0 and early.kind == "read" and early.src in sync.freed
    k, found = 0, None
    if getattr(backend, "supports_systematic", False) and must_find:
        want = expected(program)
        spec = f"systematic:delay={delay * 1e3:g}ms:pairs=0"
        keys = backend.run(racy, spec=spec).handoffs
        k = len(keys)
        for t, key in enumerate(keys, start=1):
            if backend.run(racy, spec=spec, plan=(key,)).outcome != want:
                found = t
                break
    return RacyVerdict(sync.reason, bool(plain.reports), physical, k, found, must_find)
