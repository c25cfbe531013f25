"""Patch mode: perturb code that is not ours, with no change to it, by wrapping torch's stream and
collective APIs while a test (or a script) runs.

Which stream a delay goes on, per point (always the stream the work after the point runs on):
- stream_enter (torch.cuda.set_stream, and so torch.cuda.stream(s)'s entry, to a non-default
  stream): on the stream just made current, before any work the host enqueues in its context;
- stream_wait (Stream.wait_stream, Stream.wait_event, Event.wait): on the waiting stream, right
  after the wait, so its later work (the consumer of what it waited for) runs late;
- event_record (Event.record, Stream.record_event): on the recording stream, right before the
  record, so the work the event marks completes late and only the event's waiters see it done;
- free (the caching allocator's deallocation callback, torch.cuda._gpu_trace): poison and
  pressure on the freed block's own stream, on entry to the next wrapped call the host makes,
  before that call's own effect (a wait it makes would otherwise order them after the reader);
- before_all_gather / before_reduce_scatter / before_all_reduce: the collectives of
  `torch.distributed` (tensor, list and deprecated forms, synchronous and `async_op=True`), with
  the delay on the stream the collective actually runs on:
  - synchronous (`async_op=False`): since PyTorch 2.8 ProcessGroupNCCL launches it on the caller's
    current stream, so the delay is queued there first. (From 2.2 to 2.7 it ran on the group's
    internal stream, which first waits for the current stream: the delay holds it back all the same.)
  - asynchronous (`async_op=True`): it runs on the group's internal stream, which first waits for
    the current stream. Delaying the current stream would delay the caller's later work as well, so
    the wrapper issues the call from a side stream that waits for the current stream and then
    sleeps: only the collective runs late, the caller's stream runs on.

The allocator calls its deallocation callback before the block is back in its pool, so a free is
only noted there and acted on when the host next enters a wrapped call. Wrapped calls made by patch mode itself (its
delays, its pressure) are passed through: a thread-local flag marks them.

A profile acts only where it names points: `off` wraps nothing at all. The systematic schedule
(systematic.py) wraps every hand-off point and collective; trial 0 records their keys, a later
trial delays the keys it is given. Every action taken is counted in `counts`.

    racecheck.perturb.patch.PatchMode(parse_profile("sleep@stream_enter:2ms")).install()
    RACECHECK_PERTURB=rs_delay torchrun --nproc-per-node 2 -m racecheck.perturb.patch train.py ARGS

Reorder needs the runtime's view of streams and is not offered here.
"""

from __future__ import annotations

import functools
import inspect
import os
import runpy
import sys
import threading

from racecheck.perturb import systematic
from racecheck.perturb.decisions import Hold, Poison, Pressure, Schedule, Sleep, make_schedule
from racecheck.perturb.points import COLLECTIVE_POINTS, EVENT_RECORD, FREE, HANDOFF_POINTS, STREAM_ENTER, STREAM_WAIT
from racecheck.perturb.profiles import Profile, parse_profile

