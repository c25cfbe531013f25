"""Reports: golden files for every format, the JUnit XML's Surefire structure, Markdown's size
limit, and the `report` command. Regenerate the goldens with RACECHECK_UPDATE_GOLDEN=1 and review
the diff."""

from __future__ import annotations

import base64
import json
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner
from run_kit import record_frame, run_summary, trial_record, write_log

from racecheck.cli.commands import report_command
from racecheck.protocol.records import TrialRecord
from racecheck.results import report, tally

GOLDEN = Path(__file__).parent / "golden"
FILE = "scenarios/main_grad_reuse/test_main_grad_reuse.py"
TEST = FILE + "::test_hsdp_losses_match_baseline[{}]"
PARAMS = ("1-True", "1-False", "3-True", "3-False")
SKIPPED = FILE + "::test_cuda_graph_capture"


def _outcome(arm: str, trial: int, index: int) -> str:
    if arm == "baseline":
        if trial == 7 and index == 1:
            return "timeout"
        if trial == 4 and index == 3:
            return "crash"
        return "failed" if index == 3 or (trial + index) % 3 else "passed"
    if arm == "record_stream" and trial == 2 and index == 0:
        return "failed"
    return "passed"


def golden_log(out: Path) -> Path:
    """Three arms of main_grad_reuse over 10 trials: a baseline failing every trial (`[3-False]`
    always, the others flakily, one crash, one timeout), a clean fix, and a fix that failed once;
    plus a test skipped everywhere. The detector is on and reports on the baseline's failures."""
    records = []
    for arm, expect in (("baseline", "race"), ("fixed", "safe"), ("record_stream", "safe")):
        for t in range(10):
            trial = {"run_id": "golden", "arm": arm, "expect": expect, "trial": t, "seed": 100 + t, "detect": True}
            for i, p in enumerate(PARAMS):
                outcome = _outcome(arm, t, i)
                bad = outcome != "passed"
                records.append(
                    trial_record(
                        **trial,
                        test=TEST.format(p),
                        params=p,
                        outcome=outcome,
                        signature="AssertionError at test_main_grad_reuse.py:88 in test_hsdp_losses_match_baseline"
                        if outcome == "failed"
                        else "",
                        message=f"loss mismatch at step 2 <{p}> & more" if bad else "",
                        duration=0.125,
                        detected=int(arm == "baseline" and bad),
                        reports=["free while in use: main_grad block reused"] if arm == "baseline" and bad else [],
                        replay=f"racecheck run main_grad_reuse --arm {arm} --trial {t} --seed {100 + t} -k '{p}'",
                    )
                )
            records.append(trial_record(**trial, test=SKIPPED, outcome="skipped"))
    return write_log(out, records)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return golden_log(tmp_path_factory.mktemp("run"))


@pytest.fixture(scope="module")
def rendered(run_dir):
    records = record_frame(run_dir)
    summary = tally.summarize(records)
    return {fmt: report.render(fmt, summary=summary, records=records) for fmt in report.Format}


def _normalise(fmt, text: str) -> str:
    if fmt is report.Format.HTML:
        return re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "data:image/png;base64,PNG", text)
    return text


GOLDEN_NAMES = {
    report.Format.TERMINAL: "report.txt",
    report.Format.MARKDOWN: "report.md",
    report.Format.CSV: "summary.csv",
    report.Format.JSON: "report.json",
    report.Format.JUNIT: "report.junit.xml",
    report.Format.HTML: "report.html",
}


