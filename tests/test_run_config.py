"""RunConfig's run.json: what to_json writes, from_json reads back, field for field."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from racecheck.mesh_config import MeshConfig
from racecheck.runner.blocks import Shard
from racecheck.runner.run_config import RunConfig
from racecheck.runner.stopping import parse_rules
from racecheck.suites.catalogue import Arm, Suite


def _suite(name: str = "s") -> Suite:
    arms = {"a": Arm("a", expect="race"), "b": Arm("b", perturb="off")}
    return Suite(
        name=name,
        path=Path("/x"),
        summary="",
        world_size=4,
        default_perturb="rs_delay",
        default_arms=("a", "b"),
        arms=arms,
    )


def _config(**kw) -> RunConfig:
    base = dict(
        scenarios=(_suite(),),
        arms=("a", "b"),
        trials=7,
        out=Path("/out"),
        perturb=None,
        seed=3,
        isolation="process",
        order="random",
        chunk=2,
        timeout=60.0,
        backend="sim",
        detect=True,
        pytest_args=("-k", "x"),
        all_arms=True,
        world_size=2,
        mesh="2x1",
        shard=Shard(2, 3),
        shard_source="RACECHECK_SHARD",
        revisions={"s/a": "abc"},
        source={"kind": "catalogue", "dir": "/x", "names": "s"},
    )
    return RunConfig(**{**base, **kw})


def test_every_kept_setting_reads_back_as_it_was():
    config = _config()
    data = json.loads(json.dumps(config.to_json()))
    back = RunConfig.from_json(data, scenarios=config.scenarios, out=config.out)
    assert back == config


def test_the_settings_of_one_invocation_are_given_anew_not_read():
    rules = parse_rules("a:failures>=3")
    data = json.loads(json.dumps(_config(max_time=5.0, stop_rules=rules).to_json()))
    assert "max_time" not in data and "stop_rules" not in data and "out" not in data
    back = RunConfig.from_json(data, scenarios=(_suite(),), out=Path("/elsewhere"), trials=20, timeout=9.0)
    assert (back.trials, back.timeout, back.out, back.max_time, back.stop_rules) == (
        20,
        9.0,
        Path("/elsewhere"),
        None,
        (),
    )


def test_run_json_names_each_suites_arms_profiles_and_world():
    data = _config(arms=None, all_arms=False, world_size=None).to_json()
    assert data["scenarios"] == {
        "s": {"arms": ["a", "b"], "perturb": {"a": "sleep@before_reduce_scatter:5ms", "b": "off"}}
    }
    assert data["worlds"] == {"s": 4} and data["shard"] == "2/3" and data["arms"] is None


def test_an_older_run_json_takes_the_defaults_of_what_it_lacks():
    data = {"source": {"kind": "catalogue"}, "arms": None, "trials": 3}
    back = RunConfig.from_json(data, scenarios=(_suite(),), out=Path("/o"))
    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig) if f.default is not dataclasses.MISSING}
    assert (back.seed, back.order, back.shard) == (defaults["seed"], defaults["order"], Shard())
    with pytest.raises(KeyError):
        RunConfig.from_json({"arms": None}, scenarios=(), out=Path("/o"))


def test_the_mesh_travels_as_its_spelling_and_as_two_integers():
    mesh = MeshConfig.parse("4x2")
    env = mesh.env()
    assert env == {"RACECHECK_MESH": "4x2", "RACECHECK_MESH_SHARD": "4", "RACECHECK_MESH_REPLICATE": "2"}
    assert MeshConfig.from_env(8, environ=env) == mesh
    assert MeshConfig.from_env(8, environ={}) == MeshConfig.for_world(8)
    with pytest.raises(ValueError, match="RACECHECK_MESH: '4by2' is not of the form SHARDxREPLICATE"):
        MeshConfig.from_env(8, environ={"RACECHECK_MESH": "4by2"})
    with pytest.raises(ValueError, match="does not cover a world of 4"):
        MeshConfig.from_env(4, environ=env)


@pytest.mark.parametrize("example", ["fsdp2", "megatron_fsdp"])
def test_the_examples_take_the_runs_mesh_from_its_two_integers(example, monkeypatch):
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "examples" / example / "tests" / "conftest.py"
    spec = importlib.util.spec_from_file_location(f"example_conftest_{example}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, value in MeshConfig.parse("4x2").env().items():
        monkeypatch.setenv(name, value)
    assert module._mesh_shape(8) == (2, 4)  # (replicate, shard)
    with pytest.raises(pytest.UsageError, match="does not cover a world of 4"):
        module._mesh_shape(4)
