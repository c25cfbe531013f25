"""What the tests of the README's figures share (test_readme_figures.py, test_readme_gpu_figures.py):
the README as one line of text, the figures a pattern quotes from it, a committed file's text and
rows, and a figure compared with a file's number as the README rounds it. Reads files only."""

from __future__ import annotations

import csv
import importlib.util
import re
import sys
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports"
README = (ROOT / "README.md").read_text(encoding="utf-8")
FLAT = " ".join(README.split())  # line breaks and indentation are the layout's, not the text's
NUMBER = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?")


def quoted(pattern: str) -> tuple[str, ...]:
    """The groups of the one place `pattern` matches the README (its whitespace as one space)."""
    found = list(re.finditer(pattern, FLAT))
    assert len(found) == 1, f"the README says /{pattern}/ {len(found)} times, not once"
    return found[0].groups()


def text(name: str) -> str:
    return (REPORTS / name).read_text(encoding="utf-8")


def rows(name: str) -> list[dict]:
    with open(REPORTS / name, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def rounds_to(figure: str, value: float | str) -> bool:
    """Whether `value` rounded (half up) to as many decimals as `figure` is `figure` ('4.3' for
    4.287, '0.30' for a file's 0.295)."""
    want = Decimal(figure.replace(",", ""))
    got = Decimal(str(value).replace(",", "")).quantize(
        Decimal(1).scaleb(min(want.as_tuple().exponent, 0)), ROUND_HALF_UP
    )
    return got == want


def numbers(source: str) -> list[str]:
    """The numbers of `source` as it writes them."""
    return NUMBER.findall(source)


def appears(figure: str, source: str) -> bool:
    """Whether a number of `source` is `figure` as the README rounds it."""
    return any(rounds_to(figure, n) for n in numbers(source))


def bench(name: str):
    """bench/NAME.py as a module (bench/ is no package; its scripts import their neighbours)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return module
