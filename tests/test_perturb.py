"""The perturbation component on the CPU emulation: profile parsing, each action's effect on the
runtime, the random schedule's determinism from a seed, and configuration from the environment.

Orderings are forced with host-held gates and delays much longer than the host's own steps; no
test asserts on wall time.
"""

from __future__ import annotations

import re
import threading

import pytest
import torch

from racecheck.device.sim import SimRuntime
from racecheck.perturb.decisions import Hold, Poison, Pressure, RandomSchedule, Sleep
from racecheck.perturb.injector import Injector, install, uninstall
from racecheck.perturb.profiles import PROFILES, RandomConfig, Rule, parse_profile

GATE_TIMEOUT_S = 10.0


def held_read(gate: threading.Event, seen: list):
    """Queued work that waits for the host's gate, then reads its input."""
    return lambda src: (gate.wait(GATE_TIMEOUT_S), seen.append(src.clone()))


# -- profiles ---------------------------------------------------------------------------------------
def test_every_named_profile_parses():
    for name in PROFILES:
        profile = parse_profile(name)
        assert profile.is_off == (name == "off")


def test_rule_fields_and_round_trip():
    profile = parse_profile(
        "sleep@before_reduce_scatter:5ms, reorder@before_all_reduce>end_of_backward:20ms/"
        "all_reduce,poison@free,pressure@free,sleep@event_wait:250us"
    )
    assert profile.rules == (
        Rule("sleep", "before_reduce_scatter", 0.005),
        Rule("reorder", "before_all_reduce", 0.02, until="end_of_backward", stream="all_reduce"),
        Rule("poison", "free", 0.01),
        Rule("pressure", "free", 0.01),
        Rule("sleep", "event_wait", 250e-6),
    )
    assert parse_profile(profile.to_spec()).rules == profile.rules


