"""What the detector could not see, in a line per arm for the console after the run's table:
launches of kernels below the dispatcher whose writes it could not tell (their tensors counted as
reads, detect/kernel_launches.py), and the tracker's own errors (an operator call or a kernel
launch it failed to record). A detector run that says nothing of them saw every kernel and
recorded every call.
"""

from __future__ import annotations

from racecheck.protocol.records import TrialRecord

SHOWN = 4  # kernel names a note lists; the rest are counted


def detector_notes(records: list[TrialRecord]) -> list[str]:
    """One line per (suite, arm) whose tests launched kernels of unknown writes, and one per
    (suite, arm) whose tracker failed to record something."""
    return _unseen_kernels(records) + _tracker_errors(records)


def _tracker_errors(records: list[TrialRecord]) -> list[str]:
    by_arm: dict[tuple[str, str], list[TrialRecord]] = {}
    for r in records:
        if r.detector_errors:
            by_arm.setdefault((r.scenario, r.arm), []).append(r)
    lines = []
    for (suite, arm), failing in sorted(by_arm.items()):
        messages = list(dict.fromkeys(e for r in failing for e in r.detector_errors or []))
        lines.append(
            f"{suite}/{arm}: --detect's tracker failed to record in {len(failing)} test run(s) "
            f"({messages[0]}" + (f"; {len(messages) - 1} other error(s)" if len(messages) > 1 else "") + "): "
            "a race in what it missed may go unreported"
        )
    return lines


def _unseen_kernels(records: list[TrialRecord]) -> list[str]:
    by_arm: dict[tuple[str, str], dict[str, int]] = {}
    for r in records:
        for name, n in (r.unseen_kernels or {}).items():
            counts = by_arm.setdefault((r.scenario, r.arm), {})
            counts[name] = counts.get(name, 0) + int(n)
    lines = []
    for (suite, arm), counts in sorted(by_arm.items()):
        names = sorted(counts, key=lambda k: (-counts[k], k))
        listed = ", ".join(names[:SHOWN]) + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")
        lines.append(
            f"{suite}/{arm}: --detect could not tell what {len(names)} kernel(s) write ({listed}; "
            f"{sum(counts.values())} launch(es)): their tensors were taken as read, so a race on "
            f"what they write may go unreported"
        )
    return lines
