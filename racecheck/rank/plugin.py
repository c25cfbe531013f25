"""The racecheck pytest plugin (entry point `pytest11`): trial/arm bookkeeping and outcome capture.

In one pytest session it repeats every test --racecheck-steps times (its own parametrization of
the `racecheck_step` fixture, node ids ending in `-K-N` for step K of N; the test itself sees its
own name and parametrization, as plain pytest gives them) and maps the steps to blocks
(one trial of one arm, with its resolved perturbation): step k runs block k of the schedule given
with --racecheck-schedule (the trial runner writes it; a block that an earlier session ended in
lists the tests it has recorded, and those are deselected), or, without one, trial k of no arm.
Every
test's outcome is written, as soon as it is known, as one rank event (protocol/rank_events.py's
RankEvent) to the per-process log given with --racecheck-log; the trial runner merges the ranks.
Under pytest-xdist every worker writes its own file (the worker id is added to the name).
With --racecheck-patch (a project's own suite), every test runs under patch mode and, with
--racecheck-detect, TorchRaceTracker (project.py); a block's profile comes from the schedule.
torch is imported lazily so that loading the plugin costs nothing for suites that do not use it.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from racecheck.perturb.profiles import parse_profile
from racecheck.protocol import names
from racecheck.protocol.lifeline import die_with_parent
from racecheck.protocol.one_rank import own_world_for_xdist_worker
from racecheck.protocol.rank_events import Collected, CollectError, Finished, Started, TestOutcome
from racecheck.protocol.records import Outcome, worst
from racecheck.protocol.schedule import Block, read_schedule
from racecheck.rank.failure_text import error_line, failure_signature, message_line, racecheck_frame
from racecheck.rank.harness import HARNESS, check_call
from racecheck.rank.item_trial import ITEM_TRIAL, ItemTrial
from racecheck.rank.param_targets import Wanted, widen
from racecheck.rank.rank_log import RankLog

if TYPE_CHECKING:
    from racecheck.rank.project import ProjectTests

STEP_FIXTURE = "racecheck_step"  # the fixture this plugin parametrizes with the session's steps


_LOG_KEY = pytest.StashKey["RankLog | None"]()
_STOPPED_KEY = pytest.StashKey[bool]()
_SCHEDULE_KEY = pytest.StashKey[list]()
_PROFILES_KEY = pytest.StashKey[dict]()  # each spec of the schedule -> its Profile
_PROJECT_KEY: pytest.StashKey[ProjectTests] = pytest.StashKey()
_WANTED_KEY = pytest.StashKey[Wanted]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("racecheck", "racecheck: arms, trials, perturbation and outcome logging")
    for option in names.OPTIONS:  # what the runner gives a session (protocol/names.py)
        if option.kind is bool:
            group.addoption(option.flag, action="store_true", default=option.default, help=option.help)
        else:
            kind = option.kind if option.kind is not str else None
            group.addoption(option.flag, type=kind, default=option.default, metavar=option.metavar, help=option.help)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "racecheck_world(n): the test needs a process world of n ranks; "
        "in a world of another size it fails at setup instead of hanging in a collective",
    )
    count = config.getoption(names.STEPS.flag)
    if count < 1:
        raise pytest.UsageError(f"{names.STEPS.flag} must be >= 1")
    # pytest-repeat's public --count, where that plugin is installed, repeats tests outside the
    # steps: every repeat would run block 0. Refuse the mix instead of mislabelling trials.
    if (config.getoption("count", None) or 1) > 1 and (count > 1 or config.getoption(names.SCHEDULE.flag)):
        raise pytest.UsageError(
            "--count (pytest-repeat) does not map repeats to racecheck's blocks; use --racecheck-steps"
        )
    schedule = config.getoption(names.SCHEDULE.flag)
    if schedule is not None:
        try:
            config.stash[_SCHEDULE_KEY] = read_schedule(schedule)
        except ValueError as exc:
            raise pytest.UsageError(f"{names.SCHEDULE.flag}: {exc}") from None
        # Each spec parsed here once, every test of its blocks runs it [Note: resolved specs].
        specs = dict.fromkeys(b.perturb for b in config.stash[_SCHEDULE_KEY] if b.perturb)
        try:
            config.stash[_PROFILES_KEY] = {spec: parse_profile(spec) for spec in specs}
        except ValueError as exc:
            raise pytest.UsageError(f"{names.SCHEDULE.flag}: {exc}") from None
        listed = len(config.stash[_SCHEDULE_KEY])
        if listed != count:
            raise pytest.UsageError(f"{names.SCHEDULE.flag} lists {listed} blocks but {names.STEPS.flag} is {count}")
    if config.getoption(names.PATCH.flag):
        from racecheck.rank.project import configure_project

        config.stash[_PROJECT_KEY] = configure_project(config, list(config.stash.get(_PROFILES_KEY, {}).values()))
    path = config.getoption(names.LOG.flag)
    log = config.stash[_LOG_KEY] = RankLog(path) if path else None
    if log is not None:
        # Under the trial runner: a rank (or xdist worker) dies with its launcher, never orphaned.
        die_with_parent(signal.SIGKILL)
        config.pluginmanager.register(_CollectErrors(log), "racecheck-collect-errors")
        from racecheck.rank.collect import RunFolders  # no run folder's files are tests

        config.pluginmanager.register(RunFolders(config.invocation_params.dir), "racecheck-run-folders")
    config.stash[_STOPPED_KEY] = False


def _blocks(config: pytest.Config, count: int) -> list[Block]:
    """The block of every repeat step: the schedule file's (the trial runner's), else step k is
    trial k of no arm (a plain pytest run with the plugin)."""
    if _SCHEDULE_KEY in config.stash:
        return config.stash[_SCHEDULE_KEY]  # as many as --racecheck-steps (pytest_configure checks)
    return [Block(k, "") for k in range(count)]


@pytest.hookimpl(trylast=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Repeat the test once per step. Last of all parametrizations, so the step's id comes last
    (`test_x[1-True-3-10]`), and session-scoped, so pytest runs the suite step by step."""
    count = metafunc.config.getoption(names.STEPS.flag)
    if count > 1 and STEP_FIXTURE in metafunc.fixturenames:
        metafunc.parametrize(
            STEP_FIXTURE, range(count), indirect=True, scope="session", ids=[step_id(k, count) for k in range(count)]
        )


