"""The README's figures measured on GPUs against the committed reports they come from
(reports/gpu/): the native recording path's benchmark (its table, its calls' rounds, the step's
parts), the foreign-code table (plain torch, FSDP2, megatron-fsdp, the generated programs), the
soundness check, FSDP2's free before the wait, the catalogue and CUDA tests of the last round, the
two paths compared, and the figures of reports/gpu/README.md. Reads files only; runs nothing."""

from __future__ import annotations

import re
from collections import defaultdict
from typing import NamedTuple

from readme_kit import FLAT, ROOT, appears, quoted, rounds_to, rows, text

FOREIGN = rows("gpu/foreign_code.csv")
ANY = "any test of the run"


def foreign(suite: str, arm: str, mode: str, *, case: str = ANY) -> dict:
    (row,) = [r for r in FOREIGN if (r["suite"], r["case"], r["arm"], r["mode"]) == (suite, case, arm, mode)]
    return row


def per_test(suite: str, arm: str, mode_prefix: str) -> list[dict]:
    return [r for r in FOREIGN if r["suite"] == suite and r["arm"] == arm and r["case"] != ANY
            and r["mode"].startswith(mode_prefix)]  # fmt: skip


def total(found: list[dict], field: str) -> int:
    return sum(int(r[field]) for r in found)


# -- the native recording path's benchmark ---------------------------------------------------------
class Row(NamedTuple):
    median: str
    slowdown: str
    runs: list[float]
    paired: str


def md_tables(name: str) -> dict[tuple[str, str], Row]:
    """{(workload, mode): (median, slowdown, every run, paired)} of a detector_overhead_native*.md."""
    found, workload = {}, ""
    for line in text(name).splitlines():
        if line.startswith("## ") or line.startswith("### "):
            workload = line.lstrip("#").strip().split(":")[0]
        elif m := re.match(r"^\| (\w+) \| ([\d.]+) \| ([\d.]+)x \| ([\d.]+)x \|(?: \d+ \|)? ([\d., ]+) \|$", line):
            found[(workload, m[1])] = Row(m[2], m[3], [float(v) for v in m[5].split(", ")], m[4])
    return found


def test_the_native_table_is_the_pinned_csv_and_the_unpinned_report():
    pinned = {
        (r["workload"], r["mode"]): (r["ms_median"], r["slowdown"])
        for r in rows("gpu/detector_overhead_native_sgd_pinned.csv")
    }
    unpinned = md_tables("gpu/detector_overhead_native_unpinned.md")
    table = re.findall(
        r"\| (MLP|FSDP2 transformer) [^|]*\| (unpinned|pinned) \| ([\d.]+) \|((?: [\d.]+ \([\d.]+x\) \|){3})", FLAT
    )
    assert len(table) == 4
    for step, placement, plain, rest in table:
        workload = "mlp" if step == "MLP" else "fsdp2"
        cells = [(plain, "1.00")] + re.findall(r"([\d.]+) \(([\d.]+)x\)", rest)
        for mode, cell in zip(("plain", "native", "python", "sanitizer"), cells, strict=True):
            source = pinned if placement == "pinned" else {k: v[:2] for k, v in unpinned.items()}
            assert cell == source[(workload, mode)], (placement, workload, mode)


ADAMW_STEPS = (
    "MLP (8 x 2048, GELU)", "FSDP2 transformer (4 layers, width 512, bf16)",
    "FSDP2 transformer (4 layers, width 512, bf16), each layer compiled",
)  # fmt: skip
# each table: (its report, its log); the log of several calls has a `## call N` line before each
H100_TWENTY_SEVEN_ROUNDS = (
    "gpu/detector_overhead_native.md",
    "gpu/detector_overhead_native.log",
)
H200_SIXTEEN_ROUNDS = (
    "gpu/detector_overhead_native_adamw_h200_16rounds.md",
    "gpu/detector_overhead_native_adamw_h200_16rounds.log",
)
MLP_HOOKS_H200 = (
    "gpu/detector_overhead_native_mlp_hooks_h200.md",
    "gpu/detector_overhead_native_mlp_hooks_h200.log",
)
H100_THIRTEEN_ROUNDS = (
    "gpu/detector_overhead_native_adamw_h100_13rounds.md",
    "gpu/detector_overhead_native_adamw_h100_13rounds.log",
)
H100_TWENTY_FOUR_ROUNDS = (
    "gpu/detector_overhead_native_adamw_h100_24rounds.md",
    "gpu/detector_overhead_native_adamw_h100_24rounds.log",
)
H200_TEN_ROUNDS = (
    "gpu/detector_overhead_native_adamw_h200_10rounds.md",
    "gpu/detector_overhead_native_adamw_h200_10rounds.log",
)
H100_CALL = (
    "gpu/detector_overhead_native_adamw_h100_7rounds.md",
    "gpu/detector_overhead_native_adamw_h100_7rounds.log",
)
H200_BEFORE = (
    "gpu/detector_overhead_native_adamw_unpinned_7rounds.md",
    "gpu/detector_overhead_native_adamw_unpinned_7rounds.log",
)
WORKLOADS = ("mlp-adamw", "fsdp2-adamw", "fsdp2-compiled")


def between(start: str, end: str) -> str:
    """The README's text from `start`, which it says once, to the first `end` after it."""
    (begin,) = [m.start() for m in re.finditer(re.escape(start), FLAT)]
    return FLAT[begin : FLAT.index(end, begin)]


def calls_of(log_name: str) -> list[str]:
    """A benchmark log's calls, in order: the text after each `## call N` line, or the whole log."""
    return re.split(r"^## call \d+.*$", text(log_name), flags=re.M)[1:] or [text(log_name)]


def rounds_of(call_log: str) -> int:
    return len({int(r) for r in re.findall(r"^repeat (\d+) unpinned", call_log, re.M)})


def said_in(told: str, pattern: str) -> tuple[str, ...]:
    """The groups of the one place `pattern` matches the text `told`."""
    found = list(re.finditer(pattern, told))
    assert len(found) == 1, f"/{pattern}/ matches {len(found)} times, not once"
    return found[0].groups()


def check_engine_tests(log_name: str) -> None:
    """That a log of bench/native_gpu.sh's check has the native engine's CUDA tests, then the
    Python engine's, each passed with none failed."""
    passed = re.findall(
        r"^## RACECHECK_DETECT_ENGINE=(native|python) .*?^(\d+) passed(.*?) in ", text(log_name), re.M | re.S
    )
    assert [e for e, *_ in passed] == ["native", "python"]
    assert all("failed" not in rest and "error" not in rest for *_, rest in passed)


def check_adamw_call(told: str, table: tuple[str, str]) -> int:
    """That the text `told` of one AdamW table cites its files, has its report's medians and
    slowdowns, its calls' rounds (each call's from its log), its plain FSDP2 runs' span, and that
    no run of either path reported; the table's rounds."""
    report_name, log_name = table
    assert f"`reports/{report_name.removesuffix('.md')}.{{md,csv,log}}`, `_runs.csv`" in told
    report = md_tables(report_name)
    found = re.findall(
        r"\| (MLP \(8 x 2048, GELU\)|FSDP2 transformer \(4 layers, width 512, bf16\)(?:, each layer compiled)?) "
        r"\| AdamW \(foreach\) \| unpinned, \d+ \| ([\d.]+) \|((?: [\d.]+ \([\d.]+x, paired [\d.]+x\) \|){3})",
        told,
    )
    assert [step for step, *_ in found] == list(ADAMW_STEPS)
    for (_, plain, rest), workload in zip(found, WORKLOADS, strict=True):
        cells = [(plain, "1.00")] + re.findall(r"([\d.]+) \(([\d.]+)x,", rest)
        for mode, cell in zip(("plain", "native", "python", "sanitizer"), cells, strict=True):
            assert cell == report[(workload, mode)][:2], (workload, mode)
    low, high = re.search(r"plain FSDP2 runs\s+spanned ([\d.]+) to ([\d.]+) ms\)", told).groups()
    plain_runs = report[("fsdp2-adamw", "plain")][2]
    assert (low, high) == (f"{min(plain_runs):.2f}", f"{max(plain_runs):.2f}")
    held = re.search(r"budgets? held ((?:\d+, )*\d+(?: and \d+)?) rounds", told)[1]
    per_call = [int(n) for n in re.findall(r"\d+", held)]
    assert [rounds_of(call) for call in calls_of(log_name)] == per_call
    rounds = sum(per_call)
    assert {len(row.runs) for row in report.values()} == {rounds}
    reported = re.findall(r"unpinned \S+ +(?:native|python) .*?reports=(\d+)", text(log_name))
    assert len(reported) == 2 * 3 * rounds and set(reported) == {"0"}
    (runs,) = re.search(r"`reports=0` in each of the log's (\d+) native and Python runs", told).groups()
    assert int(runs) == len(reported)
    return rounds


