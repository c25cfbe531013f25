"""Fixtures that racecheck's own tests share (their helpers are in run_kit.py).

- `fast_sessions`: the test sessions a run starts load no third-party pytest plugins (the
  runner loads its own with -p), as a module asks with
  `pytestmark = pytest.mark.usefixtures("fast_sessions")`;
- `project`: a small project whose arms `often` (race) and `never` (safe) fail SEEDED_TEST at
  known rates;
- `not_an_xdist_worker` (every test): under `pytest -n`, the pytest processes a test starts
  itself (pytester, a session of its own) do not inherit the worker's identity.
"""

from __future__ import annotations

import pytest
from run_kit import SEEDED_TEST, write_suite


@pytest.fixture
def fast_sessions(monkeypatch):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


@pytest.fixture
def project(tmp_path):
    return write_suite(
        tmp_path / "p",
        arms={"often": {"expect": "race"}, "never": {"expect": "safe"}},
        tests={"test_seeded.py": SEEDED_TEST},
    )


@pytest.fixture(autouse=True)
def not_an_xdist_worker(monkeypatch):
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)
