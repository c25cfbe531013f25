"""The options of `racecheck run`, each declared once, here: the command line builds its click
options from this table (cli/run_options.py), RunConfig.from_options copies the `field` rows into
the config (runner/config_build.py), run.json's reader reads a kept setting back as its row says
(run_config.py, by options.read_back), `--resume` refuses the `defining` rows given anew (run.json
keeps what they decided), and a replay command gives a setting again as its row spells it
(replay_args). What a row is: options.py.
"""

from __future__ import annotations

from typing import Any

from racecheck import device
from racecheck.runner.blocks import ORDERS
from racecheck.runner.options import (
    RunOption,
    job_shard_of,
    optional,
    profile_of,
    read_mesh,
    rules_of,
    shard_of,
    strings,
    trials_of,
    whole,
)

ISOLATIONS = ("session", "process")
BACKENDS = ("auto", *device.BACKENDS)
# The settings a replay command repeats, in its order (replay_args).
REPLAYED = ("arms", "trials", "seed", "perturb", "detect", "backend", "world_size", "mesh")

# The help of each option in `racecheck run --help`, by its name.
_HELP = {
    "scenario_names": "Catalogue scenario(s), comma separated, or 'all' (then every arm of each). Default: "
    "the suite of ./pyproject.toml's [tool.racecheck], else main_grad_reuse.",
    "config_file": "Run the suite and arms of this TOML file ([tool.racecheck] or top-level keys).",
    "arms": "Arms to run, comma separated, or 'all' (default: the suite's; every arm with --scenario all).",
    "trials": "Trials per arm [default: 10; on --resume, the run's]; 'auto' = enough to bound a "
    "clean arm and separate the arms (racecheck plan).",
    "out_dir": "Output folder for trials.jsonl and summary.csv (default: a new "
    "racecheck-out/run-TIME in the project's root, the config file's folder; for the "
    "catalogue, in the current folder).",
    "resume_dir": "Continue the run in this folder up to --trials (its settings come from run.json).",
    "allow_changed_suite": "With --resume: continue although the suite's tests or definition changed since the "
    "run started (the tally then mixes trials of both); without it such a resume is "
    "refused.",
    "perturb": "Perturbation profile or rules (default: the suite's; an arm's own profile wins, except over off).",
    "no_perturb": "Run without perturbation, an arm's own profile included: the natural failure rate.",
    "delay_ms": "Resize every sleep of the profile to this many milliseconds (at most an hour).",
    "seed": "Base seed; trial t uses seed+t.",
    "isolation": "session: many trials per process world (fast, trials share state); process: a fresh "
    "world per trial (independent, pays start-up every trial).",
    "order": "Arms inside each trial: in the given order (A B A B) or a seeded permutation.",
    "chunk": "session isolation, arms that need their own process (env, pytest args, git): trials "
    "per session; the arms' sessions alternate chunk by chunk.",
    "shard": "Run slice i of N of the trials (merge the slices with 'racecheck merge'); 'auto': "
    "from the job's environment (RACECHECK_SHARD=i/N, or a Slurm array's task).",
    "timeout": "Seconds without a test starting or finishing before the trial counts as hung and its "
    "process tree is killed; the run goes on (start-up gets at least 120 s; 1 s to a "
    "week).",
    "max_time": "Stop at the next trial boundary after this long (1 s to a week).",
    "stop_rules": "Stop a suite once all rules hold, e.g. 'baseline:failures>=3,fixed:clean>=20'.",
    "backend": "Stream runtime: the CPU emulation, CUDA, or CUDA when a GPU is present.",
    "world_size": "Ranks per session (default: the suite's world_size).",
    "mesh": "The HSDP mesh of the scenarios that take theirs from the run (main_grad_reuse), e.g. "
    "4x2; its size must be the world size (default: 2 x world/2 for an even world above "
    "2, else every rank a shard).",
    "nnodes": "Nodes the world spans; every node runs this same command (see docs/cluster.md).",
    "node_rank": "This node's rank; node 0 writes the run folder and hosts the rendezvous.",
    "rdzv_endpoint": "With --nnodes: node 0's address for torchrun's c10d rendezvous.",
    "rdzv_backend": "torchrun's rendezvous backend (racecheck's node 0 hosts its store).",
    "rdzv_id": "torchrun's rendezvous id (the same on every node); each session adds its own suffix.",
    "rdzv_conf": "torchrun's rendezvous settings, passed through (join_timeout, keep_alive_interval, ...).",
    "detect": "Run the happens-before detector in every trial.",
    "scenarios_dir": "The catalogue folder (default: ./scenarios).",
    "gate": "After the run, apply the gate (see 'racecheck gate') and exit with its code: 0 pass, 1 fail, 4 undecided.",
    "fixed": "With --gate: the arm that must not fail.",
    "baseline": "With --gate: the arm that must still fail.",
    "quiet": "No progress bar.",
}
# The roles of a setting of the run: RunConfig takes its value as it is, it makes the experiment,
# and run.json keeps it (see the module docstring).
SETTING = {"field": True, "defining": True, "kept": True}


