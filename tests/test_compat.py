"""Old import paths (racecheck.compat.MOVED) still work, warn once with the new path, and give the
one module object; racecheck itself never imports through them."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from racecheck import compat

ROOT = Path(__file__).resolve().parents[1]


def _fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


@pytest.fixture(autouse=True)
def _old_package():
    """racecheck.trials itself warns on its first import; take that warning here, once."""
    if "racecheck.trials" not in sys.modules:
        with pytest.warns(DeprecationWarning, match="racecheck.trials moved to racecheck.suites"):
            importlib.import_module("racecheck.trials")


@pytest.mark.parametrize("old", sorted(compat.MOVED))
def test_an_old_path_is_the_new_module_and_says_where_it_went(old):
    new = compat.MOVED[old]
    assert not (ROOT / (old.replace(".", "/") + ".py")).exists(), "no file is left at an old path"
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        sys.modules.pop(old, None)
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert module.__name__ == new


def test_from_imports_of_old_names_reach_the_same_objects():
    with pytest.warns(DeprecationWarning):
        for name in [n for n in compat.MOVED if n.startswith("racecheck.trials.")]:
            sys.modules.pop(name, None)
        from racecheck.trials.schedule import Shard

        from racecheck.trials import tally  # noqa: F401 (the import is the test)
    from racecheck.results import tally as new_tally
    from racecheck.runner.blocks import Shard as NewShard

    assert tally is new_tally and Shard is NewShard


def test_the_old_name_of_a_suite_warns_and_is_suite():
    from racecheck.suites import catalogue

    with pytest.warns(DeprecationWarning, match="Scenario moved to racecheck.suites.catalogue.Suite"):
        assert catalogue.Scenario is catalogue.Suite
    with pytest.raises(AttributeError):
        catalogue.NoSuchThing  # noqa: B018


def test_no_module_of_racecheck_imports_an_old_path():
    """Every module imports with DeprecationWarning as an error: none goes through the shims."""
    names = []
    for path in sorted((ROOT / "racecheck").rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        if not name.startswith("racecheck.trials") and not name.endswith("__main__"):
            names.append(name)
    done = _fresh(f"import importlib\nfor n in {names!r}:\n    importlib.import_module(n)\nprint(len({names!r}))")
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout) == len(names) > 40


def test_the_warning_points_at_the_importing_line(tmp_path):
    script = tmp_path / "user.py"
    script.write_text("import racecheck\nfrom racecheck.harness import check_values\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"{script}:2: DeprecationWarning: racecheck.harness moved to racecheck.scenario_kit.harness" in done.stderr


def test_the_repository_imports_no_old_path():
    """The tests, scenarios, examples and bench scripts import the new paths (only this file and
    compat.py name the old ones)."""
    import re

    names = [*compat.MOVED, "racecheck.trials"]
    modules = "|".join(re.escape(m) for m in sorted(names, key=len, reverse=True))
    parents = {m.rpartition(".")[0]: [] for m in compat.MOVED}
    for m in compat.MOVED:
        parents[m.rpartition(".")[0]].append(m.rpartition(".")[2])
    from_parent = "|".join(
        rf"from\s+{re.escape(p)}\s+import\s+\(?\s*(?:\w+\s*,\s*)*(?:{'|'.join(c)})\b" for p, c in parents.items()
    )
    old = re.compile(rf"\b(?:from|import)\s+(?:{modules})(?![\w.])|{from_parent}")
    found = []
    for folder in ("racecheck", "tests", "scenarios", "examples", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name in ("compat.py", "test_compat.py"):
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if old.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "\n".join(found)
