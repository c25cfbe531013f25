"""Timing perturbation: named injection points along the FSDP path, actions taken there (sleep,
reorder, poison-on-free, allocator pressure), fixed profiles and a seeded random schedule, installed
as a runtime observer (injector.py) or, for code that is not ours, around torch's stream API and
torch.distributed (patch.py, with its systematic schedule in systematic.py).

Parsing a profile (profiles.py) imports no torch: the command line and the plugin parse specs
before a test imports it.
"""