def _O(flag: str, name: str, **row: Any) -> RunOption:
    return RunOption(flag, name, _HELP.get(name, ""), **row)


OPTIONS: tuple[RunOption, ...] = (
    _O("--scenario", "scenario_names", defining=True),
    _O("--config", "config_file", kind="file", defining=True),
    # run.json's [] and null: each suite's default arms
    _O("--arms", "arms", read=optional(lambda v: strings(v) or None), defining=True, kept=True),
    _O("--trials", "trials", kind="parsed", metavar="N|auto", parse=trials_of, read=whole(1), kept=True),
    _O("--out", "out_dir", kind="folder", defining=True),
    _O("--resume", "resume_dir", kind="folder"),
    _O("--allow-changed-suite", "allow_changed_suite", kind="flag"),
    _O(
        "--perturb",
        "perturb",
        kind="parsed",
        parse=profile_of,
        read=optional(profile_of),
        defining=True,
        kept=True,
        quoted_hint=False,
    ),
    _O("--no-perturb", "no_perturb", kind="flag", defining=True),
    _O("--delay-ms", "delay_ms", kind="ms", metavar="MS", defining=True),
    _O("--seed", "seed", kind="whole", default=0, **SETTING),
    _O("--isolation", "isolation", kind="choice", default="session", choices=ISOLATIONS, **SETTING),
    _O("--order", "order", kind="choice", default="alternate", choices=ORDERS, **SETTING),
    _O("--chunk", "chunk", kind="whole", default=5, least=1, **SETTING),
    _O(
        "--shard",
        "shard",
        kind="parsed",
        metavar="i/N|auto",
        parse=job_shard_of,
        read=shard_of,
        defining=True,
        kept=True,
    ),
    _O("--timeout", "timeout", kind="seconds", default=300, field=True, kept=True),
    _O("--max-time", "max_time", kind="seconds", field=True),
    _O("--stop-when", "stop_rules", kind="parsed", metavar="RULES", parse=rules_of),
    _O("--backend", "backend", kind="choice", default="auto", choices=BACKENDS, **SETTING),
    _O("--world-size", "world_size", kind="whole", least=1, **SETTING),
    _O(
        "--mesh", "mesh", kind="parsed", metavar="SHARDxREPLICATE", parse=read_mesh, read=optional(read_mesh), **SETTING
    ),
    _O("--nnodes", "nnodes", kind="whole", default=1, least=1),
    _O("--node-rank", "node_rank", kind="whole", default=0, least=0),
    _O("--rdzv-endpoint", "rdzv_endpoint", metavar="HOST:PORT"),
    _O("--rdzv-backend", "rdzv_backend", kind="choice", default="c10d", choices=("c10d",)),
    _O("--rdzv-id", "rdzv_id", default="racecheck"),
    _O("--rdzv-conf", "rdzv_conf", default="", metavar="K=V,..."),
    _O("--detect", "detect", kind="flag", **SETTING),
    _O("--scenarios", "scenarios_dir", defining=True),
    _O("--gate", "gate", kind="flag"),
    _O("--fixed", "fixed", metavar="ARM"),
    _O("--baseline", "baseline", metavar="ARM"),
)
# After the gate's criteria, which `racecheck gate` shares (cli/commands.gate_criteria).
LAST: tuple[RunOption, ...] = (
    _O("--quiet", "quiet", kind="flag", short="-q"),
    _O("PYTEST_ARGS", "pytest_args", kind="arguments", read=strings, **SETTING),
)
ALL = OPTIONS + LAST
BY_NAME = {o.name: o for o in ALL}
DEFINING = tuple(o.name for o in ALL if o.defining)


def replay_args(values: dict[str, Any]) -> list[str]:
    """The arguments of a replay command that give `values` (setting name -> value) again, in
    REPLAYED's order; a setting at its default is left out, but for the trial's own (arms,
    trials, seed and perturb, which a replay always names)."""
    args: list[str] = []
    for name in REPLAYED:
        option, value = BY_NAME[name], values[name]
        if name in ("arms", "trials", "seed", "perturb") or value not in (option.default, None, False):
            args += option.text(value)
    return args
