"""The README's figures against the files they come from, on the CPU side (the GPU's reports:
test_readme_gpu_figures.py). A figure is either generated from a committed file by a script (the
benchmark table, the modern-code table, the suite's recorded runs), and here compared with what
that script gives now, or quoted with the report it comes from, and here compared with that
report: the hostile probe's totals, the probes of run folders, the main job's times and output,
the native engine's replays and instruction counts. Reads files only; runs nothing."""

from __future__ import annotations

import argparse
import re
import statistics

from readme_kit import FLAT, README, REPORTS, ROOT, appears, bench, quoted, rounds_to, rows, text

from racecheck.suites.catalogue import find_catalogue, load_catalogue


def block(start: str, end: str) -> list[str]:
    """The README's lines between two markers."""
    return README.split(start, 1)[1].split(end, 1)[0].strip("\n").split("\n")


# -- generated: the README holds what the script makes of the committed files ------------------------
def test_the_benchmark_table_is_what_bench_catalogue_sh_makes_of_the_committed_csvs():
    ct = bench("catalogue_table")
    script = (ROOT / "bench" / "catalogue.sh").read_text()
    gpu = re.search(r"^gpu=(\S+)$", script, re.M).group(1)
    given = dict(re.findall(r"(\w+)=(reports/\S+?\.csv)", script))
    given.update({name: f"{gpu}_{part}.csv" for name, part in re.findall(r'(\w+)=\$gpu"_(\w+)\.csv"', script)})
    assert set(given) == set(ct.TOOLS), given
    star = {name: ct.star_rows(ROOT / path) for name, path in given.items() if (ROOT / path).exists()}
    scenarios = load_catalogue(find_catalogue(str(ROOT / "scenarios")))
    assert block(ct.START, ct.END) == ct.benchmark(star, scenarios, gpu_ranks=1)


def test_the_modern_code_table_is_what_bench_modern_code_py_makes_of_its_committed_csv():
    mc = bench("modern_code")
    bounds = {
        (r["suite"], r["case"], r["arm"]): {
            "k": int(r["k"]),
            "trials": int(r["trials"]),
            "first": int(r["first"]) if r["first"] else None,
        }
        for r in rows("gpu/modern_code_bounds.csv")
    }
    assert block(mc.START, mc.END) == mc.summary(rows("gpu/modern_code.csv"), bounds)


# The runs behind the README's detector-overhead table (the call it names before the table).
OVERHEAD_RUNS = ("gpu/detector_overhead_native_runs.csv",)


def test_the_detector_overhead_table_is_what_bench_detector_overhead_native_py_makes_of_its_runs():
    tables, workloads = bench("overhead_tables"), bench("overhead_workloads")
    parser = argparse.ArgumentParser()
    workloads.add_workload_options(parser)  # the benchmark's default sizes, which those runs had
    runs = tables.read_runs([REPORTS / name for name in OVERHEAD_RUNS])
    assert block(tables.README_START, tables.README_END) == tables.readme_table(runs, parser.parse_args([]))
    assert all(f"`reports/{name.removesuffix('_runs.csv')}" in FLAT for name in OVERHEAD_RUNS)


def test_the_suites_times_and_counts_are_what_bench_suite_runs_py_makes_of_its_csv():
    sr = bench("suite_runs")
    assert "\n".join(block(sr.START, sr.END)) == sr.paragraph(sr.read_rows(REPORTS / "suite_runs.csv"))


# -- quoted with their report ----------------------------------------------------------------------
def test_the_hostile_probes_totals_are_its_reports_and_its_logs():
    held, count, *kinds = quoted(
        r"On the 2-core CPU machine (\d+) of (\d+) cases held \(`reports/hostile_inputs.md`, one line per case in "
        r"`reports/hostile_inputs.log`\): options (\d+), configs (\d+), run folders (\d+), faulty suites (\d+), "
        r"disks (\d+), signals (\d+), concurrency (\d+), everyday use (\d+)\."
    )
    report = text("hostile_inputs.md")
    table = dict(re.findall(r"^\| ([a-z ]+) \| (\d+) \| \d+ \|$", report, re.M))
    names = ("options", "configs", "run folders", "faulty suites", "disks", "signals", "concurrency", "everyday use")
    assert kinds == [table[n] for n in names]
    assert f"{held} of {count} cases held." in report and re.search(rf"^\| all \| {count} \| {held} \|$", report, re.M)
    lines = text("hostile_inputs.log").splitlines()
    cases = [line for line in lines if not line.startswith("#")]
    assert len(cases) == int(count) and sum(line.startswith("held: ") for line in cases) == int(held)
    per_kind = {n: sum(line.split(": ", 2)[1] == n for line in cases) for n in names}
    assert [str(per_kind[n]) for n in names] == kinds
    assert lines[-1] == f"# {held} of {count} cases held"