def part_of(report_name: str, workload: str) -> str:
    """A report's text of one workload: its table and what follows it, up to the next workload."""
    return text(report_name).split(f"### {workload}:")[1].split("###")[0]


def trace_and_switch(report_name: str, workload: str) -> tuple[str, ...]:
    """A workload's CUDA trace callbacks and switches around callees, measured inside the native runs."""
    return re.search(
        r"CUDA's trace callbacks \(the frees' stacks among them\) ([\d.]+); turning RecordFunction off and on around "
        r"the callees of recorded calls ([\d.]+);",
        part_of(report_name, workload),
    ).groups()


def inside(report_name: str, workload: str) -> list[str]:
    """A workload's parts measured inside the native runs, as its report gives them: over plain,
    recording, stacks, applying, the rest, the calls observed and recorded per step."""
    part = part_of(report_name, workload)
    m = re.search(
        r"recording \(the log's callbacks\) ([\d.]+)(?:, of which stacks|; Python stacks, read in those callbacks "
        r"and at CUDA's frees,) ([\d.]+) .*?\(the drains\) ([\d.]+);.*? the rest of the native path's ([\d.]+) ms over "
        r"plain, .*?clocks leave out(?: \(the stacks read at frees among it\))?, ([\d.]+)\. RecordFunction showed the "
        r"log (\d+) calls per step, (\d+) of them recorded",
        part,
        re.S,
    )
    record, stacks, drains, over, rest, observed, recorded = m.groups()
    return [over, record, stacks, drains, rest, observed, recorded]


# the native path against the bars, as a table's paragraph says it: FSDP2, compiled, MLP, MLP paired
BARS = (
    r"within 1\.3x on the FSDP2-AdamW step \(([\d.]+)x\) and within 1\.5x on the compiled one \(([\d.]+)x\), and is "
    r"above 1\.3x on the AdamW MLP \(([\d.]+)x, paired ([\d.]+)x\)"
)


def check_against_bars(told: str, table: tuple[str, str], after: str) -> tuple[dict, str, str]:
    """That the text `told` of a table of ten rounds or more (check_adamw_call) gives the native
    path's slowdowns against the bars (BARS, then `after`) as its report has them, FSDP2 within
    theirs and the MLP above; the report, the MLP's slowdown and paired ratio."""
    assert check_adamw_call(told, table) >= 10
    report = md_tables(table[0])
    fsdp2, compiled, mlp, mlp_paired = said_in(told, BARS + after)
    assert [fsdp2, compiled, mlp] == [report[(w, "native")].slowdown for w in (*WORKLOADS[1:], WORKLOADS[0])]
    assert float(fsdp2) <= 1.3 and float(compiled) <= 1.5 and float(mlp) > 1.3
    return report, mlp, mlp_paired


def run_seconds(report_name: str) -> dict[tuple[str, str], float]:
    """{(workload, mode): median seconds a run's process took} of a report."""
    took = {}
    for workload in WORKLOADS:
        part = part_of(report_name, workload)
        (line,) = re.findall(r"^A run's process took, from its start to its result \(medians, s\): (.*)\.$", part, re.M)
        took |= {(workload, mode): float(v) for mode, v in re.findall(r"(\w+) ([\d.]+)", line)}
    return took


def calls_alone(log_name: str, workload: str) -> list[tuple[str, str]]:
    """Each call's (slowdown, paired) of the native path on `workload`, from the table the call's
    bench printed at its end."""
    native = r"^\| native \| [\d.]+ \| ([\d.]+)x \| ([\d.]+)x \|"
    return [re.search(native, call.split(f"### {workload}:")[-1], re.M).groups() for call in calls_of(log_name)]


# where the MLP's time went, as a table's paragraph says it: over plain, callbacks, drains, trace, switch, stacks, rest
MLP_PARTS = (
    r"Of the MLP's ([\d.]+) ms a step over plain, measured inside the native runs, the log's callbacks took "
    r"([\d.]+), applying the records ([\d.]+), CUDA's trace callbacks ([\d.]+) and turning RecordFunction off "
    r"and on around callees ([\d.]+) \(the Python stacks, ([\d.]+), read within the callbacks and the trace's "
    r"frees\); the rest, ([\d.]+), is PyTorch's hooks"
)


def check_mlp_parts(told: str, report_name: str, after: str = "") -> tuple[str, ...]:
    """That the text `told` says where the MLP's time went (MLP_PARTS, then `after`) as its report
    measured it inside the native runs; the groups of `after`."""
    said = said_in(told, MLP_PARTS + after)
    over, record, stacks, drains, rest, *_ = inside(report_name, "mlp-adamw")
    trace, switch = trace_and_switch(report_name, "mlp-adamw")
    assert list(said[:7]) == [over, record, drains, trace, switch, stacks, rest]
    return said[7:]


