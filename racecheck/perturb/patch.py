"""Patch mode: perturb code that is not ours, with no change to it, by wrapping torch's stream API,
its collectives and the caching allocator's callbacks while a test (or a script) runs.

Where each point acts (always the stream the work after the point runs on):
- the hand-off points, on both sides of each stream API call (handoffs.py: stream_enter,
  before_stream_wait / stream_wait, event_record / after_event_record);
- before_all_gather / before_reduce_scatter / before_all_reduce, and their after_* points: every
  collective, through the ProcessGroup methods and the functional collectives (collectives.py;
  the latter through a kernel at the dispatcher, op_kernels.py, so the ops stay ops).
  The before delay goes on the stream the collective actually runs on:
  - synchronous (`async_op=False`): since PyTorch 2.8 ProcessGroupNCCL launches it on the caller's
    current stream, so the delay is queued there first. (From 2.2 to 2.7 it ran on the group's
    internal stream, which first waits for the current stream: the delay holds it back all the same.)
  - asynchronous (`async_op=True`, functional collectives): it runs on the group's internal
    stream, which first waits for the current stream. Delaying the current stream would delay the
    caller's later work as well, so the actions issue the call from a side stream that waits for
    the current stream and then sleeps: only the collective runs late.
  The after delay goes on the caller's current stream, behind the call: its next work runs late.
- free (poison@free, pressure@free): the caching allocator's deallocation callback notes the
  block; the action happens at the program's next allocation on the block's own stream, if the
  block is still free there ([Note: sound allocator actions], free_actions.py).

Calls made inside a wrapped call (all_gather_into_tensor -> the group's method, wait_stream ->
Event.wait) and patch mode's own work (its delays, poison and pressure) pass through unwrapped:
thread-local flags mark them.

A profile acts only where it names points: `off` wraps nothing at all. The systematic schedule
(systematic.py) wraps every hand-off point and collective; trial 0 records their keys, a later
trial delays the keys it is given. Every action taken is counted in `counts`.

    racecheck.perturb.patch.PatchMode(parse_profile("sleep@stream_enter:2ms")).install()
    torchrun --nproc-per-node 2 -m racecheck.perturb.patch --perturb rs_delay train.py ARGS
    RACECHECK_PERTURB=rs_delay torchrun --nproc-per-node 2 -m racecheck.perturb.patch train.py ARGS

Reorder needs the runtime's view of streams and is not offered here.
"""

from __future__ import annotations

import functools
import os
import runpy
import sys
import threading

from racecheck.perturb import collectives, systematic
from racecheck.perturb.decisions import Hold, Poison, Pressure, Schedule, Sleep, make_schedule
from racecheck.perturb.free_actions import FreeRequest, PendingFrees
from racecheck.perturb.handoffs import CALLS, HandoffCall
from racecheck.perturb.op_kernels import OpKernels, is_traced
from racecheck.perturb.points import COLLECTIVE_AFTER_POINTS, COLLECTIVE_POINTS, FREE, HANDOFF_POINTS
from racecheck.perturb.profiles import Profile, check_where, parse_profile

_COLLECTIVE_POINTS = frozenset(COLLECTIVE_POINTS.values()) | frozenset(COLLECTIVE_AFTER_POINTS.values())
PERTURB_VAR, SEED_VAR = "RACECHECK_PERTURB", "RACECHECK_SEED"  # the launcher's defaults (main)


