"""Fixtures that racecheck's own tests share (their helpers are in run_kit.py).

- `rt`: a stream runtime for one test, closed after it (device_kit.new_runtime): the CPU
  emulation, or the backend that the module's `runtime` mark names
  (`pytestmark = pytest.mark.runtime("cuda")`) or an indirect parametrization gives;
- `fast_sessions`: the test sessions a run starts load no third-party pytest plugins (the
  runner loads its own with -p), as a module asks with
  `pytestmark = pytest.mark.usefixtures("fast_sessions")`;
- `project`: a small project whose arms `often` (race) and `never` (safe) fail SEEDED_TEST at
  known rates;
- `not_an_xdist_worker` (every test): under `pytest -n`, the pytest processes a test starts
  itself (pytester, a session of its own) do not inherit the worker's identity.

torch is imported here, ahead of every test: pytester's in-process runs give back the modules
they found (sys.modules as it was), so a torch first imported inside one would be imported again
by the next test while its C extension stays loaded (`SystemError: ... bad call flags`).

The whole suite (`pytest` with no paths and no -n) runs in one process per core and one more where
pytest-xdist is installed (most tests also wait on the processes they start: sessions, torchrun
agents, timeouts; the extra process keeps the cores busy meanwhile), a module to a process (--dist
loadfile: a module's shared worlds start once), the modules that start the most process worlds first
(LONGEST_FIRST), so that no process is left with a long one at the end. `-n 0` runs it in one
process; paths given run in one process unless -n is given too. This is the conftest's default, not
an addopts of pyproject's, so that the sessions racecheck starts in this checkout (the catalogue's)
never inherit it, and a machine without pytest-xdist (the GPU machine) runs the suite as before.
"""

from __future__ import annotations

import os

import pytest
import torch  # noqa: F401 - before any pytester run, see below
from run_kit import SEEDED_TEST, write_suite

from racecheck.protocol.names import SESSION_MARK_VAR

WORKERS = (os.cpu_count() or 1) + 1
# Modules by the time they take, longest first (tests/ only; any module not named runs after these),
# as `pytest --durations=0` summed them per module on the 2-core machine (catalogue 76 s, nodes 45,
# soundness 44, runner 29, engines 28, ...). xdist hands the processes these modules in turn: the
# catalogue, test_nodes.py and the soundness check start at once, one to a process, and the rest
# follow as processes free up, so that no process is left with a long module at the end.
LONGEST_FIRST = (
    "test_catalogue_promise.py",
    "test_nodes.py",
    "test_soundness.py",
    "test_runner.py",
    "test_detect_engines.py",
    "test_cli.py",
    "test_readme_promises.py",
    "test_fsdp_parity.py",
    "test_project_patch.py",
    "test_patch_modern.py",
    "test_cli_worlds.py",
    "test_early_ends.py",
    "test_recipes.py",
    "test_runner_resume.py",
    "test_run_folder.py",
    "test_detect_tracker_paths.py",
    "test_merge_safety.py",
    "test_detect_native.py",
    "test_kernel_launches.py",
    "test_detect.py",
    "test_own_suite.py",
)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    # Not in a worker, nor where there is no xdist, nor in a session that racecheck started (on
    # this suite: its runner decides how that session's processes are laid out).
    if hasattr(config, "workerinput") or not config.pluginmanager.hasplugin("xdist") or SESSION_MARK_VAR in os.environ:
        return
    option = config.option
    whole_suite = config.args_source is not pytest.Config.ArgsSource.ARGS
    if option.numprocesses is None and whole_suite and not (option.usepdb or option.collectonly):
        option.numprocesses = WORKERS
    if option.numprocesses and option.dist == "no":  # -n without --dist: a module to a process
        option.dist = "loadfile"
        option.loadscopereorder = False  # in LONGEST_FIRST's order, not by the modules' sizes


def pytest_collection_modifyitems(config, items):
    if not hasattr(config, "workerinput"):  # only a worker's collection is what is distributed
        return
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture
def rt(request):
    from device_kit import close_runtime, new_runtime  # torch, only where a test needs a runtime

    marker = request.node.get_closest_marker("runtime")
    runtime = new_runtime(getattr(request, "param", None) or (marker.args[0] if marker else "sim"))
    yield runtime
    close_runtime(runtime)


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