def test_the_twenty_seven_round_h100_adamw_table_is_its_report_within_the_three_bars():
    told = between(
        "The steps users run, as the code at cad0b6f runs them, on one H100", "The same steps, as the code at afc2a75"
    )
    assert check_adamw_call(told, H100_TWENTY_SEVEN_ROUNDS) == 27
    report = md_tables(H100_TWENTY_SEVEN_ROUNDS[0])
    mlp, mlp_paired, fsdp2, fsdp2_paired, compiled, compiled_paired = said_in(
        told,
        r"The native path is within the three bars: ([\d.]+)x on the AdamW MLP \(paired\s+([\d.]+)x\) and ([\d.]+)x on "
        r"the FSDP2-AdamW step \(paired ([\d.]+)x\), within 1\.3x, and ([\d.]+)x on the compiled\s+FSDP2 step "
        r"\(paired ([\d.]+)x\), within 1\.5x",
    )
    said = {
        "mlp-adamw": (mlp, mlp_paired),
        "fsdp2-adamw": (fsdp2, fsdp2_paired),
        "fsdp2-compiled": (compiled, compiled_paired),
    }
    for workload, bar in zip(WORKLOADS, (1.3, 1.3, 1.5), strict=True):
        native = report[(workload, "native")]
        assert said[workload] == (native.slowdown, native.paired) and float(native.slowdown) <= bar, workload
        # the ratio of the medians, unrounded, within the bar too
        assert float(native.median) / float(report[(workload, "plain")].median) <= bar, workload
    # each call alone, from the table its bench printed at its end
    alone = said_in(
        told,
        r"so was each call alone \(the MLP ([\d.]+)x, ([\d.]+)x and ([\d.]+)x, the\s+FSDP2-AdamW step ([\d.]+)x, "
        r"([\d.]+)x and ([\d.]+)x, the compiled step ([\d.]+)x, ([\d.]+)x and ([\d.]+)x;",
    )
    for workload, bar, figures in zip(WORKLOADS, (1.3, 1.3, 1.5), (alone[0:3], alone[3:6], alone[6:9]), strict=True):
        assert [ratio for ratio, _ in calls_alone(H100_TWENTY_SEVEN_ROUNDS[1], workload)] == list(figures)
        assert all(float(ratio) <= bar for ratio in figures), workload
    check_mlp_parts(told, H100_TWENTY_SEVEN_ROUNDS[0])
    over, *_, rest, _, _ = inside(H100_TWENTY_SEVEN_ROUNDS[0], "mlp-adamw")
    # against the twenty-four rounds at c7ce000: the plain MLP runs' spans, what the native path added, the rest
    low, high, low_then, high_then, added, added_then, rest_now, rest_then = said_in(
        told,
        r"This one's plain MLP runs spanned ([\d.]+) to ([\d.]+) ms, that one's ([\d.]+)\s+to ([\d.]+), and the native "
        r"path added ([\d.]+) ms to the MLP's step here against ([\d.]+) there, most of the\s+difference in the rest "
        r"\(([\d.]+) against ([\d.]+)\)",
    )
    then = md_tables(H100_TWENTY_FOUR_ROUNDS[0])
    for (lo, hi), table in (((low, high), report), ((low_then, high_then), then)):
        plain_runs = table[("mlp-adamw", "plain")].runs
        assert (lo, hi) == (f"{min(plain_runs):.2f}", f"{max(plain_runs):.2f}")
    then_over, *_, then_rest, _, _ = inside(H100_TWENTY_FOUR_ROUNDS[0], "mlp-adamw")
    assert (added, rest_now, added_then, rest_then) == (over, rest, then_over, then_rest)
    assert (
        "code at c7ce000 on a busier H100 the MLP at 1.33x" in told and then[("mlp-adamw", "native")].slowdown == "1.33"
    )
    fsdp2_then = md_tables(H200_SIXTEEN_ROUNDS[0])[("fsdp2-adamw", "native")]
    ratio = float(fsdp2_then.median) / float(md_tables(H200_SIXTEEN_ROUNDS[0])[("fsdp2-adamw", "plain")].median)
    assert "the code at afc2a75 on an H200 had the FSDP2-AdamW\nstep at 1.303x".replace("\n", " ") in told
    assert f"{ratio:.3f}" == "1.303"
    # the first call's CUDA tests: each engine's count, none failed, none skipped
    counts = said_in(
        told, r"CUDA tests passed on both engines, (\d+) and (\d+), `reports/gpu/native_tests_adamw_h100_27rounds\.log`"
    )
    check_engine_tests("gpu/native_tests_adamw_h100_27rounds.log")
    tests_log = text("gpu/native_tests_adamw_h100_27rounds.log")
    assert re.findall(r"^(\d+) passed", tests_log, re.M) == list(counts) and "skipped" not in tests_log
    # what a run's process took: the smallest and the largest of the modes' medians
    took = run_seconds(H100_TWENTY_SEVEN_ROUNDS[0])
    low, high = quoted(r"on the H100 below, from ([\d.]+) s a run of the MLP to ([\d.]+) s a sanitizer run")
    assert float(low) == min(took.values()) == min(v for (w, _), v in took.items() if w == "mlp-adamw")
    assert float(high) == max(took.values()) == took[("fsdp2-compiled", "sanitizer")]
    low, high = quoted(r"the sanitizer, ([\d.]+)x to ([\d.]+)x slower in the table below")
    slowdowns = [report[(w, "sanitizer")].slowdown for w in WORKLOADS]
    assert (low, high) == (min(slowdowns, key=float), max(slowdowns, key=float))


def test_the_gpu_counts_of_the_calls_that_made_no_record_are_the_first_reports():
    """Each step's calls a step on the H100 of the twenty-seven rounds, by what became of them, as its
    report's split lines give them; every call counted once."""
    fsdp2 = quoted(
        r"on\s+its H100 the FSDP2 step's (\d+) calls a step were (\d+) recorded, (\d+) callees, (\d+) transparent, "
        r"(\d+)\s+that touch no data and (\d+) the host's own"
    )
    mlp = quoted(r"the MLP's (\d+) were (\d+), (\d+), (\d+), (\d+) and (\d+); on the CPU")
    for workload, figures in (("fsdp2-adamw", fsdp2), ("mlp-adamw", mlp)):
        said = re.search(
            r"RecordFunction showed the log (\d+) calls per step, (\d+) of them recorded, .*? Of the others, "
            r"(\d+) were callees of recorded calls .*?, (\d+) transparent operators .*?, (\d+) operators that touch "
            r"no tensor data .*? and (\d+) the host's own calls",
            part_of(H100_TWENTY_SEVEN_ROUNDS[0], workload),
        ).groups()
        assert said == figures and sum(map(int, said[1:])) == int(said[0]), workload


def test_the_staging_loops_cuda_test_ran_on_the_native_engine_among_those_the_readme_cites():
    """The host-accesses paragraph's GPU test: selected by bench/native_gpu.sh's check, which wrote
    the log the README cites, none of whose tests was skipped."""
    told = between("A pinned block the\nallocator hands out again".replace("\n", " "), "## Beyond one machine")
    assert (
        "`tests/test_detect_cuda.py::test_a_staging_buffers_block_allocated_again_after_its_upload_races_nothing`, "
        "which passed on an H100 with the rest of the CUDA tests of the native engine, none skipped: "
        "`reports/gpu/native_tests_adamw_h100_27rounds.log`" in told
    )
    (selection,) = re.findall(r'^NATIVE_CHECK="(.*)"$', (ROOT / "bench" / "native_gpu.sh").read_text(), re.M)
    tests_log = text("gpu/native_tests_adamw_h100_27rounds.log")
    assert f"-k '{selection}'" in tests_log.splitlines()[0] and "skipped" not in tests_log
    # that selection takes the test (tests/test_gpu_scripts.py asks pytest which tests it selects)
    cuda_tests = (ROOT / "tests" / "test_detect_cuda.py").read_text()
    assert "def test_a_staging_buffers_block_allocated_again_after_its_upload_races_nothing(" in cuda_tests


def test_the_sixteen_round_h200_adamw_table_is_its_report_with_the_fsdp2_step_at_the_bar():
    told = between("The same steps, as the code at afc2a75 runs them, on one H200", "The call before them")
    assert check_adamw_call(told, H200_SIXTEEN_ROUNDS) == 16
    report = md_tables(H200_SIXTEEN_ROUNDS[0])
    mlp, mlp_paired, compiled, compiled_paired, native, plain, ratio, paired = said_in(
        told,
        r"within 1\.3x on the AdamW MLP \(([\d.]+)x, paired ([\d.]+)x\)\s+and within 1\.5x on the compiled FSDP2 "
        r"step \(([\d.]+)x, paired ([\d.]+)x\); on the FSDP2-AdamW step it is\s+at the bar and not within it: "
        r"([\d.]+) ms over ([\d.]+), ([\d.]+)x \(paired ([\d.]+)x\)",
    )
    assert (mlp, mlp_paired) == report[("mlp-adamw", "native")][1:4:2]
    assert (compiled, compiled_paired) == report[("fsdp2-compiled", "native")][1:4:2]
    assert float(mlp) <= 1.3 and float(compiled) <= 1.5
    fsdp2 = report[("fsdp2-adamw", "native")]
    assert (native, plain, paired) == (fsdp2.median, report[("fsdp2-adamw", "plain")].median, fsdp2.paired)
    assert ratio == f"{float(native) / float(plain):.3f}" and float(ratio) > 1.3 and fsdp2.slowdown == "1.30"
    alone = said_in(
        told, r"The two calls alone\s+gave that step ([\d.]+)x and ([\d.]+)x \(paired ([\d.]+)x and ([\d.]+)x;"
    )
    assert calls_alone(H200_SIXTEEN_ROUNDS[1], "fsdp2-adamw") == [alone[0::2], alone[1::2]]
    check_mlp_parts(told, H200_SIXTEEN_ROUNDS[0])
    (asked,) = re.search(r"CUDA was asked (\d+) times", part_of(H200_SIXTEEN_ROUNDS[0], "mlp-adamw")).groups()
    assert asked == "0" and "the sixteen-round table above has the MLP asking 0 times a step" in FLAT


