"""racecheck's layers as pyproject.toml's import-linter contracts state them ([tool.importlinter],
checked by .ci/lint): they hold, a module that imports back up a layer breaks them, and no module
imports itself back at run time through others (an import cycle)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[1]
LINT = "from importlinter.cli import lint_imports_command; lint_imports_command(['--no-cache'])"


def _lint(root: Path) -> subprocess.CompletedProcess:
    """import-linter's contracts over the racecheck package found in `root`."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-c", LINT], cwd=root, env=env, capture_output=True, text=True)


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    """The package's sources and pyproject.toml, copied where a test may spoil them."""
    root = tmp_path_factory.mktemp("layers")
    shutil.copy(CHECKOUT / "pyproject.toml", root)
    shutil.copytree(CHECKOUT / "racecheck", root / "racecheck", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    return root


def test_the_contracts_hold(copy):
    result = _lint(copy)
    assert result.returncode == 0 and "broken" in result.stdout and "0 broken" in result.stdout, result


@pytest.mark.parametrize(
    ("module", "back_import", "broken"),
    [
        ("runner/blocks.py", "import racecheck.results.stats", "each layer imports only the layers below it"),
        ("rank/collect.py", "import racecheck.runner.state", "each layer imports only the layers below it"),
        ("results/rows.py", "import racecheck.runner.state", "the results import neither the runner"),
        ("protocol/names.py", "import torch", "protocol imports no torch and no click"),
    ],
)
def test_a_back_import_breaks_a_contract(copy, module, back_import, broken):
    path = copy / "racecheck" / module
    kept = path.read_text()
    try:
        path.write_text(kept + f"\n{back_import}  # noqa\n")
        result = _lint(copy)
    finally:
        path.write_text(kept)
    assert result.returncode == 1, result
    assert f"{broken}" in result.stdout.split("Broken contracts")[-1], result.stdout


def test_no_module_imports_itself_back_at_run_time():
    """No cycle in the graph of imports that run (those under TYPE_CHECKING never do)."""
    import grimp

    graph = grimp.build_graph("racecheck", exclude_type_checking_imports=True)
    assert _cycles(graph, sorted(graph.modules)) == []


def test_the_cycle_finder_finds_a_cycle_through_lazy_imports():
    class Graph:  # a imports b, b imports c and (lazily, say) a; d stands apart
        imports = {"racecheck.a": {"racecheck.b"}, "racecheck.b": {"racecheck.c", "racecheck.a"}, "racecheck.c": set()}
        imports["racecheck.d"] = {"racecheck.c"}
        modules = set(imports)

        def find_modules_directly_imported_by(self, module):
            return self.imports[module]

    assert _cycles(Graph(), sorted(Graph.modules)) == [["racecheck.a", "racecheck.b"]]


def _cycles(graph, modules: list[str]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for root in modules:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, edges = work[-1]
            child = next((m for m in edges if m in graph.modules and m.startswith("racecheck")), None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = stack[stack.index(node) :]
                del stack[stack.index(node) :]
                if len(component) > 1:
                    found.append(sorted(component))
    return found
