"""The injector: a runtime observer that performs a schedule's actions at the injection points.

Installed around every test of the catalogue's scenarios by the per-test harness
(racecheck.rank.harness), with the profile of the test's block (resolved by the runner: the arm's
own, else `racecheck run --perturb/--no-perturb`, else the suite's `default_perturb`) or, without
one, the scenario's default; the seed is --racecheck-seed plus the trial.

How each action is carried out (identically on both backends, through the Runtime interface):
- sleep: `Runtime.sleep` under the target stream, so the delay is queued work on that stream
  (the CPU emulation's worker sleeps; CUDA runs a calibrated `torch.cuda._sleep`).
- reorder: a gate task queued on the target stream blocks it until the host reaches the opening
  point (or `steps` further host steps), at most the hold's bound; a host synchronization on the
  held stream waits for the gate like any other queued work. A CUDA stream cannot wait for the
  host, so there the gate is a delay of its bound; an inline stream (the emulation's default
  stream is the host itself) is never held.
- poison and pressure: noted at the free and done at the program's next allocation on the freed
  block's own stream, if the block is still free in that stream's pool then ([Note: sound
  allocator actions], free_actions.py): poison fills it with NaN there (`Runtime.poison`), pressure
  allocates its size there and writes it, as the program's next owner of the block would.

An injector whose profile is off subscribes to no event (RuntimeObserver.events): installed, it
costs the runtime nothing; bench/injector_overhead.py measures it.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Sequence

from racecheck.device import Runtime, RuntimeObserver, Stream
from racecheck.device.base import POISON_BYTE
from racecheck.perturb.decisions import Hold, Poison, Pressure, Sleep, make_schedule
from racecheck.perturb.free_actions import FreeRequest, PendingFrees
from racecheck.perturb.points import EVENT_WAIT, FREE
from racecheck.perturb.profiles import Profile

LOG_LIMIT = 10_000  # fired actions kept per injector (the replay aid, not a trace)


@dataclasses.dataclass(frozen=True)
class Fired:
    """One action taken: after `step` host steps (marked points and event waits), at `point`, on
    `stream`. The injector's `log` of these is what a seed replays."""

    step: int
    point: str
    stream: str
    action: object


class _Gate:
    """A reorder's gate: the held stream's worker waits on `flag`."""

    def __init__(self, *, until: str | None, steps: int | None, seconds: float) -> None:
        self.until = until
        self.steps_left = steps
        self.deadline = time.monotonic() + seconds
        self.flag = threading.Event()

    def wait(self) -> None:
        self.flag.wait(max(0.0, self.deadline - time.monotonic()))

    def step(self, point: str) -> bool:
        """The host reached `point`; True when this gate opens there."""
        if self.until is not None and point == self.until:
            return True
        if self.steps_left is not None:
            self.steps_left -= 1
            return self.steps_left <= 0
        return False


def current_rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