@pytest.mark.parametrize("fmt", list(report.Format), ids=lambda f: f.value)
def test_golden(rendered, fmt):
    path = GOLDEN / GOLDEN_NAMES[fmt]
    got = _normalise(fmt, rendered[fmt])
    if os.environ.get("RACECHECK_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(got, encoding="utf-8")
    assert got == path.read_text(encoding="utf-8")


def test_terminal_shows_arms_then_parametrizations(rendered):
    text = rendered[report.Format.TERMINAL]
    assert "baseline (race)       10/10 failed (100%, 95% CI 72%-100%)" in text
    assert "fixed (safe)          0/10 (rate below 28% at 95%)" in text
    line = next(ln for ln in text.splitlines() if "[3-False]" in ln)
    assert re.search(r"baseline 10/10\s+fixed 0/10\s+record_stream 0/10", line)


def test_summary_csv_matches_write_summary(run_dir, rendered):
    run_summary(run_dir)
    assert (run_dir / "summary.csv").read_text() == rendered[report.Format.CSV]


def test_junit_follows_surefire_structure(rendered):
    root = ET.fromstring(rendered[report.Format.JUNIT].encode("utf-8"))
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == [
        "main_grad_reuse[baseline]",
        "main_grad_reuse[fixed]",
        "main_grad_reuse[record_stream]",
    ]
    order = [
        "failure",
        "rerunFailure",
        "flakyFailure",
        "skipped",
        "error",
        "rerunError",
        "flakyError",
        "system-out",
        "system-err",
    ]
    for suite in suites:
        for attr in ("name", "tests", "failures", "errors", "skipped", "time"):
            assert suite.get(attr) is not None, attr
        cases = suite.findall("testcase")
        assert int(suite.get("tests")) == len(cases) == 5
        assert int(suite.get("skipped")) == sum(c.find("skipped") is not None for c in cases)
        assert int(suite.get("failures")) == sum(c.find("failure") is not None for c in cases)
        assert int(suite.get("errors")) == sum(c.find("error") is not None for c in cases)
        assert float(suite.get("time")) == pytest.approx(sum(float(c.get("time")) for c in cases))
        for case in cases:
            assert case.get("classname") == "scenarios.main_grad_reuse.test_main_grad_reuse"
            assert case.get("name") and float(case.get("time")) >= 0
            tags = [child.tag for child in case]
            assert tags == sorted(tags, key=order.index)  # the XSD's sequence
            for child in case:
                if child.tag != "skipped":
                    assert child.get("type")  # required by the XSD
                if child.tag in ("flakyFailure", "flakyError"):
                    assert child.get("message") and child.find("stackTrace").text
    by_name = {(s.get("name"), c.get("name")): c for s in suites for c in s.findall("testcase")}
    always = by_name[("main_grad_reuse[baseline]", "test_hsdp_losses_match_baseline[3-False]")]
    assert [c.tag for c in always] == ["failure"]
    assert always.find("failure").get("message").startswith("10 of 10 trials failed")
    flaky = by_name[("main_grad_reuse[record_stream]", "test_hsdp_losses_match_baseline[1-True]")]
    (only,) = list(flaky)
    assert only.tag == "flakyFailure" and only.get("type") == "AssertionError"
    assert only.get("message") == "trial 2: loss mismatch at step 2 <1-True> & more"
    assert "--arm record_stream --trial 2" in only.find("stackTrace").text
    mixed = by_name[("main_grad_reuse[baseline]", "test_hsdp_losses_match_baseline[1-False]")]
    assert {c.tag for c in mixed} == {"flakyFailure", "flakyError"}
    assert [c.get("type") for c in mixed if c.tag == "flakyError"] == ["timeout"]
    assert list(by_name[("main_grad_reuse[fixed]", "test_cuda_graph_capture")])[0].tag == "skipped"


def test_html_is_self_contained_with_a_png(rendered):
    page = rendered[report.Format.HTML]
    assert "<style>" in page and "<link" not in page and "<script" not in page
    (data,) = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page)
    assert base64.b64decode(data).startswith(b"\x89PNG\r\n\x1a\n")
    # the arms, the parametrizations, and the distinct failures (failures.py)
    assert page.count("<table>") == 3 and "test_hsdp_losses_match_baseline[3-False]" in page


def test_markdown_truncates_rows_under_the_limit(run_dir):
    summary = tally.summarize(record_frame(run_dir))
    full = report.render_markdown(summary)
    small = report.render_markdown(summary, max_bytes=600)
    assert len(small.encode()) <= 600 < len(full.encode())
    assert re.search(r"_\d+ more table rows left out to stay under 600 bytes", small)


def test_report_command_formats_and_output(run_dir, tmp_path):
    runner = CliRunner()
    result = runner.invoke(report_command, [str(run_dir)])
    assert result.exit_code == 0 and result.output.startswith("main_grad_reuse\n")
    target = tmp_path / "r.xml"
    result = runner.invoke(report_command, [str(run_dir), "--format", "junit", "-o", str(target)])
    assert result.exit_code == 0 and result.output == ""
    ET.parse(target)


def test_report_command_github_summary(run_dir, tmp_path):
    step = tmp_path / "step.md"
    step.write_text("# earlier step\n")
    result = CliRunner().invoke(
        report_command, [str(run_dir), "--format", "csv", "--github-summary"], env={"GITHUB_STEP_SUMMARY": str(step)}
    )
    assert result.exit_code == 0 and result.output.startswith("scenario,test,arm")
    text = step.read_text()
    assert text.startswith("# earlier step\n### racecheck: `main_grad_reuse`")
    assert "### Failures" in text and "| main_grad_reuse | `AssertionError at test_main_grad_reuse.py:88" in text
    result = CliRunner().invoke(report_command, [str(run_dir), "--github-summary"], env={"GITHUB_STEP_SUMMARY": None})
    assert result.exit_code == 2 and "GITHUB_STEP_SUMMARY" in result.output


@pytest.mark.parametrize(
    ("where", "why"),
    [(".", "Is a directory"), ("missing/step.md", "No such file or directory")],
    ids=["folder", "lost"],
)
def test_a_step_summary_that_cannot_be_appended_to_is_one_line_and_exit_2(run_dir, tmp_path, where, why):
    # Refused before the report is rendered, so that the job's log holds the one line and no half.
    step = tmp_path / where
    result = CliRunner().invoke(
        report_command, [str(run_dir), "--github-summary"], env={"GITHUB_STEP_SUMMARY": str(step)}
    )
    assert result.exit_code == 2, result  # an uncaught OSError would be exit 1 with its traceback
    assert result.output.strip().splitlines()[-1] == (
        f"Error: --github-summary: cannot append to $GITHUB_STEP_SUMMARY ({step}): {why}"
    ), result.output
    assert "main_grad_reuse" not in result.output