class PatchMode:
    """Wraps torch's stream API and collectives while installed (a context manager too).

    `plan` is for the systematic schedule only: None records the hand-off keys the code passes
    (trial 0; `handoffs` after the run), a tuple of keys delays exactly those (a later trial);
    `at=` in the profile gives the plan itself. `actions` defaults to CudaActions."""

    def __init__(
        self,
        profile: Profile,
        *,
        seed: int = 0,
        rank: int | None = None,
        actions=None,
        plan: tuple[str, ...] | None = None,
    ) -> None:
        check_where(profile, patch_mode=True)
        if rank is None:
            rank = int(os.environ.get("RANK", "0"))
        if actions is None:
            from racecheck.perturb.patch_actions import CudaActions

            actions = CudaActions()
        self.profile = profile
        self.actions = actions
        self.systematic = profile.systematic
        # The systematic schedule decides in _decide from its plan; the rest through a Schedule.
        self.schedule = make_schedule(profile, seed=seed, rank=rank) if self.systematic is None else Schedule()
        if self.systematic is not None and self.systematic.at:
            plan = self.systematic.at
        self.plan = plan  # systematic: the keys delayed in this run (None: recording)
        points = None if self.systematic is not None else self.schedule.points
        self._collectives = points is None or bool(points & _COLLECTIVE_POINTS)
        self._handoffs = points is None or bool(points & set(HANDOFF_POINTS))
        self._frees = self.systematic is None and (points is None or FREE in points)
        self._originals: list[tuple[object, str, object]] = []
        self._kernels: list[OpKernels] = []  # the functional collectives' dispatcher kernels
        # `inside`: a wrapped call's inner calls; `acting`: patch mode's own allocator work.
        self._local = threading.local()
        self._pending = PendingFrees()  # by the freed block's stream id
        self._alloc_streams: dict[int, object] = {}  # block address -> stream id at its allocation
        self._labels: dict[object, str] = {}  # stream id -> default, s1, s2, ... (first appearance)
        self.handoffs: dict[str, None] = {}  # systematic recording: keys in order of first passage
        self.calls: dict[str, int] = {}  # collective kind -> wrapped calls seen
        self.passed = 0  # points passed (collectives and hand-offs), acted on or not
        self.counts = {"sleep": 0, "pressure": 0, "poison": 0}  # actions taken

    # -- install / uninstall ---------------------------------------------------------------------
    def install(self) -> PatchMode:
        if self._originals or self._kernels:
            raise RuntimeError("this patch is already installed")
        if self._collectives:
            for owner, name, call in collectives.process_group_targets():
                fn = getattr(owner, name)
                if getattr(fn, "_racecheck_patch", None) is None:
                    self._replace(owner, name, self._outermost(fn, functools.partial(self._collective, fn, call)))
            for namespace, ops in collectives.functional_targets().items():
                kernels = OpKernels(namespace, ops, self._functional)
                if kernels.install():  # else an enclosing patch mode holds them
                    self._kernels.append(kernels)
        if self._handoffs:
            for owner, name, kind in self.actions.handoff_targets():
                fn = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name)
                if fn is not None and getattr(fn, "_racecheck_patch", None) is None:
                    self._replace(owner, name, self._outermost(fn, functools.partial(self._handoff, fn, CALLS[kind])))
        if self._frees:
            self.actions.attach_allocator(self._allocated, self._freed)
        return self

    def _replace(self, owner, name: str, wrapper) -> None:
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        self._originals.append((owner, name, original))
        setattr(owner, name, wrapper)

    def uninstall(self) -> None:
        if self._frees:
            self.actions.detach_allocator(self._allocated, self._freed)
            self._pending.clear()
            self._alloc_streams.clear()
        for kernels in reversed(self._kernels):
            kernels.uninstall()
        self._kernels.clear()
        for owner, name, fn in reversed(self._originals):
            setattr(owner, name, fn)
        self._originals.clear()

    def __enter__(self) -> PatchMode:
        return self.install()

    def __exit__(self, *exc) -> None:
        self.uninstall()

    # -- the wrappers ----------------------------------------------------------------------------
    def _outermost(self, fn, body):
        """A wrapper that runs `body` for the outermost call only: calls made inside a wrapped
        call or by patch mode itself go straight to the original."""

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if getattr(self._local, "inside", False):
                return fn(*args, **kwargs)
            self._local.inside = True
            try:
                return body(*args, **kwargs)
            finally:
                self._local.inside = False

        wrapper._racecheck_patch = self
        return wrapper

    def _functional(self, call: collectives.CollectiveCall, args: tuple, kwargs: dict, continue_call):
        """A functional collective's kernel (op_kernels.py): the outermost real call is a
        collective of patch mode's; a traced one, or one inside a wrapped call, runs as it is."""
        if getattr(self._local, "inside", False) or is_traced(call.tensors(args)):
            return continue_call()
        self._local.inside = True
        try:
            return self._collective(lambda *_args, **_kwargs: continue_call(), call, *args, **kwargs)
        finally:
            self._local.inside = False

    def _collective(self, fn, call: collectives.CollectiveCall, *args, **kwargs):
        if not self.actions.applies(call.tensors(args)):
            return fn(*args, **kwargs)
        self.calls[call.kind] = self.calls.get(call.kind, 0) + 1
        current = self.actions.current_stream()
        delay = self._decide(COLLECTIVE_POINTS[call.kind], current)
        if delay > 0:
            self.counts["sleep"] += 1
        out = self.actions.launch(lambda: fn(*args, **kwargs), delay=delay, async_op=call.is_async(args, kwargs))
        self._delay(COLLECTIVE_AFTER_POINTS[call.kind], current)  # the caller's next work
        return out

    def _handoff(self, fn, call: HandoffCall, *args, **kwargs):
        target = call.target(args, kwargs, self.actions)
        if call.entry and (target is None or self.actions.is_default(target)):
            return fn(*args, **kwargs)  # back to the default stream: no hand-off
        if call.before is not None:
            self._delay(call.before, target)
        out = fn(*args, **kwargs)
        if call.after is not None:
            self._delay(call.after, target)
        return out

    # -- decisions -------------------------------------------------------------------------------
    def _delay(self, point: str, stream) -> None:
        seconds = self._decide(point, stream)
        if seconds > 0:
            self.actions.delay(stream, seconds)
            self.counts["sleep"] += 1

    def _label(self, stream) -> str:
        sid = self.actions.stream_id(stream)
        label = self._labels.get(sid)
        if label is None:
            label = (
                "default"
                if self.actions.is_default(stream)
                else f"s{sum(1 for v in self._labels.values() if v != 'default') + 1}"
            )
            self._labels[sid] = label
        return label

    def _decide(self, point: str, stream) -> float:
        """The delay at this passage of `point` (0: none)."""
        self.passed += 1
        label = self._label(stream)
        if self.systematic is None:
            # A hold (the random schedule's priority change) is a delay of its bound: a CUDA stream
            # cannot wait for the host, as in the injector on CUDA.
            return sum(a.seconds for a in self.schedule.actions(point, stream=label) if isinstance(a, (Sleep, Hold)))
        key = systematic.handoff_key(point, systematic.location(), label)
        if self.plan is None:
            self.handoffs.setdefault(key, None)
            return 0.0
        return self.systematic.delay if key in self.plan else 0.0

    # -- frees: see [Note: sound allocator actions] ------------------------------------------------
    def _allocated(self, ptr: int) -> None:
        # The allocator's callback, on the allocating thread: its current stream is the block's.
        if getattr(self._local, "acting", False):
            return
        sid = self.actions.current_stream_id()
        self._alloc_streams[ptr] = sid
        if self._pending.has(sid) or self._pending.has(None):
            self._act_on_frees(sid)

    def _freed(self, ptr: int) -> None:
        # Any thread, inside any call: only note the free (and decide, so a seed replays).
        if getattr(self._local, "acting", False):
            return  # patch mode's own pressure blocks are not the program's
        sid = self._alloc_streams.pop(ptr, None)  # None: allocated before patch mode was installed
        acts = self.schedule.actions(FREE, stream="allocation")
        poison = any(isinstance(a, Poison) for a in acts)
        pressure = any(isinstance(a, Pressure) for a in acts)
        if poison or pressure:
            self._pending.note(sid, FreeRequest(ptr, 0, poison, pressure))

    def _act_on_frees(self, sid) -> None:
        """The program allocated on stream `sid`: act on the blocks freed to its pool that are
        still free there (free_actions.PendingFrees.ready)."""
        local = self._local
        was_inside = getattr(local, "inside", False)
        local.acting = local.inside = True
        try:
            ready, _ = self._pending.ready(sid, self.actions.pool_view())
            for request, start, nbytes in ready:
                if request.poison:
                    self.actions.poison(start, nbytes, sid)
                    self.counts["poison"] += 1
                if request.pressure:
                    self.actions.pressure(nbytes, sid)
                    self.counts["pressure"] += 1
        finally:
            local.acting = False
            local.inside = was_inside


