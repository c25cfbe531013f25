"""Parametrized node ids as pytest targets of a repeated session.

The plugin repeats every test once per step, so `test_x[1-False]` is collected as
`test_x[1-False-1-4]`: the id a user passes (`tests/test_a.py::test_x[1-False]`) would name no
item. The plugin widens such a target to its function (`tests/test_a.py::test_x`) before pytest
reads its arguments, and after collection keeps only the items of the parametrizations named.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Wanted:
    """The parametrizations named per (file, test path inside it, e.g. `TestC::test_x`)."""

    params: dict[tuple[Path, str], frozenset[str]]

    def keeps(self, path: Path, inner_id: str) -> bool:
        """Whether an item (its file, its id inside the file with the step's id stripped) is kept:
        items of a test whose targets named no parametrization always are."""
        name, bracket, rest = inner_id.partition("[")
        wanted = self.params.get((path.resolve(), name))
        if wanted is None:
            return True
        return bool(bracket) and rest[:-1] in wanted


def widen(args: list[str], invocation_dir: Path) -> tuple[list[str], Wanted]:
    """(args with each `FILE::TEST[PARAMS]` target replaced by `FILE::TEST`, once, and the
    parametrizations they named)."""
    widened: list[str] = []
    params: dict[tuple[Path, str], set[str]] = {}
    for arg in args:
        path, sep, inner = arg.partition("::")
        name, bracket, rest = inner.partition("[")
        if arg.startswith("-") or not sep or not bracket or not rest.endswith("]"):
            widened.append(arg)
            continue
        key = ((invocation_dir / path).resolve(), name)
        if key not in params:
            params[key] = set()
            widened.append(f"{path}::{name}")
        params[key].add(rest[:-1])
    return widened, Wanted({k: frozenset(v) for k, v in params.items()})