def step_id(step: int, count: int) -> str:
    """The id of a step in a test's node id: `K-N`, 1-based (the ids pytest-repeat gave)."""
    return f"{step + 1}-{count}"


def strip_step(nodeid: str, step: int, count: int) -> str:
    """The node id without its step's id: `test_x[1-True-3-10]` -> `test_x[1-True]`,
    `test_x[3-10]` -> `test_x`; unchanged with one step."""
    if count <= 1:
        return nodeid
    suffix = step_id(step, count)
    if nodeid.endswith(f"[{suffix}]"):
        return nodeid[: -len(suffix) - 2]
    if nodeid.endswith(f"-{suffix}]"):
        return nodeid[: -len(suffix) - 2] + "]"
    return nodeid  # not parametrized by this plugin (e.g. a unittest case)


@pytest.fixture(autouse=True)
def racecheck_step(request: pytest.FixtureRequest) -> int:
    """This test's step in the session (0 with one step): the position of its block."""
    trial = request.node.stash.get(ITEM_TRIAL, None)
    return trial.step if trial is not None else 0


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    """A parametrized target (`f.py::test_x[1-True]`) names no item once every test is repeated
    per step: collect its test whole and keep the parametrizations named (param_targets.py).
    With one step the ids are the test's own, and pytest's arguments stay as given. In an xdist
    worker of a one-rank session: a world of its own, before any conftest reads MASTER_PORT."""
    own_world_for_xdist_worker()
    if getattr(early_config.known_args_namespace, names.STEPS.dest, 1) > 1:
        args[:], early_config.stash[_WANTED_KEY] = widen(args, early_config.invocation_params.dir)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list):
    """After every other plugin's selection and order (pytest's reordering by parameter, which
    needs the step's, `-k`, pytest-randomly): each item's block and its own name back. The
    blocks' order is pytest_collection_finish's, the one place after every reordering."""
    yield
    count = config.getoption(names.STEPS.flag)
    blocks = _blocks(config, count)
    profiles = config.stash.get(_PROFILES_KEY, {})
    wanted = config.stash.get(_WANTED_KEY, Wanted({}))
    unwanted = [it for it in items if not wanted.keeps(it.path, _inner_id(strip_step(it.nodeid, _step(it), count)))]
    if unwanted:
        config.hook.pytest_deselected(items=unwanted)
        items[:] = [it for it in items if it not in unwanted]
    _refuse_unrepeatable(config, items, count)
    for item in items:
        step = _step(item)
        test = strip_step(item.nodeid, step, count)
        params = test[test.index("[") + 1 : -1] if test.endswith("]") and "[" in test else ""
        block = blocks[step]
        item.stash[ITEM_TRIAL] = ItemTrial(
            step=step,
            trial=block.trial,
            arm=block.arm,
            test=test,
            params=params,
            perturb=block.perturb,
            profile=profiles.get(block.perturb),
        )
        _own_name(item, step, count)
    # A block that an earlier session ended in runs only the tests it has not recorded.
    recorded = {k: set(b.done) for k, b in enumerate(blocks) if b.done}
    if recorded:
        done = [it for it in items if it.stash[ITEM_TRIAL].test in recorded.get(it.stash[ITEM_TRIAL].step, ())]
        config.hook.pytest_deselected(items=done)
        items[:] = [it for it in items if it.stash[ITEM_TRIAL].test not in recorded.get(it.stash[ITEM_TRIAL].step, ())]