def test_report_command_usage_errors(tmp_path):
    runner = CliRunner()
    for args, message in [
        ([str(tmp_path / "missing")], "no such directory"),
        ([str(tmp_path)], "no trial log"),
        ([str(tmp_path), "--format", "pdf"], "'pdf' is not one of"),
    ]:
        result = runner.invoke(report_command, args)
        assert result.exit_code == 2 and message in result.output, result.output
        assert "Traceback" not in result.output


def test_detector_reports_appear_merged_by_their_first_line(tmp_path):
    text = "racecheck detected a race: free-while-in-use: a 16.0 KiB buffer ...\n  stacks ..."
    write_log(
        tmp_path,
        (
            trial_record(
                arm=arm,
                trial=trial,
                seed=trial,
                test="t.py::test_x",
                outcome="failed" if reports else "passed",
                detect=True,
                detected=len(reports),
                reports=reports,
            )
            for trial in range(3)
            for arm, reports in (("baseline", [text]), ("fixed", []))
        ),
    )
    records = record_frame(tmp_path)
    summary = tally.summarize(records)
    terminal = report.render("terminal", summary=summary, records=records)
    assert "detector reports" in terminal
    assert "main_grad_reuse / baseline: in 3 trial(s): racecheck detected a race" in terminal
    assert "fixed: in" not in terminal
    markdown = report.render("markdown", summary=summary, records=records)
    assert markdown.count("<details>") == 1 and "  stacks ..." in markdown
    assert "detector reports" not in report.render("terminal", summary=summary, records=None)


def test_a_test_is_named_by_its_node_id_cut_before_its_parametrization_in_every_format(tmp_path):
    """Parametrization ids are the user's text and may hold `::` and `[` (`ids=["a/b::c[d]"]`): a
    node id is cut into file, classes and test before its brackets, never inside them (the table
    and the failure line named the test below `c[d]]`)."""
    from racecheck.protocol.node_ids import short_name, split_node_id

    tricky = "tests/test_things.py::TestC::test_param[a/b::c[d]]"
    assert split_node_id(tricky) == ("tests/test_things.py", ["TestC"], "test_param[a/b::c[d]]")
    assert split_node_id("t.py::test_x") == ("t.py", [], "test_x")
    assert short_name(tricky) == "test_param[a/b::c[d]]" and short_name("*") == "*"
    write_log(
        tmp_path, [trial_record(arm=a, test=tricky, outcome=o) for a, o in (("bad", "failed"), ("good", "passed"))]
    )
    records = record_frame(tmp_path)
    summary = tally.summarize(records)
    for fmt in ("terminal", "markdown", "html"):
        assert "test_param[a/b::c[d]]" in report.render(fmt, summary=summary, records=records), fmt
    cases = ET.fromstring(report.render("junit", summary=summary, records=records).encode("utf-8")).iter("testcase")
    assert {(c.get("classname"), c.get("name")) for c in cases} == {
        ("tests.test_things.TestC", "test_param[a/b::c[d]]")
    }


def test_every_format_has_a_renderer_of_its_own():
    from racecheck.results.rows import Format

    assert set(report.RENDERERS) == set(Format)
    assert len(set(report.RENDERERS.values())) == len(Format)  # no format falls through to another


def test_failure_text_that_is_no_utf8_is_escaped_in_every_format(tmp_path):
    """A lone surrogate (a file name's undecodable byte, as os.fsdecode gives it) in a failure's
    text: every format still writes, as UTF-8, and the JUnit XML stays well-formed."""
    bad = "bad name " + os.fsdecode(b"caf\xff.txt")
    fields = dict(run_id="r", scenario="s", arm="a", expect="", trial=0, seed=0, test="t.py::test_x", params="")
    fields.update(outcome="failed", signature="OSError at t.py:3 in test_x", message=bad, reports=[bad])
    (tmp_path / "trials.jsonl").write_text(json.dumps(fields) + "\n")  # as the runner's JSON holds it
    escaped = "bad name caf\\xff.txt"  # the byte, as Python writes one that does not decode
    assert TrialRecord(**fields).message == TrialRecord(**fields).reports[0] == escaped
    for fmt in report.Format:
        target = tmp_path / f"report.{fmt.value}"
        result = CliRunner().invoke(report_command, [str(tmp_path), "--format", fmt.value, "-o", str(target)])
        assert result.exit_code == 0, (fmt, result.output, result.exception)
        text = target.read_bytes().decode("utf-8")
        shown = json.dumps(escaped)[1:-1] if fmt is report.Format.JSON else escaped
        if fmt is not report.Format.CSV:  # the summary alone holds no failure text
            assert shown in text, fmt
    ET.fromstring((tmp_path / "report.junit").read_bytes())
    step = tmp_path / "step.md"
    result = CliRunner().invoke(
        report_command, [str(tmp_path), "--github-summary"], env={"GITHUB_STEP_SUMMARY": str(step)}
    )
    assert result.exit_code == 0 and escaped in step.read_bytes().decode("utf-8"), result.output