def test_the_h200_call_of_the_hooks_beside_the_mlp_and_of_the_cuda_tests_is_its_report():
    told = between("The call before them on the same machine", "The same steps, as the code at c7ce000")
    assert "`reports/gpu/detector_overhead_native_mlp_hooks_h200.{md,csv,log}`, `_runs.csv`" in told
    native, paired, args, results, recording, applying = said_in(
        told,
        r"the native path\s+([\d.]+)x \(paired ([\d.]+)x\) there, of which, by the differences of the medians, "
        r"RecordFunction taking the\s+calls' arguments ([\d.]+) ms a step, their results ([\d.]+), and recording "
        r"([\d.]+) .*? added nothing measurable \((-[\d.]+)\)",
    )
    report = {mode: row for (_, mode), row in md_tables(MLP_HOOKS_H200[0]).items()}
    assert (native, paired) == (report["native"].slowdown, report["native"].paired)
    (where,) = re.findall(
        r"^Where the native path's [\d.]+ ms per step go \(differences of the medians\): PyTorch's hooks taking the "
        r"calls' arguments ([\d.]+), their results ([\d.]+), recording ([\d.]+), applying the records (-?[\d.]+)\.$",
        text(MLP_HOOKS_H200[0]),
        re.M,
    )
    assert [args, results, recording, applying] == list(where)
    (rounds,) = said_in(told, r"then (\d+) rounds of\s+the MLP beside the hooks")
    assert [rounds_of(call) for call in calls_of(MLP_HOOKS_H200[1])] == [int(rounds)]
    assert {len(row.runs) for row in report.values()} == {int(rounds)}
    # the CUDA tests of that call: each engine's count, and the pinned-memory test among those selected
    counts = said_in(told, r"all passed\s+\((\d+) and (\d+); `reports/gpu/native_tests_mlp_hooks_h200\.log`\)")
    check_engine_tests("gpu/native_tests_mlp_hooks_h200.log")
    assert re.findall(r"^(\d+) passed", text("gpu/native_tests_mlp_hooks_h200.log"), re.M) == list(counts)
    cuda_tests = (ROOT / "tests" / "test_detect_cuda.py").read_text()
    assert "def test_torch_tracker_paths_agree_where_the_log_makes_no_record_of_the_host_own_calls(" in cuda_tests


def test_the_twenty_four_round_h100_adamw_table_is_its_report_with_the_mlp_above_the_bar():
    told = between(
        "The same steps, as the code at c7ce000 runs them, on one H100", "The steps users run, as the code at 74d31de"
    )
    report, mlp, mlp_paired = check_against_bars(
        told, H100_TWENTY_FOUR_ROUNDS, r": on this machine the MLP's bar is not met"
    )
    assert (
        check_adamw_call(told, H100_TWENTY_FOUR_ROUNDS) == 24 and mlp_paired == report[("mlp-adamw", "native")].paired
    )
    # the first call's CUDA tests: each engine's count, none failed
    counts = said_in(
        told, r"passed on both engines \((\d+) and (\d+); `reports/gpu/native_tests_adamw_h100_24rounds\.log`\)"
    )
    check_engine_tests("gpu/native_tests_adamw_h100_24rounds.log")
    assert re.findall(r"^(\d+) passed", text("gpu/native_tests_adamw_h100_24rounds.log"), re.M) == list(counts)
    # what the native path added to the MLP here and on the H200's sixteen rounds, over their plain steps
    over, plain, over_h200, plain_h200, *alone = said_in(
        told,
        r"added ([\d.]+) ms to the MLP's step here, over a plain step of ([\d.]+) ms, against ([\d.]+) ms\s+over "
        r"([\d.]+) on the H200 above, and the three calls alone gave the MLP ([\d.]+)x, ([\d.]+)x and ([\d.]+)x",
    )
    assert (over, plain) == (inside(H100_TWENTY_FOUR_ROUNDS[0], "mlp-adamw")[0], report[("mlp-adamw", "plain")].median)
    sixteen = md_tables(H200_SIXTEEN_ROUNDS[0])
    assert (over_h200, plain_h200) == (
        inside(H200_SIXTEEN_ROUNDS[0], "mlp-adamw")[0],
        sixteen[("mlp-adamw", "plain")].median,
    )
    assert [slowdown for slowdown, _ in calls_alone(H100_TWENTY_FOUR_ROUNDS[1], "mlp-adamw")] == alone


def test_the_thirteen_round_h100_adamw_table_is_its_report_and_where_the_mlps_time_goes():
    told = between(
        "The steps users run, as the code at 74d31de runs them, on one H100", "With the code since (the log reads"
    )
    report, _, mlp_paired = check_against_bars(told, H100_THIRTEEN_ROUNDS, ": on the MLP the bar is not met")
    assert mlp_paired == report[("mlp-adamw", "native")].paired
    assert "`reports/gpu/native_tests_adamw_h100_13rounds.log`" in told
    check_engine_tests("gpu/native_tests_adamw_h100_13rounds.log")
    # where the MLP's time goes, as the report measured it inside the native runs
    calls = check_mlp_parts(
        told,
        H100_THIRTEEN_ROUNDS[0],
        r" \(RecordFunction boxing the arguments and results of each of the (\d+) calls a step it showed the log, "
        r"(\d+) of them recorded\)",
    )
    assert list(calls) == inside(H100_THIRTEEN_ROUNDS[0], "mlp-adamw")[5:]
    # the plain MLP's spread, and each call's ratio alone
    low, high, *alone = said_in(
        told,
        r"native path adds to it \(([\d.]+) to ([\d.]+) ms\), so the MLP's ratio moved with the calls too: ([\d.]+)x, "
        r"([\d.]+)x and ([\d.]+)x in the three calls alone",
    )
    plain = report[("mlp-adamw", "plain")].runs
    assert (low, high) == (f"{min(plain):.2f}", f"{max(plain):.2f}")
    assert alone == [slowdown for slowdown, _ in calls_alone(H100_THIRTEEN_ROUNDS[1], "mlp-adamw")]


MLP_TWELVE_ROUNDS = (
    "gpu/detector_overhead_native_mlp_h100_12rounds.md",
    "gpu/detector_overhead_native_mlp_h100_12rounds.log",
)


def test_the_mlp_call_since_the_lists_read_in_place_and_the_pinned_query_are_their_reports():
    told = between("With the code since (the log reads", "The ten rounds on one H200")
    assert "`reports/gpu/detector_overhead_native_mlp_h100_12rounds.{md,csv,log}`, `_runs.csv`" in told
    report = {mode: row for (_, mode), row in md_tables(MLP_TWELVE_ROUNDS[0]).items()}
    rounds, native, paired, python, sanitizer, plain, plain_before = said_in(
        told,
        r"in one device call of (\d+) rounds .*?: native ([\d.]+)x \(paired ([\d.]+)x\), python ([\d.]+)x, sanitizer "
        r"([\d.]+)x, on a plain step of ([\d.]+) ms, faster than the ([\d.]+) ms above",
    )
    assert [rounds_of(call) for call in calls_of(MLP_TWELVE_ROUNDS[1])] == [int(rounds)]
    assert {len(row.runs) for row in report.values()} == {int(rounds)}
    assert (native, paired) == (report["native"].slowdown, report["native"].paired)
    assert (python, sanitizer, plain) == (
        report["python"].slowdown,
        report["sanitizer"].slowdown,
        report["plain"].median,
    )
    assert plain_before == md_tables(H100_THIRTEEN_ROUNDS[0])[("mlp-adamw", "plain")].median
    over, over_before = said_in(told, r"The native path added ([\d.]+) ms a step there against ([\d.]+) ms above")
    assert over == inside(MLP_TWELVE_ROUNDS[0], "mlp-adamw")[0]
    assert over_before == inside(H100_THIRTEEN_ROUNDS[0], "mlp-adamw")[0]
    runs, ops = said_in(
        told, r"`reports=0` in each of its (\d+) native and Python runs, (\d+) operators applied in each"
    )
    applied = re.findall(
        r"unpinned mlp-adamw +(?:native|python) .*?reports=(\d+) \S+ ops=(\d+)", text(MLP_TWELVE_ROUNDS[1])
    )
    assert len(applied) == int(runs) == 2 * int(rounds) and set(applied) == {("0", ops)}
    check_engine_tests("gpu/native_tests_mlp_h100_12rounds.log")
    # the pinned query, and the log's callbacks it is part of
    (query,) = said_in(told, r"whether host memory is pinned costs ([\d.]+) us a query")
    (measured,) = re.findall(r"^pageable: .*, the query ([\d.]+) us$", text("gpu/pinned_query_h100.log"), re.M)
    assert query == measured
    (callbacks,) = said_in(told, r"about 0\.06 ms of the log's callbacks' ([\d.]+) ms there")
    assert callbacks == inside(MLP_TWELVE_ROUNDS[0], "mlp-adamw")[1]
    assert round(50 * float(query) / 1e3, 2) == 0.06