def _step(item: pytest.Item) -> int:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get(STEP_FIXTURE, 0) if callspec is not None else 0


def _refuse_unrepeatable(config: pytest.Config, items: list, count: int) -> None:
    """The steps repeat a test by parametrizing it; an item pytest does not parametrize (a
    unittest.TestCase method, a doctest, another plugin's item) would run in the first step alone
    while every step's trial counted it: a usage error naming it (also logged, for the runner's
    one line), never a tally of tests that did not run."""
    if count <= 1:
        return
    unrepeated = [it for it in items if STEP_FIXTURE not in getattr(getattr(it, "callspec", None), "params", {})]
    if not unrepeated:
        return
    first = unrepeated[0]
    kind = "a unittest.TestCase method" if getattr(first, "nofuncargs", False) else f"a {type(first).__name__}"
    more = f" (and {len(unrepeated) - 1} more)" if len(unrepeated) > 1 else ""
    reason = (
        f"{kind}{more} runs once per pytest session, and session isolation repeats each test in one "
        f"session; run this suite with --isolation process (a session per trial)"
    )
    log = config.stash.get(_LOG_KEY, None)
    if log is not None:
        log.write(CollectError(nodeid=first.nodeid, message=reason))
    raise pytest.UsageError(f"{first.nodeid}: {reason}")


def _own_name(item: pytest.Item, step: int, count: int) -> None:
    """Give a repeated test its own name and parametrization back: the step's id stays in its node
    id (which must differ step to step), while `request.node.name`, `callspec.id` and
    `callspec.params`, which tests name files, goldens and ops after, are plain pytest's. An
    instrument never changes what the test sees. The step lives on in the item's ItemTrial."""
    callspec = getattr(item, "callspec", None)
    if count <= 1 or not isinstance(item, pytest.Function) or callspec is None or STEP_FIXTURE not in callspec.params:
        return
    ids = list(callspec._idlist)
    own = step_id(step, count)
    if own in ids:
        del ids[len(ids) - 1 - ids[::-1].index(own)]
    params = {k: v for k, v in callspec.params.items() if k != STEP_FIXTURE}
    if not params and not ids:
        del item.callspec  # an unparametrized test has none
    else:
        item.callspec = dataclasses.replace(
            callspec,
            params=params,
            indices={k: v for k, v in callspec.indices.items() if k != STEP_FIXTURE},
            _arg2scope={k: v for k, v in callspec._arg2scope.items() if k != STEP_FIXTURE},
            _idlist=ids,
        )
    item.name = f"{item.originalname}[{'-'.join(ids)}]" if ids else item.originalname


def _inner_id(nodeid: str) -> str:
    """The part of a node id after its file: `TestC::test_x[1]` of `f.py::TestC::test_x[1]`."""
    return nodeid.partition("::")[2]


@pytest.fixture
def racecheck_arm(request: pytest.FixtureRequest) -> str:
    """The arm this test runs under (empty when no arms were given)."""
    return request.node.stash[ITEM_TRIAL].arm


@pytest.fixture
def racecheck_seed(request: pytest.FixtureRequest) -> int:
    """The seed of this test's trial: --racecheck-seed plus the trial index."""
    return request.config.getoption(names.SEED.flag) + request.node.stash[ITEM_TRIAL].trial


@pytest.fixture
def racecheck_perturb(request: pytest.FixtureRequest) -> str | None:
    """This block's perturbation spec, as the runner resolved it into the session's schedule
    (arm over suite over --perturb); None without one: the scenario's default."""
    return request.node.stash[ITEM_TRIAL].perturb or None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker sends its collection
