"""What the perturbation of a run did, in a few lines for the console after the run's table:
profiles that never acted (a perturbation that never fires proves nothing), and for the systematic
schedule its bound: k, the hand-off points recorded, what the trials covered, and what failed.

Only records that counted their actions (patch mode in a project's own suite, the injector on
the catalogue's runtime) are judged. The
profiles come parsed, as the run resolved them per (suite, arm) (RunConfig.profile_for).
"""

from __future__ import annotations

from collections.abc import Mapping

from racecheck.perturb.profiles import Profile
from racecheck.protocol.records import Outcome, TrialRecord


def perturbation_notes(records: list[TrialRecord], profiles: Mapping[tuple[str, str], Profile]) -> list[str]:
    """The notes on `records`, whose arms ran `profiles` ((suite, arm) -> the arm's profile)."""
    from racecheck.perturb.systematic import coverage

    groups: dict[tuple[str, str, str], list[TrialRecord]] = {}
    for r in records:
        if r.actions is not None and r.perturb and r.perturb != "off":
            groups.setdefault((r.scenario, r.arm, r.perturb), []).append(r)
    lines = []
    for (suite, arm, spec), rs in sorted(groups.items()):
        trials = len({r.trial for r in rs})
        acted = sum(int(n) for r in rs for n in (r.actions or {}).values())
        profile = profiles.get((suite, arm))
        systematic = profile.systematic if profile is not None and profile.to_spec() == spec else None
        if systematic is not None and not systematic.at:
            k = max((r.handoffs for r in rs if r.handoffs is not None), default=0)
            failing = sorted((r for r in rs if Outcome(r.outcome).is_failure and r.delayed), key=lambda r: r.trial)
            result = (
                f"first failure in trial {failing[0].trial} (delayed {' + '.join(failing[0].delayed)}); "
                f"{len({r.trial for r in failing})} failing trial(s)"
                if failing
                else "no delayed trial failed"
            )
            lines.append(f"{suite}/{arm}: {coverage(k, trials, pairs=systematic.pairs)}; {result}")
        if acted == 0 and (systematic is None or trials > 1):
            lines.append(
                f"{suite}/{arm}: the perturbation {spec!r} never acted in {trials} trial(s): it proves "
                f"nothing here (none of its points, on the streams it names, is on the tests' path)"
            )
    return lines