def test_the_folder_probes_totals_are_their_reports():
    tries, of = quoted(r"each ended with one winner and the other refused in (\d+) of (\d+) tries")
    report = text("folder_races.md")
    assert report.count(f"| {tries}/{of} |") == 2  # the merges' row and the runs' row
    handled, cases = quoted(r"(\d+) of (\d+) spoiled run folders and unusable folder names")
    assert f"{handled} of {cases} cases handled" in text("bad_run_folders.md")


def test_the_main_jobs_times_are_its_reports():
    (h200,) = quoted(r"the main job runs at one rank in ([\d.]+) s, `reports/gpu/front_door_x1.log`")
    wall = re.search(r"^wall ([\d.]+) s$", text("gpu/front_door_x1.log"), re.M).group(1)
    assert rounds_to(h200, float(wall))
    low, high, median = quoted(
        r"takes ([\d.]+) to ([\d.]+) s over five runs, median ([\d.]+) s \(`reports/main_job.md`\)"
    )
    runs = [float(m) for m in re.findall(r"^\| \d \| ([\d.]+) \| 0 \|", text("main_job.md"), re.M)]
    assert len(runs) == 5 and (min(runs), max(runs), statistics.median(runs)) == tuple(map(float, (low, high, median)))
    session, process, sessions, ratio = quoted(
        r"`session` ([\d.]+) s, `process` ([\d.]+) s \((\d+) sessions of 2 ranks\), ([\d.]+)x"
    )
    report = text("main_grad_reuse.md")
    assert f"--trials 10` — {session} s wall" in report and f"--isolation process` — {process} s wall" in report
    assert sessions == "20" and rounds_to(ratio, float(process) / float(session))  # 2 arms x 10 trials


def test_what_the_main_job_prints_is_its_runs_tables_and_its_failures_message():
    shown = README.split("What the main job prints", 1)[1].split("```")[1]
    report = text("main_grad_reuse.md").split("## Default perturbation: the other fixes")[0]
    for test, fixed, baseline in re.findall(r"(test_hsdp\S+)\s+fixed (\d+/\d+)\s+baseline (\d+/\d+)", shown):
        assert f"| `{test}` | {fixed} | {baseline} |" in report
    assert "fixed (safe)     0/10 (rate below 28% at 95%)" in shown and "rate below 28% at 95%" in report
    assert "baseline (race)  10/10 failed (100%, 95% CI 72%-100%)" in shown
    assert "10 of 10 trials failed (100%, 95% CI 72%-100%)" in report
    message = re.search(r"in test_hsdp_losses_match_baseline: (.*)\n", shown).group(1)
    assert message in text("two_nodes.md")


def test_the_native_engines_replays_and_instruction_counts_are_its_report():
    report = text("native_engine_cpu.md")
    figures = quoted(
        r"the AdamW MLP of width 256 \((\d+) records a step\), Python engine ([\d.]+) ms, native engine ([\d.]+) ms; "
        r"the FSDP2-AdamW step of width 256 \((\d+) records a step\), ([\d.]+) and ([\d.]+) ms"
    )
    said = re.search(r"Per recorded step \(least of 9\):(.*?)\n\n", report, re.S).group(1)
    assert [f for f in figures if not appears(f, said)] == []
    table = [
        int(v.replace(",", "")) / 1e6
        for v in re.findall(r"^\| (?:plain|native path[^|]*) \| ([\d,]+) \|$", report, re.M)
    ]
    plain, native, observed = quoted(
        r"the plain step ([\d.]+) M, the native path ([\d.]+) M; with the callees observed instead, the log "
        r"returning at once for each, ([\d.]+) M"
    )
    (hooks,) = quoted(r"\(`native_hooks`, ([\d.]+) M, is no floor here")
    # the table's rows: plain, hooks only, the native path, the native path with the callees observed
    assert len(table) == 4 and all(map(rounds_to, (plain, hooks, native, observed), table))
    switch, total, apply, callbacks = quoted(
        r"costs about ([\d,]+) instructions a switch .*? Of the native path's ([\d.]+) M, applying the records is "
        r"([\d.]+) M and the log's callbacks ([\d.]+) M"
    )
    assert [f for f in (switch, total, apply, callbacks) if f not in report] == []


def test_the_native_paths_instruction_split_is_its_report():
    """What the README says of `python bench/detector_instructions.py`: each workload's instructions
    per step and the shares of the parts, from reports/detector_instructions_native.csv."""
    counts = {
        r["workload"]: {k: int(v) for k, v in r.items() if v.isdigit()}
        for r in rows("detector_instructions_native.csv")
    }
    fsdp2 = quoted(
        r"The FSDP2-AdamW step \(width 32, one gloo rank\) goes from ([\d.]+) M instructions to ([\d.]+) M "
        r"\(\+([\d.]+)%\): RecordFunction's per-call work and the rest (\d+)%, the log's callbacks (\d+)% \(turning "
        r"RecordFunction off and on around callees (\d+)%, walking stacks (\d+)%\), the drains (\d+)%"
    )
    mlp = quoted(
        r"The AdamW MLP \(width 64\) goes from ([\d.]+) M to ([\d.]+) M \(\+([\d.]+)%\): (\d+)%, (\d+)% "
        r"\((\d+)%, (\d+)%\) and (\d+)%"
    )
    for said, c in ((fsdp2, counts["fsdp2-adamw"]), (mlp, counts["mlp-adamw"])):
        added = c["native"] - c["plain"]
        own = c["callbacks"] - c["drains_in_callbacks"]
        shares = (added - own - c["drains"], own, c["switches"], c["stacks"], c["drains"])
        expected = (f"{c['plain'] / 1e6:.2f}", f"{c['native'] / 1e6:.2f}", f"{100 * added / c['plain']:.1f}",
                    *(f"{100 * n / added:.0f}" for n in shares))  # fmt: skip
        assert tuple(said) == expected
    assert "| RecordFunction's work for every call it shows the log" in text("detector_instructions_native.md")