def main(argv: list[str] | None = None) -> int:
    """`python -m racecheck.perturb.patch [--perturb SPEC] [--seed N] SCRIPT [ARGS...]`: run SCRIPT
    as __main__ with patch mode installed (under torchrun: `-m racecheck.perturb.patch`); SPEC and
    N default to $RACECHECK_PERTURB and $RACECHECK_SEED, so that a launcher's environment can set
    them for every rank."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m racecheck.perturb.patch", description="Run a script with patch mode installed."
    )
    perturb, seed = os.environ.get(PERTURB_VAR) or "off", os.environ.get(SEED_VAR) or "0"
    parser.add_argument("--perturb", default=perturb, metavar="SPEC", help=f"the profile (${PERTURB_VAR}, else off)")
    parser.add_argument("--seed", default=seed, metavar="N", help=f"the schedule's seed (${SEED_VAR}, else 0)")
    parser.add_argument("script", help="the script, run as __main__")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if not args.seed.lstrip("-").isdigit():
        parser.error(f"--seed (or ${SEED_VAR}) must be a whole number, got {args.seed!r}")
    if not os.path.isfile(args.script):
        parser.error(f"{args.script}: no such script")
    from racecheck.perturb.patch_actions import PatchUnavailable, actions_factory

    try:
        profile = parse_profile(args.perturb)
        if not profile.is_off:
            hint = "run the script without patch mode, or on a CUDA machine"
            actions = actions_factory(need=f"the profile {profile.to_spec()!r}", hint=hint)()
            PatchMode(profile, seed=int(args.seed), actions=actions).install()
    except (ValueError, PatchUnavailable) as exc:
        parser.error(str(exc))
    sys.argv = [args.script, *args.args]
    runpy.run_path(args.script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
