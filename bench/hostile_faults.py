"""The hostile probe's cases of faulty suites: a test that ends its process (a clean or a failing
exit code, SIGKILL, SIGSEGV, KeyboardInterrupt), hangs, ignores SIGTERM, prints without end, fails
with text that is not UTF-8, removes the run folder, leaves daemons and children behind, forks,
closes its output or leaves the test folder; a collection slower than --timeout; 500
parametrizations. The run ends with exit 0, records what happened to that test, once per trial,
and runs the tests after it."""

from __future__ import annotations

import xml.dom.minidom

from hostile_kit import Case, Ctx, Result, outcomes, write_project

RUN = ("run", "--trials", "2", "--out", "{c}/out", "-q")
AROUND = "\n\ndef test_a_ok():\n    pass\n\n\ndef test_c_ok():\n    pass\n"
# (name, the middle test's body, its outcome, extra run options)
MIDDLE = [
    ("a test that calls os._exit(0)", "import os\n    os._exit(0)", "crash", ()),
    ("a test that calls os._exit(1)", "import os\n    os._exit(1)", "crash", ()),
    ("a test that calls sys.exit(0)", "import sys\n    sys.exit(0)", "failed", ()),
    ("a test that SIGKILLs its process", "import os, signal\n    os.kill(os.getpid(), signal.SIGKILL)", "crash", ()),
    ("a test that SIGSEGVs its process", "import os, signal\n    os.kill(os.getpid(), signal.SIGSEGV)", "crash", ()),
    ("a test that raises KeyboardInterrupt", "raise KeyboardInterrupt", "crash", ()),
    ("a test that hangs (--timeout 1)", "import time\n    time.sleep(600)", "timeout", ("--timeout", "1")),
    (
        "a test that ignores SIGTERM and hangs (--timeout 1)",
        "import signal, time\n    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n    time.sleep(600)",
        "timeout",
        ("--timeout", "1"),
    ),
    ("a test whose fixture raises", "pass", "error", ()),
    ("a test that closes its stdout and stderr", "import os\n    os.close(1)\n    os.close(2)", "passed", ()),
    ("a test that moves to / and stays there", "import os\n    os.chdir('/')", "passed", ()),
    (
        "a test that prints bytes that are not UTF-8",
        "import sys\n    sys.stdout.buffer.write(b'\\xff\\xfe\\x00')",
        "passed",
        (),
    ),
    (
        "a test that starts a daemon (setsid, double fork)",
        "import subprocess\n    subprocess.Popen(['setsid', 'sh', '-c', 'sleep 300 &'])",
        "passed",
        (),
    ),
    ("a test that leaves a child running", "import subprocess\n    subprocess.Popen(['sleep', '300'])", "passed", ()),
    (
        "a test that forks a child which returns into pytest",
        "import os\n    os.fork()",
        "passed",
        (),
    ),
]
FIXTURE_RAISES = "import pytest\n\n\n@pytest.fixture\ndef broken():\n    raise RuntimeError('setup fails')\n\n\n"


def _middle_test(body: str, name: str) -> dict:
    head = FIXTURE_RAISES if "fixture" in name else ""
    args = "broken" if "fixture" in name else ""
    return {"test_x.py": f"{head}def test_b({args}):\n    {body}\n{AROUND}"}


def _each_trial(expected: dict[str, str], arm: str = "good", trials: int = 2):
    """Then: every trial of `arm` recorded each named test once, with its expected outcome."""

    def then(ctx: Ctx, res: Result) -> str:
        got = outcomes(ctx / "out")
        want = {(arm, t, test): outcome for t in range(trials) for test, outcome in expected.items()}
        wrong = {k: got.get(k) for k, v in want.items() if got.get(k) != v}
        extra = sorted(k for k in got if k not in want)
        return f"records differ: {wrong} {extra[:3]}" if wrong or extra else ""

    return then


def suite(tests: dict, arms: str = "[tool.racecheck.arms.good]\n"):
    def prepare(ctx: Ctx) -> None:
        (ctx.p / "test_x.py").unlink()
        write_project(ctx.p, pyproject=f'[tool.racecheck]\nname = "tiny"\n\n{arms}', tests=tests)

    return prepare


LOUD = "def test_loud():\n    print('x' * 6_000_000)\n    assert False, 'the end'\n"
SURROGATE = "import os\n\n\ndef test_name():\n    assert False, 'bad name ' + os.fsdecode(b'caf\\xff.txt')\n"
REMOVES = "import shutil\n\n\ndef test_b_cleans_up():\n    shutil.rmtree('../out', ignore_errors=True)\n" + AROUND
MANY = "import pytest\n\n\n@pytest.mark.parametrize('i', range(500))\ndef test_many(i):\n    pass\n"


def _bounded_log(ctx: Ctx, res: Result) -> str:
    logs = list((ctx / "out" / "logs").iterdir())
    size = sum(p.stat().st_size for p in (ctx / "out").rglob("*") if p.is_file())
    return "" if size < 5_000_000 and any(b" MB cut ..." in p.read_bytes() for p in logs) else f"run folder {size} B"


def _reports_render(ctx: Ctx, res: Result) -> str:
    for fmt in ("junit", "markdown", "html"):
        out = ctx.racecheck("report", ctx / "out", "--format", fmt)
        if out.code != 0:
            return f"report --format {fmt}: exit {out.code}"
        if fmt == "junit":
            xml.dom.minidom.parseString(out.out)
    return ""


def _every_test_once(count: int):
    def then(ctx: Ctx, res: Result) -> str:
        got = outcomes(ctx / "out")
        return "" if len(got) == count and set(got.values()) == {"passed"} else f"{len(got)} records of {count}"

    return then


CASES = [
    Case(
        "faulty suites",
        name,
        0,
        argv=(*RUN, *extra),
        prepare=suite(_middle_test(body, name)),
        then=_each_trial({"test_a_ok": "passed", "test_b": outcome, "test_c_ok": "passed"}),
        keeps="out",
    )
    for name, body, outcome, extra in MIDDLE
]
CASES += [
    Case(
        "faulty suites",
        "a test that prints 6 MB",
        0,
        argv=RUN,
        prepare=suite({"test_x.py": LOUD}),
        then=_bounded_log,
    ),
    Case(
        "faulty suites",
        "a failure message with a lone surrogate",
        0,
        argv=RUN,
        prepare=suite({"test_x.py": SURROGATE}),
        then=_reports_render,
    ),
    Case(
        "faulty suites",
        "a test that removes the run folder",
        0,
        "written again",
        argv=RUN,
        prepare=suite({"test_x.py": REMOVES}),
        then=_each_trial({"test_a_ok": "passed", "test_b_cleans_up": "passed", "test_c_ok": "passed"}),
        keeps="out",
    ),
    Case(
        "faulty suites",
        "500 parametrizations",
        0,
        argv=("run", "--trials", "1", "--out", "{c}/out", "-q"),
        prepare=suite({"test_x.py": MANY}),
        then=_every_test_once(500),
    ),
    Case(
        "faulty suites",
        "a collection that takes 3 s (--timeout 1)",
        0,
        argv=("run", "--trials", "1", "--timeout", "1", "--out", "{c}/out", "-q"),
        prepare=suite({"conftest.py": "import time\n\ntime.sleep(3)\n", "test_x.py": "def test_ok():\n    pass\n"}),
        then=_every_test_once(1),
    ),
]


def cases() -> list[Case]:
    return CASES