class Injector(RuntimeObserver):
    def __init__(self, profile: Profile, *, seed: int = 0, rank: int | None = None) -> None:
        self.profile = profile
        self.seed = seed
        self.rank = current_rank() if rank is None else rank
        self.schedule = make_schedule(profile, seed=seed, rank=self.rank)
        points = self.schedule.points
        self._all_points = points is None
        self._points = frozenset() if points is None else points
        self._active = not profile.is_off
        self._named = profile.random is None and any(r.stream for r in profile.rules)
        self._streams: dict[str, Stream] = {}  # streams seen so far, for actions on a named stream
        self._gates: list[_Gate] = []
        self._frees = PendingFrees()  # by the freed block's stream, see [Note: sound allocator actions]
        self._lock = threading.RLock()  # re-entered when a finalizer frees a block inside a callback
        self._inside = threading.local()  # set while the injector itself calls the runtime
        self._step = 0
        self.log: list[Fired] = []
        self.skipped: dict[str, int] = {}  # action kind -> times it could not be carried out

    # -- observer callbacks --------------------------------------------------------------------
    def events(self):
        # Switched off, the injector subscribes to nothing: the runtime never calls it.
        return super().events() if self._active else ()

    def on_point(self, rt: Runtime, name: str, **context) -> None:
        if not self._active or getattr(self._inside, "on", False):
            return
        self._host_step(rt, name)
        if self._all_points or name in self._points:
            self._perform(rt, name, rt.current_stream())

    def on_event_wait(self, rt: Runtime, *, event, stream: Stream) -> None:
        if not self._active or getattr(self._inside, "on", False):
            return
        self._host_step(rt, EVENT_WAIT)
        if self._all_points or EVENT_WAIT in self._points:
            self._perform(rt, EVENT_WAIT, stream)

    def on_free(
        self, rt: Runtime, *, block: int, stream: Stream, ptr: int, nbytes: int, deferred_to: Sequence[Stream]
    ) -> None:
        if not self._active or getattr(self._inside, "on", False):
            return  # frees of the injector's own pressure blocks are not the program's
        if not (self._all_points or FREE in self._points):
            return
        poison = pressure = False
        for action in self.schedule.actions(FREE, stream=stream.name):
            if isinstance(action, Poison):
                poison = True
            elif isinstance(action, Pressure):
                pressure = True
            else:  # a delay is sound anywhere: it only postpones one stream's work
                self._act(rt, action, FREE, rt.current_stream())
        if poison or pressure:
            # Acted on at the next allocation on the block's stream (on_alloc), not here.
            self._frees.note(stream, FreeRequest(ptr, nbytes, poison, pressure))

    def on_alloc(self, rt: Runtime, *, block: int, stream: Stream, ptr: int, nbytes: int) -> None:
        if self._active and self._frees.has(stream) and not getattr(self._inside, "on", False):
            self._act_on_frees(rt, stream)

    def on_launch(self, rt: Runtime, *, stream: Stream, **kwargs) -> None:
        if self._named and not getattr(self._inside, "on", False):
            self._streams.setdefault(stream.name, stream)

    def on_event_record(self, rt: Runtime, *, event, stream: Stream) -> None:
        if self._named:
            self._streams.setdefault(stream.name, stream)

    # -- actions -------------------------------------------------------------------------------
    def _host_step(self, rt: Runtime, point: str) -> None:
        """Count a host step and open the gates that wait for it."""
        self._step += 1
        if self._gates:
            with self._lock:
                opened = [g for g in self._gates if g.step(point)]
                self._gates = [g for g in self._gates if g not in opened]
            for g in opened:
                g.flag.set()

    def _perform(self, rt: Runtime, point: str, stream: Stream) -> None:
        if self._named:
            self._streams.setdefault(stream.name, stream)
        for action in self.schedule.actions(point, stream=stream.name):
            self._act(rt, action, point, stream)

    def _act(self, rt: Runtime, action, point: str, stream: Stream) -> None:
        target = self._target(rt, action, stream)
        if target is None:
            self.skipped["unknown_stream"] = self.skipped.get("unknown_stream", 0) + 1
            return
        if isinstance(action, Sleep):
            with self._as_injector(), rt.stream(target):
                rt.sleep(action.seconds)
        elif isinstance(action, Hold):
            if not self._hold(rt, target, action):
                return  # not taken: no action of the trial's (its records count what acted)
        else:  # poison and pressure act on frees only (profiles.parse_profile enforces it)
            raise AssertionError(f"{action!r} at {point}")
        self._record(point, target, action)

    def _target(self, rt: Runtime, action, stream: Stream) -> Stream | None:
        name = getattr(action, "stream", None)
        if name is None or name == stream.name:
            return stream
        if name == rt.default_stream().name:
            return rt.default_stream()
        return self._streams.get(name)

    def _hold(self, rt: Runtime, stream: Stream, hold: Hold) -> bool:
        """Hold `stream`; False where it cannot be held (the emulation's inline default stream)."""
        if stream.inline:
            # The emulation runs its default stream on the host: holding it would hold the host
            # that must reach the opening point.
            self.skipped["hold_inline"] = self.skipped.get("hold_inline", 0) + 1
            return False
        if not stream.runs_host_work:  # CUDA: no stream can wait for the host; hold for the bound
            with self._as_injector(), rt.stream(stream):
                rt.sleep(hold.seconds)
            return True
        gate = _Gate(until=hold.until, steps=hold.steps, seconds=hold.seconds)
        with self._lock:
            self._gates.append(gate)
        # Host -> held stream: the stream's worker blocks in gate.wait until the host opens it.
        stream.enqueue(gate.wait)
        return True

    def open_gates(self) -> None:
        with self._lock:
            gates, self._gates = self._gates, []
        for g in gates:
            g.flag.set()

    def _act_on_frees(self, rt: Runtime, stream: Stream) -> None:
        """The program allocated on `stream`: poison and pressure its freed blocks that are still
        in its pool (free_actions.PendingFrees.ready)."""
        ready, taken = self._frees.ready(stream, rt.pool_view())
        if taken:
            self.skipped["free_taken"] = self.skipped.get("free_taken", 0) + taken
        with self._as_injector(), rt.stream(stream):
            for request, start, nbytes in ready:
                if request.poison:
                    try:
                        rt.poison(start, nbytes, stream=stream)
                    except NotImplementedError:
                        self.skipped["poison_unsupported"] = self.skipped.get("poison_unsupported", 0) + 1
                    else:
                        self._record(FREE, stream, Poison())
                if request.pressure:
                    self._pressure(rt, nbytes)
                    self._record(FREE, stream, Pressure())

    @staticmethod
    def _pressure(rt: Runtime, nbytes: int) -> None:
        import torch

        block = rt.empty(nbytes, dtype=torch.uint8)  # on the current stream: the freed block's
        rt.launch("racecheck_pressure", lambda out: out.fill_(POISON_BYTE), writes=(block,))
        del block  # back to the pool, written: the collision a real next allocation makes

    def _as_injector(self):
        return _Inside(self._inside)

    def _record(self, point: str, stream: Stream, action) -> None:
        if len(self.log) < LOG_LIMIT:
            self.log.append(Fired(self._step, point, stream.name, action))


class _Inside:
    """Marks the current thread as running the injector's own runtime calls."""

    def __init__(self, local: threading.local) -> None:
        self.local = local
        self.prev = False  # the flag's value before __enter__, restored by __exit__

    def __enter__(self) -> None:
        self.prev = getattr(self.local, "on", False)
        self.local.on = True

    def __exit__(self, *exc) -> None:
        self.local.on = self.prev


def install(rt: Runtime, profile: Profile, *, seed: int = 0) -> Injector | None:
    """Attach an injector for `profile` to `rt` (nothing when the profile is off)."""
    if profile.is_off:
        return None
    injector = Injector(profile, seed=seed)
    rt.add_observer(injector)
    return injector


def uninstall(rt: Runtime, injector: Injector | None) -> None:
    """Detach `injector` and open its gates, so that no stream stays held."""
    if injector is None:
        return
    rt.remove_observer(injector)
    injector.open_gates()