def pytest_collection_finish(session: pytest.Session) -> None:
    # Block order (trial-major, arms in each trial's order), stable inside a step (pytest's and the
    # plugins' order). Here, not in pytest_collection_modifyitems: --ff and --nf reorder the items
    # in wrappers around every collection hook, which would run a failed test of step 2 first.
    session.items.sort(key=lambda it: it.stash[ITEM_TRIAL].step if ITEM_TRIAL in it.stash else 0)
    log = session.config.stash[_LOG_KEY]
    if log is not None:
        log.write(Collected(count=len(session.items)))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    log = item.config.stash[_LOG_KEY]
    if log is not None and ITEM_TRIAL in item.stash:
        t = item.stash[ITEM_TRIAL]
        log.write(Started(test=t.test, trial=t.trial, arm=t.arm))
    marker = item.get_closest_marker("racecheck_world")
    if marker is not None:
        needed, have = int(marker.args[0]), int(os.environ.get("WORLD_SIZE", "1"))
        if needed != have:
            pytest.fail(
                f"{item.name} needs a process world of {needed} ranks, this one has {have}: run it "
                f"with `racecheck run --world-size {needed}` or `torchrun --nproc-per-node {needed}`",
                pytrace=False,
            )


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
            t.signature = failure_signature(call.excinfo, Path(str(item.config.rootpath)), item)
            t.message = message_line(call.excinfo)
            t.racecheck_frame = racecheck_frame(call.excinfo)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """A race the test's harness found by the end of its call fails it, with the reports as the
    failure text, also when the body failed on its own (harness.py)."""
    if HARNESS not in item.stash:  # set up by the runtime fixture, or by the protocol hook below
        return (yield)
    failure = None
    try:
        result = yield
    except (KeyboardInterrupt, pytest.skip.Exception):
        raise
    except BaseException as exc:  # pytest.fail's outcome is a BaseException too
        result, failure = None, exc
    check_call(item, failure)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    config = item.config
    t = item.stash.get(ITEM_TRIAL, None)
    project = config.stash.get(_PROJECT_KEY, None)
    seed = config.getoption(names.SEED.flag) + (t.trial if t is not None else 0)
    harness = project.start(item, t, seed=seed) if project is not None and t is not None else None
    try:
        result = yield
    finally:
        if harness is not None:
            harness.finish()
    log = config.stash[_LOG_KEY]
    if log is not None and t is not None:
        log.write(_outcome(t, seed=seed, device="cuda" if project is not None and project.cuda else _device()))
    following = nextitem.stash.get(ITEM_TRIAL, None) if nextitem is not None else None
    if t is not None and following is not None and following.trial != t.trial:
        if _stop_requested(config, following.trial):
            config.stash[_STOPPED_KEY] = True
            item.session.shouldstop = f"racecheck: stop requested before trial {following.trial}"
    return result


def _outcome(t: ItemTrial, *, seed: int, device: str) -> TestOutcome:
    """The outcome event of the test whose ItemTrial is `t`, its reports written as text."""
    return TestOutcome(
        test=t.test,
        params=t.params,
        trial=t.trial,
        arm=t.arm,
        seed=seed,
        outcome=worst(t.outcomes).value,
        signature=t.signature,
        message=t.message,
        racecheck_frame=t.racecheck_frame or None,
        duration=round(t.duration, 4),
        device=device,
        detected=len(t.reports),
        reports=[r.text() for r in t.reports],
        **t.fields,
    )


def _stop_requested(config: pytest.Config, trial: int) -> bool:
    """Whether the runner asked this session to stop before `trial` (a trial boundary)."""
    path = config.getoption(names.STOP_FILE.flag)
    if not path:
        return False
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return False
    return text.isdigit() and trial >= int(text)


def _device() -> str:
    """The device the tests ran on, as the process's racecheck runtime knows it."""
    device_mod = sys.modules.get("racecheck.device")
    rt = getattr(device_mod, "_runtime", None) if device_mod else None
    return "cuda" if rt is not None and rt.backend == "cuda" else "cpu"


class _CollectErrors:
    """Logs collection errors (an object, because collect reports carry no config)."""

    def __init__(self, log: RankLog) -> None:
        self.log = log

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.log.write(CollectError(nodeid=report.nodeid, message=error_line(report.longreprtext)))


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus) -> None:
    config = session.config
    log = config.stash.get(_LOG_KEY, None)
    if log is None:
        return
    stopped = config.stash.get(_STOPPED_KEY, False)
    log.write(Finished(status=int(exitstatus), stopped=stopped))
    # Under the trial runner, failing tests are data: every rank exits 0 so that a launcher such
    # as torchrun does not tear down ranks that are still writing their last outcomes. A stop the
    # runner asked for is no failure either.
    if exitstatus == pytest.ExitCode.TESTS_FAILED or (stopped and exitstatus == pytest.ExitCode.INTERRUPTED):
        session.exitstatus = pytest.ExitCode.OK
