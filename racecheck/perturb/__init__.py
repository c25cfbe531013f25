"""Timing perturbation: named injection points along the FSDP path, actions taken there (sleep,
reorder, poison-on-free, allocator pressure), fixed profiles and a seeded random schedule, installed
as a runtime observer (injector.py) or, for code that is not ours, around torch's stream API and
torch.distributed (patch.py, with its systematic schedule in systematic.py).

Names are resolved on first use, so that parsing a profile (profiles.py) does not import torch.
"""

import importlib

_EXPORTS = {
    "Injector": "injector",
    "install": "injector",
    "install_from_env": "injector",
    "resolve_spec": "injector",
    "uninstall": "injector",
    "PROFILES": "profiles",
    "Profile": "profiles",
    "RandomConfig": "profiles",
    "Rule": "profiles",
    "parse_profile": "profiles",
    "SystematicConfig": "profiles",
    "PatchMode": "patch",
    "RandomSchedule": "decisions",
    "RuleSchedule": "decisions",
    "make_schedule": "decisions",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
