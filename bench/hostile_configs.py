"""The hostile probe's cases of bad configs: a project's `[tool.racecheck]` table (or a `--config`
file) that is no TOML, holds keys of the wrong type or range, arm names the command line cannot
give back, environments no process can take, git revisions that do not exist; suites pytest
cannot collect; a catalogue folder with a spoiled scenario.toml. Each is refused in one line,
exit 2, by `racecheck run` (and by `racecheck list`, which reads the same config)."""

from __future__ import annotations

import subprocess

from hostile_kit import TESTS, Case, Ctx

HEAD = '[tool.racecheck]\nname = "tiny"\n'
ARM = "\n[tool.racecheck.arms.good]\n"

# (name, pyproject.toml's text, what the line says); `racecheck run --trials 1 -q` refuses each.
PYPROJECTS = [
    ("pyproject.toml that is not TOML", "[tool.racecheck\n", "TOML|toml"),
    ("pyproject.toml of binary bytes", b"\x00\x89PNG\xff", "TOML|toml|UTF|utf|decode"),
    ("[tool.racecheck] without arms", HEAD, "arms"),
    ("arms = []", HEAD + "arms = []\n", "arms"),
    ("arms = 3", HEAD + "arms = 3\n", "arms"),
    ("an arm named 'a b'", HEAD + '\n[tool.racecheck.arms."a b"]\n', "a b"),
    ("an arm named 'a,b'", HEAD + '\n[tool.racecheck.arms."a,b"]\n', "a,b"),
    ("an arm named 'a:b'", HEAD + '\n[tool.racecheck.arms."a:b"]\n', "a:b"),
    ("an arm named 'all'", HEAD + "\n[tool.racecheck.arms.all]\n", "all"),
    ("an arm named ''", HEAD + '\n[tool.racecheck.arms.""]\n', "arm"),
    ("an arm named with a control character", HEAD + '\n[tool.racecheck.arms."a\\u0007"]\n', "arm"),
    ("env with a name holding '='", HEAD + ARM + 'env = { "A=B" = "1" }\n', "A=B"),
    ("env with a value holding NUL", HEAD + ARM + 'env = { A = "x\\u0000y" }\n', "NUL|nul|\\\\x00|\\\\0"),
    ("env that is a string", HEAD + ARM + 'env = "A=1"\n', "env"),
    ("default_arms = []", HEAD + "default_arms = []\n" + ARM, "default_arms"),
    ("default_arms naming no arm of the suite", HEAD + 'default_arms = ["nope"]\n' + ARM, "nope"),
    ("tests as a string", HEAD + 'tests = "test_x.py"\n' + ARM, "tests"),
    ("tests naming a missing file", HEAD + 'tests = ["missing.py"]\n' + ARM, "missing.py"),
    ("world_size = 0", HEAD + "world_size = 0\n" + ARM, "world_size"),
    ("world_size = 1.5", HEAD + "world_size = 1.5\n" + ARM, "world_size"),
    ("world_size = 'x'", HEAD + 'world_size = "x"\n' + ARM, "world_size"),
    ("world_size = 100 on the CPU", HEAD + "world_size = 100\n" + ARM, "64"),
    ("perturb naming no point", HEAD + 'perturb = "sleep@nowhere"\n' + ARM, "nowhere"),
    ("perturb = ''", HEAD + 'perturb = ""\n' + ARM, "perturb"),
    ("an arm's perturb of two hours", HEAD + ARM + 'perturb = "sleep@free:2h"\n', "sleep@free:2h"),
    ("expect = 'maybe'", HEAD + ARM + 'expect = "maybe"\n', "expect"),
    ("expect = 5", HEAD + ARM + "expect = 5\n", "expect"),
    ("pytest_args as a string", HEAD + ARM + 'pytest_args = "-x"\n', "pytest_args"),
    ("pytest_args of numbers", HEAD + ARM + "pytest_args = [1]\n", "pytest_args"),
    ("pytest_args pytest rejects", HEAD + ARM + 'pytest_args = ["--no-such-option"]\n', "pytest"),
    ("a misspelt key (trails)", HEAD + "trails = 3\n" + ARM, "trails"),
    ("an arm's unknown key", HEAD + ARM + "bogus = 3\n", "bogus"),
    ("name = 5", "[tool.racecheck]\nname = 5\n" + ARM, "name"),
    ("summary = 3", HEAD + ARM + "summary = 3\n", "summary"),
    ("git outside a git repository", HEAD + ARM + 'git = "v1"\n', "git|v1"),
    ("an env value of 200 kB (more than exec takes)", HEAD + ARM + f'env = {{ X = "{"x" * 200_000}" }}\n', "env"),
]
# (name, file, its text, what the line says): a suite pytest cannot collect.
SUITES = [
    ("a test file with a syntax error", "test_x.py", "def test_one(:\n    pass\n", "pytest|collect|SyntaxError"),
    ("a conftest that raises", "conftest.py", "raise RuntimeError('the conftest fails')\n", "pytest|conftest|collect"),
    ("a suite of no tests", "test_x.py", "\n", "no tests"),
    ("a test file that imports a missing module", "test_x.py", "import no_such_module\n", "pytest|collect|no_such"),
]


