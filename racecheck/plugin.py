"""The racecheck pytest plugin (entry point `pytest11`): trial/arm bookkeeping and outcome capture.

In one pytest session it cycles the arms given with --racecheck-arms over pytest-repeat's steps
(step k runs arm k mod len(arms) in trial start + k div len(arms)), so arms alternate trial by trial
(A B A B) inside one process world. Every test's outcome is written, as soon as it is known, as
one JSON line to the per-rank log given with --racecheck-log; the trial runner merges the ranks.
torch is imported lazily so that loading the plugin costs nothing for suites that do not use it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from pathlib import Path

import pytest

from racecheck.trials.record import Outcome, worst

REPEAT_PARAM = "__pytest_repeat_step_number"  # pytest-repeat's parametrized fixture


@dataclasses.dataclass
class ItemTrial:
    """Per-item data, kept in item.stash: which trial and arm this item runs, and what happened."""

    trial: int
    arm: str
    test: str  # node id without pytest-repeat's suffix
    params: str
    outcomes: list = dataclasses.field(default_factory=list)
    signature: str = ""
    message: str = ""
    duration: float = 0.0
    reports: list = dataclasses.field(default_factory=list)  # detector reports attached by fixtures


ITEM_TRIAL = pytest.StashKey[ItemTrial]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("racecheck", "racecheck: arms, trials, perturbation and outcome logging")
    group.addoption("--racecheck-arms", default="", metavar="A,B",
                    help="arms to cycle over pytest-repeat steps in this session (trial by trial)")
    group.addoption("--racecheck-trial-start", type=int, default=0, metavar="N",
                    help="index of this session's first trial")
    group.addoption("--racecheck-seed", type=int, default=0, metavar="S",
                    help="base seed; trial t runs with seed S + t")
    group.addoption("--racecheck-perturb", default=None, metavar="PROFILE",
                    help="perturbation profile (default: the scenario's own; 'off' disables)")
    group.addoption("--racecheck-detect", action="store_true", default=False,
                    help="run the happens-before detector and report races it finds")
    group.addoption("--racecheck-log", default=None, metavar="PATH",
                    help="per-rank JSONL outcome log; '{rank}' in PATH is replaced by the rank")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "racecheck_world(n): the test needs a process world of n ranks")
    if config.getoption("--racecheck-trial-start") < 0:
        raise pytest.UsageError("--racecheck-trial-start must be >= 0")
    perturb = config.getoption("--racecheck-perturb")
    if perturb is not None:
        from racecheck.perturb.profiles import parse_profile

        try:
            parse_profile(perturb)
        except ValueError as exc:
            raise pytest.UsageError(f"--racecheck-perturb: {exc}") from None
    log = config.getoption("--racecheck-log")
    config.stash[_LOG_KEY] = _RankLog(log) if log else None


_LOG_KEY = pytest.StashKey["_RankLog | None"]()


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    arms = [a for a in config.getoption("--racecheck-arms").split(",") if a] or [""]
    start = config.getoption("--racecheck-trial-start")
    count = config.getoption("count", 1) or 1
    for item in items:
        callspec = getattr(item, "callspec", None)
        step = callspec.params.get(REPEAT_PARAM, 0) if callspec is not None else 0
        test = strip_repeat_suffix(item.nodeid, count)
        params = test[test.index("[") + 1:-1] if test.endswith("]") and "[" in test else ""
        item.stash[ITEM_TRIAL] = ItemTrial(trial=start + step // len(arms), arm=arms[step % len(arms)],
                                           test=test, params=params)
    # Trial-major order, arms alternating within each trial; stable inside (pytest's own order).
    items.sort(key=lambda it: (it.stash[ITEM_TRIAL].trial, arms.index(it.stash[ITEM_TRIAL].arm)))


def strip_repeat_suffix(nodeid: str, count: int) -> str:
    """`test_x[1-True-3-10]` -> `test_x[1-True]`; `test_x[3-10]` -> `test_x` (pytest-repeat ids)."""
    if count <= 1:
        return nodeid
    m = re.search(rf"(\[|-)\d+-{count}\]$", nodeid)
    if not m:
        return nodeid
    return nodeid[: m.start()] + ("]" if m.group(1) == "-" else "")


@pytest.fixture
def racecheck_arm(request: pytest.FixtureRequest) -> str:
    """The arm this test runs under (empty when no arms were given)."""
    return request.node.stash[ITEM_TRIAL].arm


@pytest.fixture
def racecheck_seed(request: pytest.FixtureRequest) -> int:
    """The seed of this test's trial: --racecheck-seed plus the trial index."""
    return request.config.getoption("--racecheck-seed") + request.node.stash[ITEM_TRIAL].trial