# torch.distributed function -> (collective kind, name of its input argument)
WRAPPED = {
    "all_reduce": ("all_reduce", "tensor"),
    "all_gather": ("all_gather", "tensor"),
    "all_gather_single": ("all_gather", "input_tensor"),
    "all_gather_into_tensor": ("all_gather", "input_tensor"),
    "_all_gather_base": ("all_gather", "input_tensor"),
    "reduce_scatter": ("reduce_scatter", "input_list"),
    "reduce_scatter_single": ("reduce_scatter", "input"),
    "reduce_scatter_tensor": ("reduce_scatter", "input"),
    "_reduce_scatter_base": ("reduce_scatter", "input"),
}
PATCH_POINTS = frozenset(COLLECTIVE_POINTS.values()) | frozenset(HANDOFF_POINTS) | {FREE}
# The kind of a wrapped stream API function (patch_actions.py) -> its point, and whether the delay
# goes before the call (on the recording stream) rather than after it.
HANDOFF_KINDS = {
    "set_stream": (STREAM_ENTER, False),
    "wait_stream": (STREAM_WAIT, False),
    "wait_event": (STREAM_WAIT, False),
    "event_wait": (STREAM_WAIT, False),
    "record_event": (EVENT_RECORD, True),
    "event_record": (EVENT_RECORD, True),
}


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
        bad = [
            r.to_spec()
            for r in profile.rules
            if r.stream
            or not (
                (r.action == "sleep" and r.point in PATCH_POINTS - {FREE})
                or (r.action in ("pressure", "poison") and r.point == FREE)
            )
        ]
        if bad:
            raise ValueError(
                f"patch mode takes sleep@{{{','.join(sorted(PATCH_POINTS - {FREE}))}}} and "
                f"pressure@free / poison@free rules only, not {', '.join(bad)}"
            )
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
        self._collectives = points is None or bool(points & set(COLLECTIVE_POINTS.values()))
        self._handoffs = points is None or bool(points & set(HANDOFF_POINTS))
        self._frees = self.systematic is None and (points is None or FREE in points)
        if self._frees:  # frees are acted on at the next point the host passes: wrap them all
            self._collectives = self._handoffs = True
        self._originals: list[tuple[object, str, object]] = []
        self._local = threading.local()  # `inside`: patch mode's own calls, or a wrapped call's inner ones
        # _freed runs on whatever thread frees, this one included: the allocator calls it from a
        # garbage-collection pass that can start inside _flush_frees's locked section (re-entrant).
        self._lock = threading.RLock()
        self._pending: list[int] = []
        self._labels: dict[object, str] = {}  # stream id -> default, s1, s2, ... (first appearance)
        self.handoffs: dict[str, None] = {}  # systematic recording: keys in order of first passage
        self.calls: dict[str, int] = {}  # collective kind -> wrapped calls seen
        self.passed = 0  # points passed (collectives and hand-offs), acted on or not
        self.counts = {"sleep": 0, "pressure": 0, "poison": 0}  # actions taken

    # -- install / uninstall ---------------------------------------------------------------------
    def install(self) -> PatchMode:
        if self._originals:
            raise RuntimeError("this patch is already installed")
        if self._collectives:
            import torch.distributed as dist
            import torch.distributed.distributed_c10d as c10d

            wrappers: dict[int, object] = {}  # one wrapper per original function, shared by modules
            for module in (dist, c10d):
                for name in WRAPPED:
                    fn = getattr(module, name, None)
                    if fn is None or getattr(fn, "_racecheck_patch", None) is not None:
                        continue
                    wrapper = wrappers.get(id(fn))
                    if wrapper is None:
                        wrapper = wrappers[id(fn)] = self._wrap(name, fn)
                    self._replace(module, name, wrapper)
        if self._handoffs:
            for owner, name, kind in self.actions.handoff_targets():
                fn = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name)
                if fn is not None and getattr(fn, "_racecheck_patch", None) is None:
                    self._replace(owner, name, self._wrap_handoff(kind, fn))
        if self._frees:
            self.actions.attach_free(self._freed)
        return self

    def _replace(self, owner, name: str, wrapper) -> None:
        self._originals.append(
            (owner, name, getattr(owner, name) if not isinstance(owner, type) else owner.__dict__[name])
        )
        setattr(owner, name, wrapper)

    def uninstall(self) -> None:
        if self._frees:
            self.actions.detach_free(self._freed)
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
        call (all_gather_into_tensor -> all_gather_single, wait_stream -> Event.wait) or by patch
        mode itself go straight to the original."""

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if getattr(self._local, "inside", False):
                return fn(*args, **kwargs)
            self._local.inside = True
            try:
                if self._pending:  # before the call: what a next allocation here would collide with
                    self._flush_frees()
                return body(*args, **kwargs)
            finally:
                self._local.inside = False

        wrapper._racecheck_patch = self
        return wrapper

    def _wrap(self, name: str, fn):
        kind, input_name = WRAPPED[name]
        point = COLLECTIVE_POINTS[kind]
        signature = inspect.signature(fn)
        return self._outermost(fn, lambda *a, **kw: self._call(fn, a, kw, kind, point, signature, input_name))

    def _call(self, fn, args, kwargs, kind, point, signature, input_name):
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return fn(*args, **kwargs)  # let the original report the misuse
        if not self.actions.applies(_tensors(bound.arguments.get(input_name))):
            return fn(*args, **kwargs)
        self.calls[kind] = self.calls.get(kind, 0) + 1
        delay = self._decide(point, self.actions.current_stream())
        async_op = bool(bound.arguments.get("async_op", False))
        if delay > 0:
            self.counts["sleep"] += 1
        return self.actions.launch(lambda: fn(*args, **kwargs), delay=delay, async_op=async_op)

    def _wrap_handoff(self, kind: str, fn):
        point, before = HANDOFF_KINDS[kind]

        def body(*args, **kwargs):
            target = _handoff_stream(kind, args, kwargs, self.actions)
            if kind == "set_stream" and (target is None or self.actions.is_default(target)):
                return fn(*args, **kwargs)  # back to the default stream: no hand-off
            if before:
                self._delay(point, target)
                return fn(*args, **kwargs)
            out = fn(*args, **kwargs)
            self._delay(point, target)
            return out

        return self._outermost(fn, body)

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

    def _freed(self, ptr: int) -> None:
        # The allocator's callback: any thread, inside any call; only note the free here. Frees
        # of patch mode's own blocks (its pressure) are not the program's.
        if not getattr(self._local, "inside", False):
            with self._lock:
                self._pending.append(ptr)

    def _flush_frees(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        requests = []
        for ptr in pending:
            acts = self.schedule.actions(FREE, stream="allocation")
            poison = any(isinstance(a, Poison) for a in acts)
            pressure = any(isinstance(a, Pressure) for a in acts)
            if poison or pressure:
                requests.append((ptr, poison, pressure))
        if requests:
            poisoned, pressured = self.actions.on_frees(requests)
            self.counts["poison"] += poisoned
            self.counts["pressure"] += pressured


def _handoff_stream(kind: str, args, kwargs, actions):
    """The stream a wrapped stream API call hands work to (see HANDOFF_KINDS)."""
    if kind == "set_stream":
        return args[0] if args else kwargs.get("stream")
    if kind in ("wait_stream", "wait_event", "record_event"):
        return args[0]  # self: the waiting or recording stream
    stream = args[1] if len(args) > 1 else kwargs.get("stream")  # Event.wait / Event.record
    return stream if stream is not None else actions.current_stream()


def _tensors(value) -> list:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []


def install_from_env() -> PatchMode | None:
    """Install patch mode for $RACECHECK_PERTURB (seeded by $RACECHECK_SEED), if set and not off."""
    from racecheck.perturb.injector import ENV_VAR, env_seed

    profile = parse_profile(os.environ.get(ENV_VAR, "off"))
    if profile.is_off:
        return None
    return PatchMode(profile, seed=env_seed()).install()


def main(argv: list[str] | None = None) -> int:
    """`python -m racecheck.perturb.patch [--perturb SPEC] [--seed N] SCRIPT [ARGS...]`: run SCRIPT
    as __main__ with patch mode installed (under torchrun: `-m racecheck.perturb.patch`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = "usage: python -m racecheck.perturb.patch [--perturb SPEC] [--seed N] SCRIPT [ARGS...]"
    while argv and argv[0].startswith("-"):
        opt = argv.pop(0)
        if opt in ("-h", "--help"):
            print(usage + "\n\n" + __doc__)
            return 0
        if opt not in ("--perturb", "--seed") or not argv:
            print(usage, file=sys.stderr)
            return 2
        os.environ["RACECHECK_PERTURB" if opt == "--perturb" else "RACECHECK_SEED"] = argv.pop(0)
    if not argv:
        print(usage, file=sys.stderr)
        return 2
    if not os.path.isfile(argv[0]):
        print(f"racecheck.perturb.patch: {argv[0]}: no such script", file=sys.stderr)
        return 2
    try:
        install_from_env()
    except ValueError as exc:
        print(f"racecheck.perturb.patch: {exc}", file=sys.stderr)
        return 2
    sys.argv = argv
    runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