def test_the_engines_comparison_on_the_cpu_is_its_report():
    """What the README says of `bash bench/engines_cpu.sh`: no disagreement, every race arm of the
    catalogue reported in each of its trials and no safe arm, 40 and 40 generated programs."""
    assert "whole catalogue, every arm, two trials each, and 40 correct and 40 racy generated programs" in FLAT
    assert "no disagreement; every race arm reported in both of its trials, no safe arm reported" in FLAT
    report = text("engines_cpu.md")
    assert "Disagreements: 0 " in report and "disagreements: 0" in text("engines_cpu.log")
    arms = re.findall(r"^\| (\w+) \| (\w+) \| (race|safe) \| (\d+) \| (\d+) \| (\d+) \|$", report, re.M)
    assert len({a[0] for a in arms}) == len(load_catalogue(find_catalogue())) and len(arms) > 30
    assert all(int(t) == 2 and int(r) == (2 if e == "race" else 0) for _, _, e, t, r, _ in arms), arms
    programs = {
        case: (runs, reported)
        for case, runs, reported in re.findall(r"^\| (correct|racy-\w+) \| \w+ \| (\d+) \| (\d+) \|$", report, re.M)
    }
    assert programs.pop("correct") == ("40", "0") and "--programs 40 --racy 40" in text("engines_cpu.log")
    assert programs and all(runs == reported for runs, reported in programs.values()), programs


def test_every_report_the_readme_cites_is_read_by_a_test_of_its_figures():
    """A report cited beside figures that no test reads would let them drift from it: every report
    the README names is read by this file or test_readme_gpu_figures.py, or is one of NAMED_ONLY."""
    cited = {
        re.split(r"[.{]", n)[0].removeprefix("reports/").rstrip("/") for n in re.findall(r"`(reports/[^`]+)`", FLAT)
    }
    tests = "".join((ROOT / "tests" / f).read_text() for f in ("test_readme_figures.py", "test_readme_gpu_figures.py"))
    assert sorted(c for c in cited if f'"{c}.' not in tests and c not in NAMED_ONLY) == []


NAMED_ONLY = (
    "catalogue",  # the benchmark's tables and commands: its figures are the table checked above
    "patch_off_overhead_cpu",  # named for what an `off` profile does, with no figure quoted
    "gpu/modern_code_runs",  # the run folders behind gpu/modern_code.csv
    "gpu/native_tests_x1",  # named for the CUDA tests that passed, with no figure quoted
)


def test_the_cpu_counts_of_the_calls_that_made_no_record_are_their_report():
    """The FSDP2 step's calls a step on the CPU, by what became of them, as the report's split line
    gives them (medians of its native runs), and the runs CSV has a column for each."""
    observed, recorded, callees, transparent, skipped = quoted(
        r"the FSDP2 step's (\d+) calls a step were (\d+) recorded, (\d+) callees, (\d+) transparent\s+and (\d+) "
        r"that touch no data: `reports/detector_overhead_native_calls_cpu\.\{md,log\}`, `_runs\.csv`"
    )
    part = text("detector_overhead_native_calls_cpu.md").split("### fsdp2-adamw:")[1]
    said = re.search(
        r"RecordFunction showed the log (\d+) calls per step, (\d+) of them recorded\. Of the others, (\d+) were "
        r"callees of recorded calls .*?, (\d+) transparent operators .*?, (\d+) operators that touch no tensor data "
        r".*? and (\d+) the host's own calls",
        part,
    ).groups()
    assert said == (observed, recorded, callees, transparent, skipped, "0")
    assert sum(map(int, said[1:])) == int(observed)
    runs = [
        r for r in rows("detector_overhead_native_calls_cpu_runs.csv")
        if (r["workload"], r["mode"]) == ("fsdp2-adamw", "native") and int(r["repeat"]) >= 0
    ]  # fmt: skip
    assert len(runs) == 3
    for field, figure in zip(
        ("observed", "callees", "transparent", "skipped"), (observed, callees, transparent, skipped), strict=True
    ):
        assert f"{statistics.median(float(r[f'{field}_per_step']) for r in runs):.0f}" == figure, field
    assert "--repeats 3" in text("detector_overhead_native_calls_cpu.log").splitlines()[0]