def _git(ctx: Ctx) -> None:
    for cmd in (
        ["init", "-q"],
        ["add", "."],
        ["-c", "user.name=p", "-c", "user.email=p@localhost", "commit", "-qm", "p"],
    ):
        subprocess.run(["git", *cmd], cwd=ctx.p, check=True, capture_output=True)


def _pyproject(text: str | bytes):
    def prepare(ctx: Ctx) -> None:
        (ctx.p / "pyproject.toml").write_bytes(text if isinstance(text, bytes) else text.encode())

    return prepare


def _file(name: str, text: str):
    def prepare(ctx: Ctx) -> None:
        (ctx.p / name).write_text(text)

    return prepare


def _scenario(text: str):
    """A catalogue folder with one scenario whose scenario.toml is `text`."""

    def prepare(ctx: Ctx) -> None:
        folder = ctx / "catalogue" / "broken"
        folder.mkdir(parents=True)
        (folder / "scenario.toml").write_text(text)
        (folder / "test_broken.py").write_text(TESTS)

    return prepare


def cases() -> list[Case]:
    run = ("run", "--trials", "1", "-q")
    made = [Case("configs", name, 2, says, argv=run, prepare=_pyproject(text)) for name, text, says in PYPROJECTS]
    made += [Case("configs", name, 2, says, argv=run, prepare=_file(f, text)) for name, f, text, says in SUITES]
    for name, text, says in PYPROJECTS[5:12]:  # the names and envs the issue found `list` showing as fine
        made.append(Case("configs", f"list: {name}", 2, says, argv=("list",), prepare=_pyproject(text)))
    git_arm = '[tool.racecheck]\nname = "tiny"\n\n[tool.racecheck.arms.old]\ngit = "no-such-revision"\n'

    def git_project(ctx: Ctx) -> None:
        _pyproject(git_arm)(ctx)
        _git(ctx)

    made.append(
        Case(
            "configs",
            "a git arm at a revision that does not exist",
            2,
            "no-such-revision",
            argv=run,
            prepare=git_project,
        )
    )
    scenarios = ("run", "--scenarios", "{c}/catalogue", "--scenario", "broken", "--trials", "1", "-q")
    for name, text, says in (
        ("scenario.toml that is not TOML", "name = [\n", "TOML|toml|scenario"),
        ("scenario.toml without arms", 'name = "broken"\n', "arms"),
        ("scenario.toml whose arm expects 'maybe'", 'name = "broken"\n[arms.a]\nexpect = "maybe"\n', "expect"),
        (
            "scenario.toml whose min_world_size exceeds 64",
            'name = "broken"\nmin_world_size = 65\n[arms.a]\n',
            "64|world",
        ),
    ):
        made.append(Case("configs", name, 2, says, argv=scenarios, prepare=_scenario(text)))
    return made