def test_the_ten_round_h200_adamw_table_is_its_report_and_where_the_mlps_time_goes():
    told = between("The ten rounds on one H200", "With the code since the log makes no record")
    report, mlp, mlp_paired = check_against_bars(told, H200_TEN_ROUNDS, r"\.")
    assert f"| AdamW (foreach) | unpinned, 10 | {report[('mlp-adamw', 'plain')].median} |" in told
    assert f"({mlp}x, paired {mlp_paired}x)" in told
    said = said_in(
        told,
        r"Of the MLP's ([\d.]+) ms a step over plain, measured inside the native runs, recording took ([\d.]+) "
        r"\(its report's \"of which stacks ([\d.]+)\" counts the stacks read at CUDA's frees too, outside the "
        r"callbacks\) and applying the records ([\d.]+); the rest, ([\d.]+), is PyTorch's hooks "
        r"\(RecordFunction boxing the arguments of each of the (\d+) calls a step it showed the log, (\d+) of them "
        r"recorded\)",
    )
    assert list(said) == inside(H200_TEN_ROUNDS[0], "mlp-adamw")


HOST_ONLY = (
    "gpu/detector_overhead_native_host_only_h100.md",
    "gpu/detector_overhead_native_host_only_h100.log",
)
HOST_ONLY_CALL1 = "gpu/detector_overhead_native_host_only_h100_call1.md"


def test_the_h100_mlp_calls_since_the_host_own_calls_are_their_reports():
    told = between("With the code since the log makes no record", "The same tracker on one H100")
    assert "`reports/gpu/detector_overhead_native_host_only_h100.{md,csv,log}`, `_runs.csv`" in told
    merged, first = (
        {mode: row for (_, mode), row in md_tables(name).items()} for name in (HOST_ONLY[0], HOST_ONLY_CALL1)
    )
    native, paired, rounds, python, sanitizer, plain, low, high, recorded, ops, runs = re.search(
        r"the native path ([\d.]+)x \(paired ([\d.]+)x\) over (\d+) rounds, python ([\d.]+)x, sanitizer ([\d.]+)x, "
        r"on a plain step of ([\d.]+) ms whose runs spanned ([\d.]+) to ([\d.]+) ms; (\d+) calls a step recorded, and "
        r"(\d+) operators applied in each of the (\d+) native and Python runs alike, none of which reported",
        told,
    ).groups()
    assert (native, paired) == (merged["native"].slowdown, merged["native"].paired)
    assert plain == merged["plain"].median
    assert (python, sanitizer) == (merged["python"].slowdown, merged["sanitizer"].slowdown)
    assert [rounds_of(call) for call in calls_of(HOST_ONLY[1])] == [10, 10] and int(rounds) == 20
    assert (low, high) == (f"{min(merged['plain'].runs):.2f}", f"{max(merged['plain'].runs):.2f}")
    assert recorded == inside(HOST_ONLY[0], "mlp-adamw")[6]
    before = inside(H200_TEN_ROUNDS[0], "mlp-adamw")[6]
    assert f"{int(before) - int(recorded)} of the {before} calls a step it recorded" in told
    applied = re.findall(r"unpinned mlp-adamw +(?:native|python) .*?reports=(\d+) \S+ ops=(\d+)", text(HOST_ONLY[1]))
    assert len(applied) == int(runs) == 2 * 20 and set(applied) == {("0", ops)}
    # the first call's hooks, side by side with the native path
    args_x, args_paired, results_x, results_paired = re.search(
        r"RecordFunction taking the calls' arguments ([\d.]+)x \(paired ([\d.]+)x\), their results too ([\d.]+)x "
        r"\(paired ([\d.]+)x\)",
        told,
    ).groups()
    assert (args_x, args_paired) == (first["native_hooks_args"].slowdown, first["native_hooks_args"].paired)
    assert (results_x, results_paired) == (first["native_hooks"].slowdown, first["native_hooks"].paired)
    split = re.search(
        r"Of the native path's ([\d.]+) ms a step over plain in that call, the arguments took ([\d.]+), the results "
        r"([\d.]+), and recording and applying the records ([\d.]+) \(inside the runs: the callbacks ([\d.]+), the "
        r"drains ([\d.]+)\)",
        told,
    ).groups()
    said = re.search(
        r"Where the native path's ([\d.]+) ms per step go .*?arguments ([\d.]+), their results ([\d.]+), recording and "
        r"applying the records ([\d.]+)\.",
        text(HOST_ONLY_CALL1),
    ).groups()
    over, record, _, drains, *_ = inside(HOST_ONLY_CALL1, "mlp-adamw")
    assert list(split) == [*said, record, drains] and over == said[0]
    check_engine_tests("gpu/native_tests_host_only_h100.log")


def test_the_h100_adamw_table_is_its_report_and_no_run_reported():
    told = between("The same tracker on one H100", "The same steps on one H200")
    check_adamw_call(told, H100_CALL)
    now, h100, before = (md_tables(call[0]) for call in (H200_TEN_ROUNDS, H100_CALL, H200_BEFORE))
    (above,) = re.search(r"above 1\.3x there too \(([\d.]+)x, paired [\d.]+x\)", told).groups()
    assert above == h100[("mlp-adamw", "native")][1]
    plain = re.search(
        r"the plain MLP ([\d.]+) ms on the H200 above, ([\d.]+) on this H100, ([\d.]+) on the H200 below; the\s+"
        r"plain FSDP2 step ([\d.]+), ([\d.]+) and ([\d.]+) ms\)",
        told,
    ).groups()
    assert list(plain) == [t[(w, "plain")][0] for w in ("mlp-adamw", "fsdp2-adamw") for t in (now, h100, before)]
    # Dynamo's warning about compiling the tracker's own frames: once a compiled Python run before, none since
    (warned,) = re.search(r"recompile-limit warning on the tracker's `__torch_dispatch__` (\d+) times", told).groups()
    old = text(H200_BEFORE[1])
    before_warnings = re.findall(r"recompile_limit.*\n.*function: '__torch_dispatch__'", old)
    assert len(before_warnings) == int(warned) == len(re.findall(r"unpinned fsdp2-compiled +python", old))
    for since in (H100_CALL[1], H200_TEN_ROUNDS[1]):
        assert "recompile_limit" not in text(since) and "racecheck/" not in text(since)
    tests = text("gpu/native_tests_h100.log")
    engines = re.findall(r"## (native|python) engine\n.*?\n(\d+) passed(.*?) in ", tests, re.S)
    assert [e for e, *_ in engines] == ["native", "python"]
    assert all("failed" not in rest and "error" not in rest for *_, rest in engines)