@pytest.fixture
def racecheck_perturb(request: pytest.FixtureRequest):
    """The perturbation spec given on the command line, or None for the scenario's default."""
    return request.config.getoption("--racecheck-perturb")


@pytest.fixture
def racecheck_detect(request: pytest.FixtureRequest) -> bool:
    return request.config.getoption("--racecheck-detect")


@pytest.fixture
def racecheck_reports(request: pytest.FixtureRequest) -> list:
    """A list that fixtures append detector report texts to; they land in the outcome record."""
    return request.node.stash[ITEM_TRIAL].reports


def pytest_collection_finish(session: pytest.Session) -> None:
    log = session.config.stash[_LOG_KEY]
    if log is not None:
        log.write({"event": "collected", "count": len(session.items)})


def pytest_runtest_setup(item: pytest.Item) -> None:
    log = item.config.stash[_LOG_KEY]
    if log is not None and ITEM_TRIAL in item.stash:
        t = item.stash[ITEM_TRIAL]
        log.write({"event": "start", "test": t.test, "trial": t.trial, "arm": t.arm})


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    t = item.stash.get(ITEM_TRIAL, None)
    if t is None:
        return report
    t.duration += report.duration
    if report.passed:
        t.outcomes.append(Outcome.PASSED)
    elif report.skipped:
        t.outcomes.append(Outcome.SKIPPED)
    else:
        t.outcomes.append(Outcome.FAILED if report.when == "call" else Outcome.ERROR)
        if not t.signature and call.excinfo is not None:
            t.signature = failure_signature(call.excinfo, Path(str(item.config.rootpath)))
            t.message = first_line(call.excinfo)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    result = yield
    log = item.config.stash[_LOG_KEY]
    t = item.stash.get(ITEM_TRIAL, None)
    if log is not None and t is not None:
        log.write({"event": "outcome", "test": t.test, "params": t.params, "trial": t.trial,
                   "arm": t.arm, "seed": item.config.getoption("--racecheck-seed") + t.trial,
                   "outcome": worst(t.outcomes).value, "signature": t.signature, "message": t.message,
                   "duration": round(t.duration, 4), "device": _device(), "detected": len(t.reports), "reports": t.reports})
    return result


def _device() -> str:
    """The device the tests ran on, as the process's racecheck runtime knows it."""
    import sys

    device_mod = sys.modules.get("racecheck.device")
    rt = getattr(device_mod, "_runtime", None) if device_mod else None
    return "cuda" if rt is not None and rt.backend == "cuda" else "cpu"


def failure_signature(excinfo: pytest.ExceptionInfo, rootpath: Path) -> str:
    """`ExcType at file.py:LINE in func`, naming the innermost frame in the user's own code."""
    package_dir = str(Path(__file__).resolve().parent)
    frame = None
    for entry in excinfo.traceback:
        path = str(entry.path)
        if "site-packages" in path or path.startswith(package_dir):
            continue  # library frames: not where the user's failure is
        frame = entry
    if frame is None and len(excinfo.traceback):
        frame = excinfo.traceback[-1]
    where = ""
    if frame is not None:
        try:
            rel = Path(str(frame.path)).relative_to(rootpath)
        except ValueError:
            rel = Path(str(frame.path)).name
        where = f" at {rel}:{frame.lineno + 1} in {frame.name}"
    return f"{excinfo.typename}{where}"


def first_line(excinfo: pytest.ExceptionInfo, limit: int = 300) -> str:
    text = str(excinfo.value).strip().splitlines()
    line = text[0] if text else excinfo.typename
    return line[:limit]


class _RankLog:
    """This rank's outcome stream: one JSON object per line, flushed at once."""

    def __init__(self, pattern: str) -> None:
        rank = os.environ.get("RANK", "0")
        self.path = Path(pattern.replace("{rank}", rank))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rank = int(rank)
        self._fh = open(self.path, "a", encoding="utf-8")

    def write(self, record: dict) -> None:
        record = {"rank": self.rank, "time": time.time(), **record}
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus) -> None:
    # Under the trial runner, failing tests are data: every rank exits 0 so that a launcher such
    # as torchrun does not tear down ranks that are still writing their last outcomes.
    if session.config.stash.get(_LOG_KEY, None) is not None and exitstatus == pytest.ExitCode.TESTS_FAILED:
        session.exitstatus = pytest.ExitCode.OK
