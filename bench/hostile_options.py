"""The hostile probe's cases of bad options, one command line each, for every command: numbers
out of their range, nan and inf, malformed values, unknown names, options that need another, and
rendezvous endpoints (loopback addresses only). Each is refused before anything runs: one line,
exit 2, naming the option or the value (`says`)."""

from __future__ import annotations

import shlex
import socket

from hostile_kit import Case, Ctx, Result

GATE = ("gate", "{done}", "--fixed", "good", "--baseline", "bad")
PLAN = ("plan",)

# (command line, what the line names), every one exit 2.
RUN = [
    (("--trials", "nan"), "--trials"),
    (("--trials", "-1"), "--trials"),
    (("--trials", "0"), "--trials"),
    (("--trials", "x"), "--trials"),
    (("--trials", "1.5"), "--trials"),
    (("--timeout", "nan"), "--timeout"),
    (("--timeout", "inf"), "--timeout"),
    (("--timeout", "0"), "--timeout"),
    (("--timeout", "-5"), "--timeout"),
    (("--timeout", "604801"), "--timeout"),
    (("--timeout", "1e400"), "--timeout"),
    (("--timeout", ""), "--timeout"),
    (("--max-time", "nan"), "--max-time"),
    (("--max-time", "0.5"), "--max-time"),
    (("--max-time", "-inf"), "--max-time"),
    (("--delay-ms", "nan"), "--delay-ms"),
    (("--delay-ms", "-1"), "--delay-ms"),
    (("--delay-ms", "3600001"), "--delay-ms"),
    (("--delay-ms", "1e12"), "--delay-ms"),
    (("--seed", "x"), "--seed"),
    (("--seed", "1.5"), "--seed"),
    (("--world-size", "0"), "--world-size"),
    (("--world-size", "-1"), "--world-size"),
    (("--world-size", "x"), "--world-size"),
    (("--world-size", "100000"), "64"),
    (("--chunk", "0"), "--chunk"),
    (("--shard", "0/2"), "--shard"),
    (("--shard", "3/2"), "--shard"),
    (("--shard", "1/0"), "--shard"),
    (("--shard", "x"), "--shard"),
    (("--shard", "1/2/3"), "--shard"),
    (("--shard", "auto"), "RACECHECK_SHARD"),
    (("--order", "sideways"), "--order"),
    (("--isolation", "threads"), "--isolation"),
    (("--backend", "tpu"), "--backend"),
    (("--perturb", ""), "--perturb"),
    (("--perturb", ",,,"), "--perturb"),
    (("--perturb", "sleep@nowhere"), "nowhere"),
    (("--perturb", "sleep@free:-1ms"), "--perturb"),
    (("--perturb", "sleep@free:2h"), "--perturb"),
    (("--perturb", "random:max=x"), "--perturb"),
    (("--perturb", "systematic:delay=nan"), "--perturb"),
    (("--perturb", "reorder"), "--perturb"),
    (("--perturb", "sleep@stream_enter:5ms"), "CUDA|cuda"),  # a project's suite, on a machine without CUDA
    (("--detect",), "CUDA|cuda"),
    (("--arms", "nope"), "nope"),
    (("--arms", ""), "--arms"),
    (("--arms", "good,nope"), "nope"),
    (("--scenario", "nope"), "nope"),
    (("--stop-when", "garbage"), "--stop-when"),
    (("--stop-when", "good:failures>=x"), "--stop-when"),
    (("--stop-when", "nope:failures>=1"), "nope"),
    (("--stop-when", "good:wrong>=1"), "--stop-when"),
    (("--gate",), "--fixed"),
    (("--gate", "--fixed", "good", "--baseline", "nope"), "nope"),
    (("--gate", "--fixed", "good", "--baseline", "bad", "--max-rate", "2"), "--max-rate"),
    (("--gate", "--fixed", "good", "--baseline", "bad", "--confidence", "1"), "--confidence"),
    (("--mesh", "3x3", "--scenario", "main_grad_reuse"), "--mesh"),
    (("--mesh", "0x2", "--scenario", "main_grad_reuse"), "--mesh"),
    (("--mesh", "axb", "--scenario", "main_grad_reuse"), "--mesh"),
    (("--nnodes", "0"), "--nnodes"),
    (("--nnodes", "2"), "--rdzv-endpoint"),
    (("--nnodes", "2", "--rdzv-endpoint", "127.0.0.1"), "HOST:PORT"),
    (("--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:99999"), "--rdzv-endpoint"),
    (("--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:x"), "--rdzv-endpoint"),
    (("--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "127.0.0.1:29999"), "--node-rank"),
    (("--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29999", "--rdzv-conf", "garbage"), "--rdzv-conf"),
    (("--resume", "{c}/nowhere"), "--resume"),
    (("--resume", "{done}", "--out", "{c}/other"), "--out|--resume"),
    (("--allow-changed-suite",), "--resume"),
    (("--config", "{c}/missing.toml"), "no such config file"),
    (("--config", "{c}"), "--config"),
    (("--scenarios", "{c}/none", "--scenario", "all"), "none"),
    (("--bogus",), "--bogus"),
    (("-q", "--trials", "1", "--", "--no-such-pytest-option"), "pytest"),
    (("-q", "--trials", "1", "--", "test_x.py::nope"), "pytest"),
    (("-q", "--trials", "1", "--", "-k", "nothing_matches"), "collected no tests"),
    (("-q", "--trials", "1", "--", "--lf"), "pytest"),  # the sessions run without pytest's cache
]
GATES = [
    (("--max-rate", "-0.1"), "--max-rate"),
    (("--max-rate", "1.5"), "--max-rate"),
    (("--max-rate", "nan"), "--max-rate"),
    (("--min-rate", "2"), "--min-rate"),
    (("--confidence", "0"), "--confidence"),
    (("--confidence", "1"), "--confidence"),
    (("--confidence", "nan"), "--confidence"),
    (("--signature", "("), "--signature"),
    (("--scenario", "nope"), "nope"),
]
OTHER = [
    (("gate", "{done}", "--baseline", "bad"), "--fixed"),
    (("gate", "{done}", "--fixed", "nope", "--baseline", "bad"), "nope"),
    (("gate", "{done}", "--fixed", "good", "--baseline", "good"), "same arm"),
    (("gate", "{c}/nowhere", "--fixed", "good", "--baseline", "bad"), "nowhere"),
    (("gate", "{p}/pyproject.toml", "--fixed", "good", "--baseline", "bad"), "pyproject"),
    (("report", "{done}", "--format", "xml"), "--format"),
    (("report", "{done}", "--signature", "("), "--signature"),
    (("report", "{c}/nowhere"), "nowhere"),
    (("report", "{c}/no\nwhere"), "no\\\\nwhere"),  # a name with a line break, said on one line
    (("report", "{p}/pyproject.toml"), "pyproject"),
    (("report", "{done}", "-o", "{c}/missing/table.md"), "missing"),
    (("report", "{done}", "-o", "{c}"), "-o|--output"),
    (("plan",), "--bound"),
    (("plan", "--bound", "0"), "above 0"),
    (("plan", "--bound", "1.5"), "--bound"),
    (("plan", "--bound", "nan"), "--bound"),
    (("plan", "--bound", "0.1", "--confidence", "1"), "--confidence"),
    (("plan", "--baseline-rate", "0.5", "--fixed-rate", "0.6"), "rate"),
    (("plan", "--baseline-rate", "0.5", "--alpha", "0"), "--alpha"),
    (("plan", "--baseline-rate", "0.5", "--alpha", "1"), "--alpha"),
    (("plan", "--baseline-rate", "0.5", "--power", "1"), "--power"),
    (("merge", "--out", "{c}/m"), "INPUTS"),
    (("merge", "{s1}", "{s2}"), "--out"),
    (("merge", "{s1}", "{c}/nowhere", "--out", "{c}/m"), "nowhere"),
    (("merge", "{c}/none-*", "--out", "{c}/m"), "none-"),
    (("merge", "{s1}", "{s1}", "--out", "{c}/m"), "same run folder"),
    (("merge", "{s1}", "--out", "{c}/m"), "2/2|missing"),
    (("merge", "{s1}", "{s2}", "--out", "{p}/pyproject.toml"), "pyproject"),
    (("list", "--config", "{c}/missing.toml"), "no such config file"),
    (("frobnicate",), "frobnicate"),
]


def _port_in_use(ctx: Ctx) -> Result:
    """Node 0 cannot host the rendezvous on a loopback port another process holds."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        argv = (
            "run",
            "--trials",
            "1",
            "-q",
            "--world-size",
            "2",
            "--nnodes",
            "2",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
        )
        return ctx.racecheck(*argv)


def cases() -> list[Case]:
    """Every case exits 2 but one: pytest arguments that make a session run no test (exit 3, a
    session that ended before its first test)."""
    made = [Case("options", f"run {shlex.join(a)}", 2, says, argv=("run", *a)) for a, says in RUN]
    made += [Case("options", f"gate OUT {shlex.join(a)}", 2, says, argv=(*GATE, *a)) for a, says in GATES]
    made += [Case("options", shlex.join(a), 2, says, argv=a) for a, says in OTHER]
    made.append(
        Case(
            "options",
            "run -- --collect-only (a session that runs no test)",
            3,
            "without finishing a trial",
            argv=("run", "--trials", "1", "-q", "--", "--collect-only"),
        )
    )
    made.append(
        Case(
            "options", "run --nnodes 2 with a loopback endpoint whose port is taken", 2, "cannot host", act=_port_in_use
        )
    )
    made.append(
        Case(
            "options",
            "report --github-summary with $GITHUB_STEP_SUMMARY unset",
            2,
            "GITHUB_STEP_SUMMARY",
            argv=("report", "{done}", "--github-summary"),
            env={"GITHUB_STEP_SUMMARY": None},
        )
    )
    made.append(
        Case(
            "options",
            "report --github-summary to a folder",
            2,
            "GITHUB_STEP_SUMMARY",
            argv=("report", "{done}", "--github-summary"),
            env={"GITHUB_STEP_SUMMARY": "{c}"},
        )
    )
    made.append(
        Case(
            "options",
            "report --github-summary into a missing folder",
            2,
            "GITHUB_STEP_SUMMARY",
            argv=("report", "{done}", "--github-summary"),
            env={"GITHUB_STEP_SUMMARY": "{c}/missing/summary.md"},
        )
    )
    return made
