"""A block of the README that a benchmark writes: the lines between a start and an end marker,
replaced by the table the benchmark makes of its committed files, which a test then compares
with what the same code makes of them (tests/test_readme_figures.py).

Part of bench/modern_code.py (--splice) and bench/detector_overhead_native.py (--splice).
"""

from __future__ import annotations

from pathlib import Path


def splice(readme: Path, start: str, end: str, lines: list[str]) -> None:
    """Put `lines` between the markers `start` and `end` of `readme` (exit with a message where
    either is missing)."""
    text = readme.read_text()
    if start not in text or end not in text:
        raise SystemExit(f"{readme}: no {start} ... {end} markers")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    readme.write_text(head + start + "\n" + "\n".join(lines) + "\n" + end + tail)
