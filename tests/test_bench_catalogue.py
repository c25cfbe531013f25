"""The benchmark's bench helpers without a GPU: bench/catalogue_replace.py puts a later run's
scenarios in place of theirs, and bench/gpu_check.py groups the parts that run at the same time."""

import importlib.util
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_replace_swaps_only_the_newer_runs_scenarios(tmp_path):
    replace = _load("catalogue_replace").replace
    cols = ["scenario", "test", "arm", "trials", "failures"]
    base = pd.DataFrame(
        [["a", "*", "x", "10", "1"], ["b", "*", "x", "10", "2"], ["c", "*", "x", "10", "3"]], columns=cols
    )
    newer = pd.DataFrame([["b", "*", "x", "10", "0"], ["b", "t[1]", "x", "10", "0"]], columns=cols)
    out = replace(base, newer)
    assert out.values.tolist() == [
        ["a", "*", "x", "10", "1"],
        ["b", "*", "x", "10", "0"],
        ["b", "t[1]", "x", "10", "0"],
        ["c", "*", "x", "10", "3"],
    ]
    with pytest.raises(ValueError, match="lacks columns failures"):
        replace(base, newer.drop(columns=["failures"]))


def test_the_parts_named_together_form_one_group_where_the_first_of_them_comes(monkeypatch):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        grouped = _load("gpu_check").grouped
    finally:
        sys.path.remove(str(ROOT / "bench"))
    todo = [
        ("env", ("versions", [], 1)),
        ("catalogue", ("perturbed", [], 1)),
        ("catalogue", ("natural", [], 1)),
        ("catalogue", ("random", [], 1)),
        ("catalogue", ("detect", [], 1)),
    ]
    groups = grouped(todo, {"perturbed", "random", "detect"})
    assert [[item[1][0] for item in g] for g in groups] == [
        ["versions"],
        ["perturbed", "random", "detect"],
        ["natural"],
    ]
    assert [[item[1][0] for item in g] for g in grouped(todo, set())] == [[i[1][0]] for i in todo]
