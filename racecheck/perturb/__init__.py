"""Timing perturbation: named injection points along the FSDP path and actions taken there
(delays on a stream, ...), grouped into profiles and installed as a runtime observer."""

from racecheck.perturb.injector import Injector, install_from_env
from racecheck.perturb.profiles import Profile, parse_profile

__all__ = ["Injector", "Profile", "install_from_env", "parse_profile"]
