"""The rank events' one schema (racecheck.protocol.rank_events.RankEvent): what the plugin writes to each
process's log, what the session reads back and merges over ranks, and the lines of older runs."""

from __future__ import annotations

import json

import pytest

from racecheck.protocol.rank_events import (
    Collected,
    CollectError,
    Finished,
    RankEvent,
    RankEventKind,
    Started,
    TestOutcome,
)
from racecheck.protocol.records import Outcome
from racecheck.runner.ranks import RankMerger, RankTail

pytest_plugins = ["pytester"]

# Lines as the plugin wrote them before the schema existed (a run folder's ranks/ of that time).
OLD_LINES = [
    '{"rank": 1, "worker": "", "time": 1.5, "event": "collected", "count": 4}',
    '{"rank": 1, "worker": "", "time": 1.6, "event": "start", "test": "t.py::test_a[1]", "trial": 0, "arm": "a"}',
    '{"rank": 1, "worker": "", "time": 1.7, "event": "outcome", "test": "t.py::test_a[1]", "params": "1", '
    '"trial": 0, "arm": "a", "seed": 5, "outcome": "failed", "signature": "AssertionError at t.py:3 in test_a", '
    '"message": "boom", "duration": 0.25, "device": "cpu", "detected": 0, "reports": []}',
    '{"rank": 1, "worker": "gw0", "time": 1.8, "event": "outcome", "test": "t.py::test_b", "params": "", '
    '"trial": 0, "arm": "a", "seed": 5, "outcome": "passed", "signature": "", "message": "", "duration": 0.1, '
    '"device": "cuda", "detected": 0, "reports": [], "perturb": "sleep@stream_enter:3ms", '
    '"actions": {"sleep": 2, "pressure": 0, "poison": 0}, "delayed": [], "handoffs": 7}',
    '{"rank": 1, "worker": "", "time": 1.9, "event": "collecterror", "nodeid": "bad.py", "message": "SyntaxError"}',
    '{"rank": 1, "worker": "", "time": 2.0, "event": "finish", "status": 1, "stopped": false}',
]


def test_old_lines_parse_into_their_kinds_and_write_back_unchanged():
    events = [RankEvent.from_dict(json.loads(line)) for line in OLD_LINES]
    assert [type(e) for e in events] == [Collected, Started, TestOutcome, TestOutcome, CollectError, Finished]
    assert [e.to_json() for e in events] == OLD_LINES  # same keys, same order: the files do not change
    failed, patched = events[2], events[3]
    assert (failed.key, failed.outcome, failed.seed, failed.perturb) == ((0, "a", "t.py::test_a[1]"), "failed", 5, None)
    assert (patched.actions["sleep"], patched.handoffs, patched.worker) == (2, 7, "gw0")


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"event": "teleport"}, "unknown rank event 'teleport'"),
        ({"event": "start", "test": "t"}, "start event"),
        (["not", "an", "object"], "not a JSON object"),
    ],
)
def test_bad_events_are_value_errors(data, words):
    with pytest.raises(ValueError, match=words):
        RankEvent.from_dict(data)


def test_the_tail_reads_events_and_skips_what_is_not_one(tmp_path):
    path = tmp_path / "s-rank-0.jsonl"
    path.write_text(
        OLD_LINES[0] + "\n" + '{"event": "teleport"}\n' + "{torn\n" + OLD_LINES[1] + "\n" + OLD_LINES[2][:30]
    )
    tail = RankTail(path)
    assert [e.KIND for e in tail.read()] == [RankEventKind.COLLECTED, RankEventKind.START]
    with open(path, "a") as fh:
        fh.write(OLD_LINES[2][30:] + "\n")  # the unterminated line completes
    assert [type(e) for e in tail.read()] == [TestOutcome]


def test_outcomes_merge_over_ranks_as_one_event():
    merger = RankMerger(2)
    one = dict(test="t.py::test_x", trial=3, arm="b")
    assert merger.add(Started(rank=0, **one)) is None
    assert merger.add(TestOutcome(rank=0, outcome="passed", duration=0.5, **one)) is None
    merged = merger.add(
        TestOutcome(
            rank=1,
            outcome="failed",
            signature="E at x",
            message="m",
            duration=0.75,
            reports=["race"],
            detected=1,
            **one,
        )
    )
    assert isinstance(merged, TestOutcome)
    assert (merged.outcome, merged.signature, merged.duration, merged.detected, merged.reports) == (
        "failed",
        "E at x",
        0.75,
        1,
        ["race"],
    )
    merger.add(TestOutcome(rank=0, outcome="failed", message="lost", **{**one, "trial": 4}))
    (crash,) = merger.abandon_after_peer_failure([(4, "b", "t.py::test_x")])
    assert crash.outcome == "failed" and crash.message.startswith("rank 0: lost")


def test_a_test_abandoned_with_the_session_names_the_ranks_that_never_reported_it():
    merger = RankMerger(4)
    one = dict(test="t.py::test_x", trial=0, arm="b")
    merger.add(Started(rank=0, **one))
    merger.add(TestOutcome(rank=0, outcome="passed", **one))
    merger.add(TestOutcome(rank=2, outcome="passed", **one))
    (crash,) = merger.abandon(Outcome.CRASH, signature="crash: killed by SIGKILL")
    assert crash.outcome == "crash" and crash.message == "the session ended (crash) before ranks 1, 3 reported"
    merger.add(TestOutcome(rank=0, outcome="passed", **{**one, "trial": 1}))
    merger.add(TestOutcome(rank=1, outcome="passed", **{**one, "trial": 1}))
    merger.add(TestOutcome(rank=2, outcome="passed", **{**one, "trial": 1}))
    (hung,) = merger.abandon(Outcome.TIMEOUT)
    assert hung.message == "the session ended (timeout) before rank 3 reported"


def test_every_line_the_plugin_writes_is_a_rank_event(pytester, tmp_path):
    pytester.makepyfile(
        test_w="import pytest\n\n@pytest.mark.parametrize('i', [1, 2])\ndef test_w(i):\n    assert i == 1\n",
        test_bad="def test_f(:\n    pass\n",
    )
    log = tmp_path / "log.jsonl"
    pytester.runpytest(
        "-p",
        "racecheck",
        "--racecheck-steps=2",
        f"--racecheck-log={log}",
        "--continue-on-collection-errors",
    )
    lines = log.read_text().splitlines()
    events = [RankEvent.from_dict(json.loads(line)) for line in lines]
    assert [e.to_json() for e in events] == lines
    assert [e.KIND.value for e in events] == ["collecterror", "collected"] + ["start", "outcome"] * 4 + ["finish"]
