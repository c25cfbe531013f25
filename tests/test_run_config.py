"""RunConfig's run.json: what to_json writes, from_json reads back, field for field."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from racecheck.exitcodes import InputError
from racecheck.perturb.profiles import parse_profile
from racecheck.protocol.mesh import MeshConfig
from racecheck.runner.blocks import Shard
from racecheck.runner.options import read_mesh
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
        mesh=MeshConfig(2, 1),
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


def test_the_mesh_travels_as_its_spelling_and_as_two_integers_which_the_ranks_rebuild_it_from():
    mesh = MeshConfig(4, 2)
    env = mesh.env()
    assert env == {"RACECHECK_MESH": "4x2", "RACECHECK_MESH_SHARD": "4", "RACECHECK_MESH_REPLICATE": "2"}
    assert MeshConfig.from_env(8, environ=env) == mesh
    assert MeshConfig.from_env(8, environ={"RACECHECK_MESH_SHARD": "4", "RACECHECK_MESH_REPLICATE": "2"}) == mesh
    assert MeshConfig.from_env(8, environ={}) == MeshConfig.for_world(8)
    with pytest.raises(ValueError, match="RACECHECK_MESH_REPLICATE='two' is not a positive integer"):
        MeshConfig.from_env(8, environ={"RACECHECK_MESH_SHARD": "4", "RACECHECK_MESH_REPLICATE": "two"})
    with pytest.raises(ValueError, match="RACECHECK_MESH is set without RACECHECK_MESH_SHARD"):
        MeshConfig.from_env(8, environ={"RACECHECK_MESH": "4x2"})
    with pytest.raises(ValueError, match="does not cover a world of 4"):
        MeshConfig.from_env(4, environ=env)


def test_the_mesh_is_read_from_its_spelling_once_and_kept_as_a_value():
    config = _config(mesh=read_mesh("2x1"))
    assert config.mesh == MeshConfig(2, 1) and config.to_json()["mesh"] == "2x1"
    assert config.mesh_for(config.scenarios[0]) == MeshConfig(2, 1)
    assert _config(mesh=None, world_size=None).mesh_for(config.scenarios[0]) == MeshConfig(2, 2)
    with pytest.raises(ValueError, match="is not of the form SHARDxREPLICATE"):
        read_mesh("2by1")


@pytest.mark.parametrize("example", ["fsdp2", "megatron_fsdp"])
def test_the_examples_take_the_runs_mesh_from_its_two_integers(example, monkeypatch):
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "examples" / example / "tests" / "conftest.py"
    spec = importlib.util.spec_from_file_location(f"example_conftest_{example}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, value in MeshConfig(4, 2).env().items():
        monkeypatch.setenv(name, value)
    assert module._mesh_shape(8) == (2, 4)  # (replicate, shard)
    with pytest.raises(pytest.UsageError, match="does not cover a world of 4"):
        module._mesh_shape(4)


def test_a_profile_given_to_the_run_travels_parsed_and_reads_back_equal():
    config = _config(perturb=parse_profile("rs_delay"))
    data = json.loads(json.dumps(config.to_json()))
    assert data["perturb"] == "sleep@before_reduce_scatter:5ms"
    back = RunConfig.from_json(data, scenarios=config.scenarios, out=config.out)
    assert back.perturb == config.perturb and back == config


def test_each_arms_profile_is_resolved_once_by_one_chain_arm_then_run_then_suite(monkeypatch):
    from racecheck.perturb import profiles

    suite = _suite()
    _ = suite.default_profile, suite.arms["b"].profile  # parsed at load, as load_scenario does
    monkeypatch.setattr(profiles, "parse_profile", lambda spec: pytest.fail(f"{spec!r} parsed again"))
    by_default = _config(perturb=None)
    assert by_default.profile_for(suite, "a") is suite.default_profile  # the suite's default
    assert by_default.spec_for(suite, "b") == "off"  # the arm's own profile
    given = _config(perturb=parse_profile("poison"))
    assert given.spec_for(suite, "a") == "poison@free"  # --perturb over the suite's default
    assert given.spec_for(suite, "b") == "off"  # the arm's own over --perturb
    assert given.profile_for(suite, "a") is given.profile_for(suite, "a")


def test_no_perturbation_given_to_the_run_overrides_an_arms_own_profile():
    """--no-perturb (the run's profile `off`) is the natural rate: no arm keeps a profile."""
    suite = dataclasses.replace(_suite(), arms={"a": Arm("a", perturb="poison"), "b": Arm("b")})
    assert _config(perturb=None).spec_for(suite, "a") == "poison@free"
    assert _config(perturb=parse_profile("rs_delay")).spec_for(suite, "a") == "poison@free"
    natural = _config(perturb=parse_profile("off"))
    assert natural.spec_for(suite, "a") == natural.spec_for(suite, "b") == "off"


def test_delay_ms_resizes_the_runs_profile_and_keeps_an_arms_own():
    suite = _suite()
    config = _config(perturb=None).with_delay(0.001)
    assert config.spec_for(suite, "a") == "sleep@before_reduce_scatter:1ms"
    assert config.spec_for(suite, "b") == "off"
    other = dataclasses.replace(_suite("t"), default_perturb="poison")
    with pytest.raises(InputError, match="--delay-ms needs --perturb when the scenarios' profiles differ"):
        _config(perturb=None, scenarios=(suite, other)).with_delay(0.001)
    both = _config(perturb=parse_profile("rs_delay"), scenarios=(suite, other)).with_delay(0.002)
    assert both.spec_for(other, "a") == "sleep@before_reduce_scatter:2ms"
    # a suite whose default is off (a project's) has nothing to resize, and its arms keep their own
    quiet = dataclasses.replace(_suite(), default_perturb="off", arms={"a": Arm("a", perturb="poison"), "b": Arm("b")})
    resized = _config(perturb=None, scenarios=(quiet,)).with_delay(0.005)
    assert (resized.spec_for(quiet, "a"), resized.spec_for(quiet, "b")) == ("poison@free", "off")


@pytest.mark.parametrize(
    ("settings", "option", "message"),
    [
        ({"world_size": 1, "mesh": None}, None, None),
        ({"mesh": MeshConfig(2, 2)}, "--mesh", "mesh 2x2 has 4 ranks, s runs on 2"),
        ({"stop_rules": parse_rules("gone:failures>=1")}, "--stop-when", "names arm 'gone'"),
        ({"perturb": parse_profile("enter_delay")}, "--perturb", "act in patch mode, on a project's own suite"),
        ({"backend": "cuda"}, "--backend", "cuda: no CUDA device is available on this machine"),
    ],
)
def test_the_config_checks_its_settings_and_names_the_option_at_fault(settings, option, message):
    config = _config(**settings)
    if message is None:
        config.validate(gpus=None)
        return
    with pytest.raises(InputError, match=message) as raised:
        config.validate(gpus=None)
    assert raised.value.option == option


def test_the_config_checks_the_world_against_its_nodes_its_gpus_and_its_suites():
    narrow = dataclasses.replace(_suite(), min_world_size=4)
    with pytest.raises(InputError, match="s needs at least 4 ranks") as raised:
        _config(scenarios=(narrow,), mesh=None).validate(gpus=None)
    assert raised.value.option == "--world-size"
    with pytest.raises(InputError, match="s runs 2 ranks, which 3 nodes cannot share evenly") as raised:
        _config().validate(gpus=None, nnodes=3)
    assert raised.value.option == "--nnodes"
    with pytest.raises(InputError, match="s would run 2 ranks on this machine, which has 1 GPU") as raised:
        _config().validate(gpus=1)
    assert raised.value.option == "--world-size"
    fitted = _config(world_size=None, mesh=None).fitted_to(2)
    assert fitted.worlds == {"s": 2} and fitted.world_for(fitted.scenarios[0]) == 2


def test_a_world_past_what_the_machine_runs_is_refused_before_any_rank_starts():
    # On the CPU, every rank is a process that loads torch: at most 64 a node.
    with pytest.raises(
        InputError, match="s would run 100000 ranks on this machine, and a run on the CPU takes at most 64"
    ) as raised:
        _config(world_size=100000, mesh=None).validate(gpus=None)
    assert raised.value.option == "--world-size"
    huge = dataclasses.replace(_suite(), world_size=100000)  # a suite's own world_size, no --world-size
    with pytest.raises(InputError, match="give at most --world-size 64"):
        _config(scenarios=(huge,), world_size=None, mesh=None).validate(gpus=None)
    with pytest.raises(InputError, match="s would run 65 ranks on each node"):
        _config(world_size=130, mesh=None).validate(gpus=None, nnodes=2)
    _config(world_size=64, mesh=None).validate(gpus=None)
    _config(world_size=128, mesh=None).validate(gpus=None, nnodes=2)
    # On CUDA: one rank per GPU.
    with pytest.raises(InputError, match="s would run 100000 ranks on this machine, which has 8 GPUs") as raised:
        _config(world_size=100000, mesh=None).validate(gpus=8)
    assert raised.value.option == "--world-size"