@pytest.mark.parametrize(
    "spec, words",
    [
        ("jump@free", "unknown perturbation action"),
        ("sleep@nowhere:1ms", "unknown injection point"),
        ("poison@before_all_gather", "poison@free"),
        ("reorder@before_all_reduce:1ms", "opens its gate"),
        ("sleep@reshard>end_of_backward:1ms", "reorder rules only"),
        ("poison@free/default", "own stream"),
        ("pressure@free/default", "own stream"),
        ("random,poison", "schedule of its own"),
        ("sleep@reshard:5parsecs", "ACTION@POINT"),
        ("random:depth=0", "depth"),
        ("random:speed=3", "unknown random schedule option"),
        ("random:max=3", "max"),
        ("sleep@reshard:1.2.3ms", "ACTION@POINT"),
        ("random:sleep=abc", "bad value 'abc' for random schedule option 'sleep'"),
        ("random:sleep=nan", "bad value 'nan' for random schedule option 'sleep'"),
        (",,,", "',,,' names no perturbation rule; write 'off' for none"),
        ("sleep@reshard:3601s", "3601s is longer than an hour, the longest delay racecheck takes"),
        ("sleep@reshard:1e99s", "1e99s is longer than an hour"),
        ("reorder@before_all_reduce>end_of_backward:4e6ms", "4e6ms is longer than an hour"),
        ("random:max=7200s", "random schedule option 'max': 7200s is longer than an hour"),
        ("systematic:delay=90000s", "systematic schedule option 'delay': 90000s is longer than an hour"),
        ("sleep@reshard:nanms", "ACTION@POINT"),
    ],
)
def test_bad_specs_say_why(spec, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        parse_profile(spec)


def test_spec_text_given_to_the_runner_must_name_a_profile():
    for blank in ("", "  "):
        with pytest.raises(ValueError, match="is no profile; write 'off' for none"):
            parse_profile(blank)
    assert parse_profile("off").is_off


@pytest.mark.parametrize("seconds", [0.0, 1e-15, 2.5e-7, 0.0123456, 3600.0])
def test_every_delay_the_run_may_resize_to_reads_back_in_its_ranks(seconds):
    # The ranks parse the canonical spec the runner writes: `1e-09us` must read back as it was.
    for name in ("rs_delay", "random", "systematic"):
        spec = parse_profile(name).with_delay(seconds).to_spec()
        assert parse_profile(spec).to_spec() == spec
    rule = parse_profile(parse_profile("rs_delay").with_delay(seconds).to_spec()).rules[0]
    assert rule.seconds == pytest.approx(seconds, rel=1e-5)


def test_random_spec_options_and_delay_resize():
    profile = parse_profile("random:max=2ms:depth=5:poison=0.5")
    assert profile.random == RandomConfig(max_delay=0.002, depth=5, poison=0.5)
    assert parse_profile(profile.to_spec()).random == profile.random
    assert profile.with_delay(0.01).random.max_delay == 0.01
    assert parse_profile("rs_delay").with_delay(0.001).rules[0].seconds == 0.001


# -- actions on the emulation -----------------------------------------------------------------------
def test_sleep_delays_the_points_stream_not_the_host(rt):
    side, log = rt.new_stream("reduce_scatter"), []
    install(rt, parse_profile("sleep@before_reduce_scatter:200ms"))
    with rt.stream(side):
        rt.point("before_reduce_scatter")
        rt.launch("after", lambda: log.append("side"))
    log.append("host")  # the side stream is still asleep
    side.synchronize()
    assert log == ["host", "side"]


def test_sleep_on_a_named_stream(rt):
    side, other, log = rt.new_stream("reduce_scatter"), rt.new_stream("all_reduce"), []
    install(rt, parse_profile("sleep@before_reduce_scatter:200ms/all_reduce"))
    with rt.stream(other):
        rt.launch("seen", lambda: None)  # the injector learns the stream by name
    with rt.stream(side):
        rt.point("before_reduce_scatter")
        rt.launch("side", lambda: log.append("side"))
    with rt.stream(other):
        rt.launch("other", lambda: log.append("other"))
    side.synchronize()
    log.append("host")
    other.synchronize()
    assert log == ["side", "host", "other"]


def test_reorder_holds_the_stream_until_the_opening_point(rt):
    side, log = rt.new_stream("all_reduce"), []
    inj = install(rt, parse_profile("reorder@before_all_reduce>end_of_backward:10s"))
    with rt.stream(side):
        rt.point("before_all_reduce")
        rt.launch("held", lambda: log.append("side"))
    rt.point("reshard")  # not the opening point: still held
    side_ran_early = threading.Event()
    with rt.stream(rt.new_stream("probe")) as probe:
        rt.launch("probe", lambda: side_ran_early.set() if log else None)
    probe.synchronize()
    assert not side_ran_early.is_set()
    log.append("host")
    rt.point("end_of_backward")  # opens the gate
    side.synchronize()
    assert log == ["host", "side"]
    assert [type(f.action) for f in inj.log] == [Hold]


def test_a_hold_the_inline_default_stream_cannot_take_is_skipped_not_logged(rt):
    """The emulation's default stream runs on the host: a hold there is skipped and counted so, and
    it is no action of the trial's (the log and the records' actions count what acted)."""
    inj = install(rt, parse_profile("reorder@before_all_reduce>end_of_backward:10s"))
    rt.point("before_all_reduce")  # on the default stream
    rt.point("end_of_backward")
    assert (inj.log, inj.skipped) == ([], {"hold_inline": 1})


def test_uninstall_opens_held_gates(rt):
    side = rt.new_stream("all_reduce")
    inj = install(rt, parse_profile("reorder@before_all_reduce>end_of_backward:10s"))
    with rt.stream(side):
        rt.point("before_all_reduce")
    uninstall(rt, inj)
    side.synchronize()  # returns at once: no 10 s hold left behind
    assert inj not in rt.observers


def _late_read_under_poison(rt):
    """poison@free installed; a buffer filled on the default stream and a read of it queued on a
    side stream, held until the returned gate is set: (side stream, gate, what the read saw, buffer)."""
    side, gate, seen = rt.new_stream("reduce_scatter"), threading.Event(), []
    install(rt, parse_profile("poison@free"))
    with rt.stream(rt.default_stream()):
        a = rt.empty(256)
        a.fill_(3.0)
    with rt.stream(side):
        rt.launch("late_read", held_read(gate, seen), reads=(a,))
    return side, gate, seen, a


def _floats(rt, ptr: int, n: int = 256):
    return torch.from_numpy(rt.allocator.segment_bytes(ptr, 4 * n)).view(torch.float32)


def test_poison_waits_for_the_next_allocation_on_the_blocks_stream(rt):
    side, gate, seen, a = _late_read_under_poison(rt)
    ptr = a.data_ptr()
    del a  # freed while the read is queued: only noted
    rt.point("reshard")  # a host step is no allocation
    with rt.stream(side):
        rt.empty(64)  # nor is one on another stream's pool
    assert (_floats(rt, ptr) == 3.0).all()
    rt.empty(4096)  # the default stream allocates (too big for a's block): the poison lands now
    assert torch.isnan(_floats(rt, ptr)).all()
    gate.set()
    side.synchronize()
    assert torch.isnan(seen[0]).all()  # the late reader sees what a reuse would have left


def test_poison_comes_after_the_wait_the_program_makes_before_it_allocates(rt):
    """FSDP2's pattern: a block of stream S's pool is freed on the host while stream R may still
    read it, and S is made to wait for R before S next allocates: correct code, which the poison
    must not fail (at the free it would land ahead of that wait)."""
    s, r = rt.new_stream("copy_in"), rt.new_stream("reader")
    gate, seen = threading.Event(), []
    inj = install(rt, parse_profile("poison@free"))
    with rt.stream(s):
        x = rt.empty(256)
        rt.launch("write", lambda out: out.fill_(3.0), writes=(x,))
    r.wait_stream(s)
    with rt.stream(r):
        rt.launch("late_read", held_read(gate, seen), reads=(x,))
    del x  # on the default stream's thread, while the read is queued
    s.wait_stream(r)  # the program orders S after the read ...
    with rt.stream(s):
        rt.empty(256)  # ... before it allocates on S again (and may be handed x's block)
        rt.empty(4096)
    gate.set()
    rt.synchronize()
    assert (seen[0] == 3.0).all()
    assert [type(f.action) for f in inj.log] == [Poison]  # it acted, behind the wait


def test_poison_respects_record_stream(rt):
    side, gate, seen, a = _late_read_under_poison(rt)
    rt.record_stream(a, side)
    ptr = a.data_ptr()
    del a  # held out of the pool until the side stream passes the free
    rt.empty(4096)  # an allocation on the block's stream while it is held: nothing to act on
    assert (_floats(rt, ptr) == 3.0).all()
    gate.set()
    side.synchronize()
    assert (seen[0] == 3.0).all()
    rt.empty(4096)  # the block is back in the pool: the poison lands at this allocation
    assert torch.isnan(_floats(rt, ptr)).all()


def test_pressure_reuses_the_freed_block_at_the_next_allocation_on_its_stream(rt):
    side, gate, seen = rt.new_stream("reduce_scatter"), threading.Event(), []
    inj = install(rt, parse_profile("pressure@free"))
    with rt.stream(rt.default_stream()):
        a = rt.empty(256)
        a.fill_(3.0)
    with rt.stream(side):
        rt.launch("late_read", held_read(gate, seen), reads=(a,))
    reuses = rt.allocator.stats.reuses
    del a
    rt.point("reshard")
    assert rt.allocator.stats.reuses == reuses  # no allocation yet, no pressure
    rt.empty(4096)  # the pressure allocation follows this one, on the same stream
    assert rt.allocator.stats.reuses == reuses + 1
    gate.set()
    side.synchronize()
    assert torch.isnan(seen[0]).all()
    assert [type(f.action) for f in inj.log] == [Pressure]


def test_an_off_injector_does_nothing(rt):
    assert install(rt, parse_profile("off")) is None
    inj = Injector(parse_profile("off"))
    rt.add_observer(inj)
    side = rt.new_stream("reduce_scatter")
    with rt.stream(side):
        rt.point("before_reduce_scatter")
        a = rt.empty(64)
    del a
    side.synchronize()
    assert inj.log == [] and inj._step == 0


# -- the random schedule ----------------------------------------------------------------------------
PROGRAM = [
    ("before_all_gather", "all_gather"),
    ("event_wait", "default"),
    ("free", "all_gather"),
    ("before_reduce_scatter", "reduce_scatter"),
    ("free", "default"),
    ("before_all_reduce", "all_reduce"),
    ("reshard", "default"),
    ("end_of_backward", "default"),
] * 20


def decisions(seed: int, rank: int = 0) -> list:
    schedule = RandomSchedule(RandomConfig(), seed=seed, rank=rank)
    return [tuple(schedule.actions(p, stream=s)) for p, s in PROGRAM]


def test_random_schedule_is_a_function_of_seed_and_rank():
    assert decisions(7) == decisions(7)
    assert decisions(7) != decisions(8)
    assert decisions(7, rank=0) != decisions(7, rank=1)
    kinds = {type(a) for step in decisions(7) for a in step}
    assert kinds == {Sleep, Hold, Poison, Pressure}


def test_random_schedule_draws_per_point_not_per_interleaving():
    """The k-th free gets the same poison/pressure draw however other points interleave."""
    a = RandomSchedule(RandomConfig(), seed=3)
    b = RandomSchedule(RandomConfig(), seed=3)
    frees_a = [a.actions("free", stream="default") for _ in range(30)]
    frees_b = []
    for _ in range(30):
        b.actions("reshard", stream="default")
        frees_b.append(b.actions("free", stream="default"))
    assert frees_a == frees_b


def test_random_injector_replays_from_its_seed(rt):
    def run(seed: int) -> list:
        runtime = SimRuntime()
        try:
            inj = install(runtime, parse_profile("random:max=1ms"), seed=seed)
            side = runtime.new_stream("reduce_scatter")
            for _ in range(20):
                with runtime.stream(side):
                    runtime.point("before_reduce_scatter")
                    t = runtime.empty(128)
                    runtime.point("after_reduce_scatter")
                del t
                runtime.default_stream().wait_stream(side)
            uninstall(runtime, inj)
            return [(f.step, f.point, f.stream, f.action) for f in inj.log]
        finally:
            runtime.close()

    first = run(11)
    assert first and first == run(11)
    assert first != run(12)
