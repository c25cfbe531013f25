"""Timing perturbation: named injection points along the FSDP path, actions taken there (sleep,
reorder, poison-on-free, allocator pressure), fixed profiles and a seeded random schedule, installed
as a runtime observer (injector.py) or, for code that is not ours, around torch.distributed
(patch.py)."""

from racecheck.perturb.injector import Injector, install, install_from_env, resolve_spec, uninstall
from racecheck.perturb.profiles import PROFILES, Profile, RandomConfig, Rule, parse_profile
from racecheck.perturb.schedule import RandomSchedule, RuleSchedule, make_schedule

__all__ = ["Injector", "PROFILES", "Profile", "RandomConfig", "RandomSchedule", "Rule", "RuleSchedule",
           "install", "install_from_env", "make_schedule", "parse_profile", "resolve_spec", "uninstall"]
