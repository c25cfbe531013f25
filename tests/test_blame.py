"""Whose failure it is: the failure's informative line (a header's follow-up, an exception's cause),
a failure raised inside racecheck's own instruments, and a suite that fails alike in every arm
only under racecheck's perturbation, which a control trial without it tells from a suite that
fails by itself."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from run_kit import racecheck

from racecheck.rank.failure_text import message_line, racecheck_frame


class BackendFailed(RuntimeError):
    pass


def _compile():
    try:
        {}["default"]  # noqa: B018 - the lookup a replaced op fails
    except KeyError as exc:
        raise BackendFailed("backend='inductor' raised:\nKeyError: 'default'\n\nSet TORCH_LOGS=...") from exc


def test_the_failure_line_follows_a_header_and_names_the_cause():
    with pytest.raises(BackendFailed) as excinfo:
        _compile()
    assert message_line(excinfo) == "backend='inductor' raised: KeyError: 'default'"
    with pytest.raises(RuntimeError) as wrapped:
        try:
            raise OSError("disk full")
        except OSError as exc:
            raise RuntimeError("cannot save the checkpoint") from exc
    assert message_line(wrapped) == "cannot save the checkpoint (caused by OSError: disk full)"
    with pytest.raises(AssertionError) as not_close:
        torch.testing.assert_close(torch.zeros(4), torch.ones(4))
    assert message_line(not_close) == "Tensor-likes are not close! Mismatched elements: 4 / 4 (100.0%)"


def test_a_failure_raised_inside_racecheck_is_named_and_one_passing_through_it_is_not():
    from racecheck.perturb.patch import PatchMode
    from racecheck.perturb.profiles import parse_profile

    with pytest.raises(ValueError) as inside:
        parse_profile("sleep@nowhere")
    assert racecheck_frame(inside).startswith("racecheck/perturb/profiles.py:")

    def users_call():
        raise ValueError("the user's own error")

    patch = PatchMode(parse_profile("off"), actions=object())
    wrapped = patch._outermost(users_call, users_call)  # a call wrapped by patch mode
    with pytest.raises(ValueError) as through:
        wrapped()
    assert racecheck_frame(through) == ""


SUITE = """
def test_step(racecheck_perturb):
    assert {condition}, f"the step broke under {{racecheck_perturb}}"
"""


@pytest.mark.parametrize(
    ("condition", "verdict"),
    [
        ("racecheck_perturb in (None, 'off')", "racecheck broke the suite"),
        ("False", "it fails without racecheck's perturbation and detector too"),
    ],
    ids=["only-under-racecheck", "by-itself"],
)
def test_a_suite_failing_alike_under_racecheck_gets_a_control_that_says_whose_failure_it_is(
    tmp_path, condition, verdict
):
    catalogue = tmp_path / "catalogue"
    (catalogue / "step").mkdir(parents=True)
    (catalogue / "step" / "scenario.toml").write_text(
        'world_size = 1\ndefault_perturb = "rs_delay"\ndefault_arms = ["a", "b"]\n[arms.a]\n[arms.b]\n'
    )
    (catalogue / "step" / "test_step.py").write_text(textwrap.dedent(SUITE.format(condition=condition)))
    out = tmp_path / "out"
    args = ("--scenarios", catalogue, "--scenario", "step", "--trials", 2, "--out", out)
    res = racecheck("run", *args, cwd=tmp_path)
    assert res.code == 0, res.err
    assert "one control trial of each arm" in res.out and verdict in res.out, res.out
    control = [json.loads(line) for line in (out / "control" / "trials.jsonl").read_text().splitlines()]
    assert {(r["arm"], r["perturb"]) for r in control} == {("a", "off"), ("b", "off")}
    report = racecheck("report", out, cwd=tmp_path)
    assert verdict in report.out  # the report reads the same control
    assert verdict in json.loads(racecheck("report", out, "--format", "json", cwd=tmp_path).out)["verdicts"][0]