def test_a_rounds_seconds_are_the_calls_logs():
    """A round's time: from the bench part's start to the call's end, over the call's rounds."""
    now, sixteen, thirteen, ten, h100, before = (
        int(s) for s in quoted(
            r"A round took (\d+) s on\s+the H100 of the table below \(its first call\), (\d+) s on the H200 of the "
            r"sixteen-round table after it\s+\(its first call\), (\d+) s on the H100 of the thirteen-round table after "
            r"that \(its first call\), (\d+) s\s+on the H200 of the ten-round table after that \(its first call\), "
            r"(\d+) s on the H100 after those and (\d+) s on the H200 of the code before"
        )
    )  # fmt: skip
    tables = (
        (H100_TWENTY_SEVEN_ROUNDS, now), (H200_SIXTEEN_ROUNDS, sixteen), (H100_THIRTEEN_ROUNDS, thirteen),
        (H200_TEN_ROUNDS, ten), (H100_CALL, h100), (H200_BEFORE, before),
    )  # fmt: skip
    for table, said in tables:
        log = calls_of(table[1])[0]
        (began,) = re.findall(r"^== bench \S+ \((\d+) s\)$", log, re.M)
        (ended,) = re.findall(r"^== done \S+ \((\d+) s\) rc 0$", log, re.M)
        assert round((int(ended) - int(began)) / rounds_of(log)) == said, table


def test_the_h200_adamw_table_is_its_report_and_no_run_reported():
    told = between("The same steps on one H200", "The call before it (4 rounds")
    check_adamw_call(told, H200_BEFORE)
    before = re.findall(
        r"unpinned (fsdp2\S*) +native .*?reports=(\d+)", text("gpu/detector_overhead_native_adamw_unpinned_4rounds.log")
    )
    assert before and {n for _, n in before} == {"10"}  # the fault the README tells of
    mlp, fsdp2 = quoted(r"came to ([\d.]+) ms per MLP step and ([\d.]+)\s+ms per FSDP2 step")
    parts = re.findall(r"clocks leave out, ([\d.]+)\.", text(H200_BEFORE[0]))
    assert parts[:2] == [mlp, fsdp2]


def test_the_pinned_calls_rounds_are_the_runs_csv_and_the_log():
    first, second, long, short = quoted(
        r"ran one warm-up round and its (\d+) measured rounds within its time limit; the second, of the four modes "
        r"on both steps, was cut by its time limit after (\d+) rounds\. The pinned FSDP2 step's plain and native "
        r"medians are therefore of (\d+) runs, the other pinned medians below of (\d+):"
    )
    repeats = defaultdict(set)
    for r in rows("gpu/detector_overhead_native_sgd_pinned_runs.csv"):
        repeats[r["call"]].add(int(r["repeat"]))
    assert repeats["1"] == {-1, *range(int(first))} and repeats["2"] == set(range(int(second)))
    call1, call2 = text("gpu/detector_overhead_native_sgd_pinned.log").split("## call 2", 1)
    assert "== done" in call1 and "rc 0" in call1 and "== done" not in call2  # the second was cut
    runs = md_tables("gpu/detector_overhead_native_sgd_pinned.md")
    assert len(runs[("fsdp2", "plain")][2]) == len(runs[("fsdp2", "native")][2]) == int(long)
    assert {len(runs[(w, m)][2]) for w in ("mlp", "fsdp2") for m in ("python", "sanitizer")} == {int(short)}
    assert {len(runs[("mlp", m)][2]) for m in ("plain", "native")} == {int(short)}


def test_the_native_paths_spread_and_parts_are_its_reports():
    low, high = quoted(r"the plain FSDP2 step's runs spanned ([\d.]+) to ([\d.]+) ms\)")
    spread = md_tables("gpu/detector_overhead_native_unpinned.md")[("fsdp2", "plain")][2]
    assert (float(low), float(high)) == (min(spread), max(spread))
    within, of, low, high = quoted(r"\((\d+) of its (\d+) runs between ([\d.]+) and ([\d.]+) ms\)")
    steady = md_tables("gpu/detector_overhead_native_sgd_pinned.md")[("fsdp2", "plain")][2]
    assert (int(within), int(of)) == (sum(float(low) <= v <= float(high) for v in steady), len(steady))
    report = text("gpu/detector_overhead_native_sgd_pinned.md").split("## fsdp2", 1)[1]
    figures = quoted(
        r"Where the pinned FSDP2 step's ([\d.]+) ms went .*? recording nothing\) ([\d.]+) ms, recording ([\d.]+), "
        r"applying the records ([\d.]+); measured inside each native run, the log's C\+\+ callbacks took ([\d.]+) ms "
        r"per step \(taking the GIL back to read a stack ([\d.]+), walking (\d+) stacks ([\d.]+)\) and the drains "
        r"([\d.]+) ms\."
    )
    assert [f for f in figures if not appears(f, report)] == []
    (drains,) = quoted(r"the drains took ([\d.]+) ms per pinned FSDP2 step of width 1024")
    assert drains == figures[-1]
    low, high = quoted(r"On the H200 machine that took (\d+) to (\d+) s \(the `build:` lines")
    logs = text("gpu/detector_overhead_native_sgd_pinned.log") + text("gpu/detector_overhead_native_unpinned.log")
    builds = [int(s) for s in re.findall(r"^build: (\d+) s wall$", logs, re.M)]
    assert (int(low), int(high)) == (min(builds), max(builds))


# -- code that is not racecheck's --------------------------------------------------------------------
def test_the_plain_torch_and_megatron_rows_are_the_foreign_code_csv():
    natural, hit, of, rand, runs, first, last, k_low, k_high, det, det_of = quoted(
        r"\| six plain-torch patterns \(`overlap.py`\), `race` \| 0/(\d+) test runs \| (\d+)/(\d+), each under its "
        r"profile .*? \| (\d+)/(\d+) test runs \| every race found in trial (\d+) to (\d+), within k = (\d+) to "
        r"(\d+) \| (\d+)/(\d+) reported \|"
    )
    assert total(per_test("plain_torch", "race", "natural"), "trials") == int(natural)
    profiles = per_test("plain_torch", "race", "profile:")
    assert (total(profiles, "failures"), total(profiles, "trials")) == (int(hit), int(of))
    random = per_test("plain_torch", "race", "random")
    assert (total(random, "failures"), total(random, "trials")) == (int(rand), int(runs))
    bounds = [b for b in rows("gpu/foreign_code_bounds.csv") if b["suite"] == "plain_torch" and b["arm"] == "race"]
    assert (min(int(b["first"]) for b in bounds), max(int(b["first"]) for b in bounds)) == (int(first), int(last))
    assert (min(int(b["k"]) for b in bounds), max(int(b["k"]) for b in bounds)) == (int(k_low), int(k_high))
    assert all(int(b["first"]) <= int(b["k"]) for b in bounds)
    detect = per_test("plain_torch", "race", "detect")
    assert (total(detect, "detected"), total(detect, "trials")) == (int(det), int(det_of))
    correct = quoted(r"\| the same, `correct` \| 0/(\d+) \| 0/(\d+) \| 0/(\d+) \| 0/(\d+) \| 0/(\d+) \|")
    for mode, trials in zip(("natural", "profile:", "random", "systematic", "detect"), correct, strict=True):
        found = per_test("plain_torch", "correct", mode)
        assert (total(found, "failures"), total(found, "trials")) == (0, int(trials)), mode
    runs, hit, of, hit_runs, runs_of, first, k = quoted(
        r"\| megatron-fsdp 0.6.1, `asis` \| 0/(\d+) test runs \| (\d+)/(\d+) \((\d+)/(\d+) test runs\) under "
        r"`sleep@before_reduce_scatter:5ms` \| \| one parametrization: first failure in trial (\d+) of k = (\d+)"
    )
    assert total(per_test("megatron_fsdp", "asis", "natural"), "trials") == int(runs)
    row = foreign("megatron_fsdp", "asis", "profile:sleep@before_reduce_scatter:5ms")
    assert (row["failures"], row["trials"]) == (hit, of)
    profiled = per_test("megatron_fsdp", "asis", "profile:")
    assert (total(profiled, "failures"), total(profiled, "trials")) == (int(hit_runs), int(runs_of))
    bound = {b["arm"]: b for b in rows("gpu/foreign_code_bounds.csv") if b["suite"] == "megatron_fsdp"}
    assert (bound["asis"]["first"], bound["asis"]["k"]) == (first, k)
    natural, profile, systematic, up_to, k, detect = quoted(
        r"\| the same, `fixed` \| 0/(\d+) \| 0/(\d+) \| \| 0/(\d+) \(trials 1\.\.(\d+) of k = (\d+) points\) \| "
        r"0/(\d+) \|"
    )
    assert total(per_test("megatron_fsdp", "fixed", "natural"), "trials") == int(natural)
    for mode, trials in (("profile:sleep@before_reduce_scatter:5ms", profile), ("systematic", systematic)):
        assert (
            foreign("megatron_fsdp", "fixed", mode)["failures"],
            foreign("megatron_fsdp", "fixed", mode)["trials"],
        ) == ("0", trials)
    assert foreign("megatron_fsdp", "fixed", "detect")["trials"] == detect and bound["fixed"]["k"] == k
    assert int(up_to) == int(systematic) - 1  # trial 0 records the points, trials 1.. delay them


