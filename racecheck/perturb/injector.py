"""The injector: a runtime observer that performs a profile's actions at its injection points.

Installed in every rank by the pytest plugin (or from RACECHECK_PERTURB for processes that a
launcher starts). A profile that is off installs nothing, so it costs nothing.
"""

from __future__ import annotations

import os

from racecheck.device import Runtime, RuntimeObserver
from racecheck.perturb.profiles import Profile, parse_profile

ENV_VAR = "RACECHECK_PERTURB"


class Injector(RuntimeObserver):
    def __init__(self, profile: Profile, *, seed: int = 0) -> None:
        self.profile = profile
        self.seed = seed
        self._by_point: dict[str, list] = {}
        for rule in profile.rules:
            self._by_point.setdefault(rule.point, []).append(rule)
        self.fired = 0

    def on_point(self, rt: Runtime, name: str, **context) -> None:
        for rule in self._by_point.get(name, ()):
            if rule.action == "sleep":
                # The delay is enqueued on the stream current at the point, e.g. the
                # reduce-scatter stream before its collective: the host does not wait.
                rt.sleep(rule.seconds)
            self.fired += 1


def install(rt: Runtime, profile: Profile, *, seed: int = 0) -> Injector | None:
    """Attach an injector for `profile` to `rt` (nothing when the profile is off)."""
    if profile.is_off:
        return None
    injector = Injector(profile, seed=seed)
    rt.add_observer(injector)
    return injector


def install_from_env(rt: Runtime) -> Injector | None:
    """Install the profile named by $RACECHECK_PERTURB, if any."""
    return install(rt, parse_profile(os.environ.get(ENV_VAR, "off")))
