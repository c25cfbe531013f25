"""What a run is (RunConfig) and its run.json form (which settings it keeps, and how they read
back, run_json.py). A run's config is built in one place, RunConfig.from_options
(config_build.py); the command lines that replay and resume a run are command_lines.py's.

Settings travel parsed: the run's profile is a Profile, the mesh a MeshConfig. Each (suite, arm)'s
profile is resolved once per config by one precedence chain (profile_for: the arm's own, else
--perturb, else the suite's default); its canonical spec (spec_for) is what the session schedule,
the ranks and the records carry. The config checks itself against its suites and the machine
(fitted_to, validate: config_checks.py), raising InputError.

`to_json()` writes every field but those a later invocation gives anew or finds itself
(_NOT_KEPT), plus two derived entries for the reader: each suite's world on this machine and each
suite's arms with their canonical profile specs (what `merge` compares). `from_json()` is its
inverse for `--resume`: the suites come back from `source`, the rest from the file.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from racecheck.exitcodes import InputError
from racecheck.perturb.profiles import Profile
from racecheck.protocol.mesh import MeshConfig
from racecheck.runner import config_checks, run_json
from racecheck.runner.blocks import Shard
from racecheck.runner.run_location import absolute
from racecheck.runner.stopping import StopRule
from racecheck.suites import source as suite_source
from racecheck.suites.catalogue import Suite


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """What to run. `source` says where the suites came from, so that --resume can reload them."""

    scenarios: tuple[Suite, ...]
    arms: tuple[str, ...] | None  # None: each suite's default arms
    trials: int
    out: Path
    # --perturb; None: each suite's default (an arm's own profile wins); off: none anywhere, an arm's own included
    perturb: Profile | None = None
    seed: int = 0
    isolation: str = "session"
    order: str = "alternate"
    chunk: int = 5  # trials per session for arms that need separate processes (session mode)
    timeout: float = 300.0  # seconds without a test starting or finishing before a session is killed
    backend: str = "auto"
    detect: bool = False
    pytest_args: tuple[str, ...] = ()  # from the command line, after `--`
    all_arms: bool = False  # every arm of each scenario (for --scenario all)
    world_size: int | None = None  # overrides the suites' world size
    mesh: MeshConfig | None = None  # --mesh, for racecheck.scenario_kit.harness.hsdp_mesh_config
    shard: Shard = Shard()
    shard_source: str = ""  # where --shard auto found the shard (shard_env.py); "" when given
    max_time: float | None = None  # seconds; then the run stops at the next trial boundary
    stop_rules: tuple[StopRule, ...] = ()
    revisions: dict = dataclasses.field(default_factory=dict)  # "suite/arm" -> resolved commit
    source: dict = dataclasses.field(default_factory=dict)
    fingerprints: dict = dataclasses.field(default_factory=dict)  # suite -> suites/fingerprint.py's, for --resume
    worlds: dict = dataclasses.field(default_factory=dict)  # suite -> ranks this machine gives it
    skipped: dict = dataclasses.field(default_factory=dict)  # suite -> why it cannot run here

    def __post_init__(self) -> None:
        # Absolute from here on, whatever folder a session runs in ([Note: run folder paths]).
        object.__setattr__(self, "out", absolute(self.out))

    def arms_for(self, suite: Suite) -> tuple[str, ...]:
        if self.arms:
            return self.arms
        return tuple(suite.arms) if self.all_arms else suite.default_arms

    @functools.cached_property
    def _resolved(self) -> dict[tuple[str, str | None], tuple[Profile, str]]:
        """(suite, arm) -> its profile and canonical spec, filled as profile_for resolves them."""
        return {}

    def _resolve(self, suite: Suite, arm: str | None) -> tuple[Profile, str]:
        key = (suite.name, arm)
        if key not in self._resolved:
            own = suite.arms[arm].profile if arm in suite.arms else None
            if self.perturb is not None and self.perturb.is_off:
                profile = self.perturb  # --no-perturb (or `off`): the natural rate, an arm's own profile included
            elif own is not None:
                profile = own
            elif self.perturb is not None:
                profile = self.perturb
            else:
                profile = suite.default_profile
            self._resolved[key] = (profile, profile.to_spec())
        return self._resolved[key]

    def profile_for(self, suite: Suite, arm: str | None = None) -> Profile:
        """The profile an arm of a suite runs: none under --no-perturb (or --perturb off), else the
        arm's own, else the run's (--perturb), else the suite's default; without an arm, the run's
        profile for the suite. Resolved once."""
        return self._resolve(suite, arm)[0]

    def spec_for(self, suite: Suite, arm: str) -> str:
        """The canonical spec of profile_for: the one spec the schedule, the ranks and the records
        carry (profile names resolved, e.g. rs_delay -> sleep@before_reduce_scatter:5ms)."""
        return self._resolve(suite, arm)[1]

    def with_delay(self, seconds: float) -> RunConfig:
        """--delay-ms: the run's profile (--perturb, else the suites' one default) with every sleep
        resized; an arm's own profile is kept. A run profile that is off has no sleep to resize and
        stays as it was: made `off` here it would turn every arm's own profile off too (--no-perturb).
        InputError when the suites' defaults differ and no --perturb names one."""
        runs = {self.profile_for(s) for s in self.scenarios}
        if len(runs) > 1:
            raise InputError("--delay-ms needs --perturb when the scenarios' profiles differ")
        run = runs.pop()
        return self if run.is_off else dataclasses.replace(self, perturb=run.with_delay(seconds))

    def control(self, suites: set[str], folder: str) -> RunConfig:
        """The control of `suites` (blame.py): one trial of each of their arms, with no
        perturbation (an arm's own profile included) and no detector, in OUT/`folder`."""
        return dataclasses.replace(
            self,
            scenarios=tuple(s.unperturbed() for s in self.scenarios if s.name in suites),
            trials=1,
            out=self.out / folder,
            perturb=None,
            detect=False,
            shard=Shard(),
            max_time=None,
            stop_rules=(),
        )

    def world_for(self, suite: Suite) -> int:
        return self.world_size or self.worlds.get(suite.name) or suite.world_size

    def mesh_for(self, suite: Suite) -> MeshConfig:
        """The HSDP mesh a catalogue scenario's harness builds in this run (--mesh, else the
        default layout of its world)."""
        return self.mesh or MeshConfig.for_world(self.world_for(suite))

    def fitted_to(self, gpus: int | None) -> RunConfig:
        """This config with each suite's world fitted to the `gpus` of the machine (None: the CPU
        emulation); InputError for a suite that cannot fit (config_checks.fit_worlds)."""
        return config_checks.fit_worlds(self, gpus)

    def validate(self, *, gpus: int | None, nnodes: int = 1) -> None:
        """InputError (naming its option) unless the settings fit the suites, each other, the
        machine's `gpus` and `nnodes` nodes (config_checks.check_run)."""
        config_checks.check_run(self, gpus=gpus, nnodes=nnodes)

    def to_json(self) -> dict:
        """run.json's settings (see the module docstring); JSON-ready."""
        data = {
            f.name: _to_json(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if f.name in run_json.KEPT or f.name in run_json.WRITTEN_FOR_READERS
        }
        data["source"] = suite_source.kept(self.source, self.out)  # also relative to the run folder
        data["worlds"] = {s.name: self.world_for(s) for s in self.scenarios}
        data["scenarios"] = {
            s.name: {"arms": list(self.arms_for(s)), "perturb": {a: self.spec_for(s, a) for a in self.arms_for(s)}}
            for s in self.scenarios
        }
        return data

    @classmethod
    def from_options(
        cls,
        values: Mapping[str, Any],
        *,
        given: Collection[str] = (),
        nnodes: int = 1,
        warn: Callable[[str], None] = print,
    ) -> RunConfig:
        """The run that `racecheck run`'s option `values` describe (keyed by options.py's names; the
        names `given` on the command line): a fresh run's, or with `resume_dir` the run of that
        folder's run.json. Fitted to this machine and checked for `nnodes` nodes, its git revisions
        resolved, its suites fingerprinted and a fresh run's folder made (config_build.py); `warn`
        says what a resume it lets mix trials mixes. InputError, naming its option, for a mistake."""
        from racecheck.runner import config_build

        if values["resume_dir"] is not None:
            return config_build.resumed(cls, values, given=given, nnodes=nnodes, warn=warn)
        return config_build.fresh(cls, values, nnodes=nnodes)

    @classmethod
    def from_json(cls, data: dict, *, scenarios: tuple[Suite, ...], out: Path, **given) -> RunConfig:
        """The RunConfig run.json describes, for the suites reloaded from its `source`; `given`
        are the settings the resuming command line gives anew (trials, timeout, max_time, ...).
        A setting missing from an older run.json takes its default; ValueError for one that does
        not read back (run_json.settings_from_json), KeyError for `arms` or `trials` missing."""
        values = {k: v for k, v in run_json.settings_from_json(data).items() if k not in given}
        for required in ("arms", "trials"):
            if required not in values and required not in given:
                raise KeyError(required)
        return cls(scenarios=scenarios, out=out, **values, **given)


def _to_json(value):
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, Profile):
        return value.to_spec()
    if isinstance(value, (Shard, Path, MeshConfig)):
        return str(value)
    if isinstance(value, dict):
        return dict(value)
    return value


# run.json keeps every field but those of one invocation and of one machine (run_json.KEPT).
assert set(run_json.KEPT) == {f.name for f in dataclasses.fields(RunConfig)} - {
    "scenarios",
    "out",
    "max_time",
    "stop_rules",
    *run_json.WRITTEN_FOR_READERS,
}, "run_json.KEPT names RunConfig's kept fields"