def test_the_fsdp2_row_is_the_foreign_code_csv_and_the_before_after_csv():
    test = "test_every_parameter_matches_the_replica[False]"
    mine = {arm: [r for r in FOREIGN if r["suite"] == "fsdp2" and r["case"] == test and r["arm"] == arm]
            for arm in ("bf16", "fp32")}  # fmt: skip
    assert all(r["failures"] == "0" for rs in mine.values() for r in rs)
    delays, trials, allocator = quoted(
        r"under each named delay profile \(((?:`\w+`, )+`\w+`): (\d+) trials\) and under `pressure` and `poison` "
        r"\((\d+) trials\)"
    )
    for arm, found in mine.items():
        by_mode = {r["mode"]: int(r["trials"]) for r in found}
        assert {by_mode[f"profile:{name}"] for name in re.findall(r"`(\w+)`", delays)} == {int(trials)}, arm
        assert {by_mode["profile:pressure"], by_mode["profile:poison"]} == {int(allocator)}, arm
    pairs = {arm: {r["mode"]: int(r["trials"]) for r in found if re.search(r",(pressure|poison)@free", r["mode"])}
             for arm, found in mine.items()}  # fmt: skip
    low, high = quoted(r"joined with `pressure@free` and with `poison@free` \((\d+) to (\d+) trials each\)")
    points = r"(stream_enter|stream_wait|before_stream_wait|event_record):3ms|before_\w+:5ms"
    counted = [n for p in pairs.values() for mode, n in p.items() if re.search(rf"sleep@(?:{points}),", mode)]
    assert (min(counted), max(counted)) == (int(low), int(high)) and len(counted) == 2 * 2 * (4 + 3)
    (poisoned,) = quoted(r"under `sleep@after_event_record:3ms,poison@free` \((\d+) trials\)")
    early = "profile:sleep@after_event_record:3ms,{}@free"
    assert {p[early.format("poison") + " (seed 100)"] for p in pairs.values()} == {int(poisoned)}
    (pressed,) = quoted(r"in `bf16` only, `sleep@after_event_record:3ms,pressure@free` \((\d+) trials\)")
    assert pairs["bf16"][early.format("pressure")] == int(pressed) and early.format("pressure") not in pairs["fp32"]
    figures = quoted(
        r"with `pressure@free` \(0/(\d+) / 0/(\d+) trials\) and with `poison@free` \(0/(\d+) / 0/(\d+); two calls, "
        r"`reports/gpu/verdicts/fsdp2_before_after.csv`\)"
    )
    sums = defaultdict(int)
    for r in rows("gpu/verdicts/fsdp2_before_after.csv"):
        assert r["failures"] == "0"
        if r["racecheck"] == "this round":
            sums[(r["profile"].rsplit(",", 1)[1], r["arm"])] += int(r["trials"])
    assert figures == tuple(str(sums[(a, arm)]) for a in ("pressure@free", "poison@free") for arm in ("bf16", "fp32"))


def test_the_fsdp2_rows_other_columns_are_the_csv_and_the_log():
    rand_bf16, rand_fp32 = quoted(r"\| 0/(\d+) / 0/(\d+) \(seeds 0 and 100\) \|")
    for arm, want in (("bf16", rand_bf16), ("fp32", rand_fp32)):
        seeds = [foreign("fsdp2", arm, mode) for mode in ("random", "random (seed 100)")]
        assert (total(seeds, "failures"), total(seeds, "trials")) == (0, int(want))
    bf16, fp32, k_false, k_true = quoted(
        r"\| 0/(\d+) / 0/(\d+): every single point covered \(k = (\d+) and (\d+) per test\)"
    )
    bounds = [b for b in rows("gpu/foreign_code_bounds.csv") if b["suite"] == "fsdp2"]
    assert sorted({int(b["k"]) for b in bounds}) == [int(k_false), int(k_true)]
    for arm, want in (("bf16", bf16), ("fp32", fp32)):
        assert foreign("fsdp2", arm, "systematic")["trials"] == want
        assert all(int(b["trials"]) >= int(b["k"]) + 1 for b in bounds if b["arm"] == arm)  # every point once
    bf16, fp32, runs = quoted(
        r"\| 0/(\d+) / 0/(\d+), with the MLP-block suite \(`test_fully_shard.py`\) in the same trials: 0 reports in "
        r"(\d+) test runs \|"
    )
    assert [foreign("fsdp2", arm, "detect")["trials"] for arm in ("bf16", "fp32")] == [bf16, fp32]
    log = text("gpu/verdicts/foreign_code_2026-12-02.log").split("### fsdp2.detect.", 1)[1].split("###", 1)[0]
    cells = re.findall(r"^  test_\S+\s+bf16 (\d+)/(\d+)\s+fp32 (\d+)/(\d+)$", log, re.M)
    assert sum(int(c[1]) + int(c[3]) for c in cells) == int(runs) and "reported in 0/10" in log


def test_the_generated_programs_and_the_soundness_check_are_their_csv():
    profiles_trials, profiles, detect = quoted(
        r"\| 0/(\d+) under each of (\d+) profiles \(every patch-mode profile, every pair, `random`\) \| \| \| "
        r"0/(\d+) \|"
    )
    found, of, reported, happened = quoted(
        r"\| (\d+)/(\d+) of those one delayed point must expose found within k \| (\d+)/(\d+) reported where the race "
        r"happened \|"
    )
    sound = rows("gpu/verdicts/soundness_x1.csv")
    key = lambda r: tuple(r.values())  # noqa: E731
    assert sorted(sound, key=key) == sorted((r for r in FOREIGN if r["suite"] == "generated"), key=key)
    correct = [r for r in sound if r["case"] == "correct" and r["mode"].startswith("profile:")]
    assert len(correct) == int(profiles) and {r["trials"] for r in correct} == {profiles_trials}
    assert all(r["failures"] == "0" for r in sound if r["expect"] == "safe")
    (plain,) = [r for r in sound if r["case"] == "correct" and r["mode"] == "detect"]
    assert (plain["trials"], plain["detected"]) == (detect, "0")
    (systematic,) = [r for r in sound if r["mode"] == "systematic"]
    assert (systematic["failures"], systematic["trials"]) == (found, of)
    racy = [r for r in sound if r["expect"] == "race" and r["mode"] == "detect"]
    assert (total(racy, "detected"), total(racy, "trials")) == (int(reported), int(happened))
    programs, profiles_again, reported2, happened2, found2, of2 = quoted(
        r"`reports/gpu/verdicts/soundness_x1.csv`\): (\d+) correct programs, 0 failures under each of (\d+) profiles "
        r"and 0 reports; (\d+) of (\d+) racy programs whose race happened reported, (\d+) of (\d+) found"
    )
    assert (programs, profiles_again) == (profiles_trials, profiles)
    assert (reported2, happened2, found2, of2) == (reported, happened, found, of)
    hit, of, clean = quoted(
        r"`examples/plain_torch`'s host-statistics pattern: (\d+)/(\d+) reported, its correct version 0/(\d+)\)"
    )
    race = foreign("plain_torch", "race", "detect", case="test_host_statistics")
    assert (race["detected"], race["trials"]) == (hit, of)
    correct = foreign("plain_torch", "correct", "detect", case="test_host_statistics")
    assert (correct["detected"], correct["trials"]) == ("0", clean)


def test_the_last_rounds_gpu_logs_say_what_the_readme_says():
    before_p, of_p, before_q, of_q, now_p, of_np, now_q, of_nq = quoted(
        r"racecheck before this change fails it (\d+)/(\d+) under `sleep@stream_enter:3ms,sleep@stream_wait:3ms,"
        r"pressure@free` and (\d+)/(\d+) with `poison@free`; now (\d+)/(\d+) and (\d+)/(\d+),"
    )
    said = re.findall(
        r"(pressure|poison)@free: (\d+)/(\d+) trials failed", text("gpu/verdicts/fsdp2_free_before_wait.log")
    )
    assert said == [("pressure", before_p, of_p), ("poison", before_q, of_q), ("pressure", now_p, of_np),
                    ("poison", now_q, of_nq)]  # fmt: skip
    race, of, safe = quoted(
        r"every race arm (\d+)/(\d+) under its profile, every safe arm 0/(\d+) "
        r"\(`reports/gpu/verdicts/catalogue_x1_2026-12-02.log`\)"
    )
    log = text("gpu/verdicts/catalogue_x1_2026-12-02.log")
    assert set(re.findall(r"\(race\)\s+(\d+/\d+) failed", log)) == {f"{race}/{of}"}
    assert set(re.findall(r"\(safe\)\s+(\d+/\d+) \(", log)) == {f"0/{safe}"}
    passed, skipped = quoted(r"the CUDA tests (\d+) passed, (\d+) skipped \(needs 2 GPUs\)")
    assert f"{passed} passed, {skipped} skipped" in text("gpu/verdicts/cuda_tests_x1_2026-12-02.log")
    second, fourth = quoted(r"(\d+) passed in the second call \(patch mode .*? (\d+) passed in the fourth")
    assert re.search(rf"^{second} passed", text("gpu/modern_code_partial_call2.log"), re.M)
    assert re.search(rf"^{fourth} passed", text("gpu/modern_code_cuda_tests_call4.log"), re.M)
    alone, of = quoted(r"with `enter_delay` alone drop_early\s+failed (\d+)/(\d+)")
    beside = "compiled.profile-enter_delay.test_side_streams-test_fsdp2_compiled.drop_early"
    assert f"{beside}: exit 0" in text("gpu/modern_code_call3.log")
    (before,) = quoted(r"reported the first test of every run of the safe arms \((\d+)/10\)")
    call3 = text("gpu/modern_code_call3.log")
    assert re.search(rf"\| fixed \| safe \| 0/10 \| .* \| {before}/10 \| 0/10 \|", call3)
    assert re.search(rf"\| drop_early \| race \| 0/10 \| {alone}/{of} ", call3)
    assert re.search(rf"\| drop_early \| race \| 0/10 \| {alone}/{of} ", text("gpu/modern_code_call3_alone.log"))
    assert "enter_delay,poison" in text("gpu/modern_code_call4.log")
    kinds = re.findall(r"^record kinds Counter\((\{.*\})\)$", text("gpu/native_first_tracker_debug.log"), re.M)
    trace_kinds = {"5", "6", "7", "8", "9", "10", "11", "12"}  # feed_apply.py: ALLOCATED .. EVENT_SYNCED
    assert len(kinds) == 4 and not any(set(re.findall(r"(\d+):", k)) & trace_kinds for k in kinds)
    figures = quoted(
        r"megatron-fsdp 0.6.1 \((\d+) trials, (\d+) detected on each path\), PyTorch's FSDP2 \((\d+), none\) and the "
        r"soundness check's generated programs\s+\(every row equal\); plain_torch ran on the native path only, for "
        r"want of device time. \(That call\s+also compared (\d+) catalogue trials"
    )
    compared = {
        m[0]: m[1:]
        for m in re.findall(r"^\| `(\S+)` \| (\d+) \| (\d+) \| (\d+) / (\d+) \|$", text("gpu/paths_compare.md"), re.M)
    }
    mega, fsdp2, cat = (compared[k] for k in ("examples/runs/megatron_fsdp.detect.test_hsdp",
                        "examples/runs/fsdp2.detect.test_fully_shard-test_transformer", "catalogue"))  # fmt: skip
    assert figures == (mega[0], mega[2], fsdp2[0], cat[0])
    assert all(v[0] == v[1] and v[2] == v[3] for v in compared.values()) and fsdp2[2] == "0"


def test_the_figures_quoted_from_the_gpu_readme_are_there():
    report = text("gpu/README.md")
    figures = [
        *quoted(r"from ([\d.]+)x to ([\d.]+)x \(`reports/gpu/README.md`\)"),
        *quoted(r"racecheck.fsdp matches the single-process reference in (\d+) of (\d+) parity cases"),
        *quoted(
            r"it runs a ([\d.]+)M-parameter transformer in ([\d.]+) ms per step against FSDP2's ([\d.]+) ms in the "
            r"same run, peak memory ([\d.]+) vs ([\d.]+) GiB"
        ),
        *quoted(
            r"at ([\d.]+)x the plain step time against the sanitizer's ([\d.]+)x on one H200 \(medians of (\d+) runs, "
            r"side by side: a ratio of ([\d.]+), ([\d.]+) to ([\d.]+) from one repeat to the next, under the target of "
            r"a third in every repeat; an empty TorchDispatchMode alone costs ([\d.]+)x\)"
        ),
        *quoted(r"in pure Python the same runs give ([\d.]+)x, a ratio of ([\d.]+)\."),
        *quoted(r"\((\d+) s on 2 x H200, `reports/gpu/README.md`\)"),
        *quoted(r"the detector's overhead \(([\d.]+) and ([\d.]+) s there\)"),
    ]
    assert [f for f in figures if not appears(f, report)] == []
    assert "5 repeats" in report and rounds_to("0.26", 3.07 / 11.94)


def test_the_host_alias_tests_passed_on_a_gpu_and_failed_with_the_logs_fix_undone():
    told = between("A pinned buffer stays tracked until the last storage", "## Beyond one machine")
    assert "on an H100, `reports/gpu/native_tests_host_aliases_h100.log`" in told
    log = text("gpu/native_tests_host_aliases_h100.log")
    call1, call2, call3 = re.split(r"^## call \d.*$", log, flags=re.M)[1:]
    # both engines passed the alias programs, with no failure
    assert re.findall(r"^## RACECHECK_DETECT_ENGINE=(\w+)\n.*?^(\d+) passed, \d+ deselected", call1, re.M | re.S) == [
        ("native", "5"),
        ("python", "5"),
    ]
    assert "failed" not in call1 and "failed" in call2
    # the program that makes the log drain first: passed as committed, failed with the log's fix undone
    committed, undone = re.findall(r"^(\d+) (passed|failed), \d+ deselected", call3.split("## as committed")[1], re.M)
    assert committed == ("2", "passed") and undone == ("2", "failed")
