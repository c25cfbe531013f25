"""The baseline failure is the real mechanism: the reduce-scatter's input block is handed to a
default-stream allocation while the reduce-scatter is still queued; the safe arms never do that.

One process, a one-rank mesh (the reduce-scatter is a copy on the reduce-scatter stream), the
motivating delay before the collective. An observer watches the runtime's own event stream: it
remembers which block each reduce-scatter reads, marks the collective's completion with an event,
and counts allocations that hand that block out on another stream before the event completed.
"""

import pytest
import torch
from torch import nn

from racecheck.device import RuntimeObserver, init_runtime, shutdown_runtime
from racecheck.fsdp import Mesh, MeshConfig, fully_shard
from racecheck.perturb.injector import install
from racecheck.perturb.profiles import parse_profile


class EarlyReuseWatcher(RuntimeObserver):
    def __init__(self):
        self.block_at = {}  # ptr -> block id of the live allocation there
        self.in_flight = []  # (block id, collective's stream, completion event) of reduce-scatters
        self.early_reuses = []  # (block id, stream name): handed to another stream before it ran
        self._pending_input = None

    def on_alloc(self, rt, *, block, stream, ptr, nbytes):
        self.block_at[ptr] = block
        for b, rs_stream, done in self.in_flight:
            # Same-stream reuse is ordered behind the collective; another stream's is not.
            if b == block and stream is not rs_stream and not done.query():
                self.early_reuses.append((block, stream.name))

    def on_launch(self, rt, *, stream, name, reads, writes):
        if name == "reduce_scatter":
            self._pending_input = self.block_at.get(reads[0].ptr)

    def on_point(self, rt, name, **context):
        if name == "after_reduce_scatter" and self._pending_input is not None:
            done = rt.new_event()
            done.record()  # current stream: the reduce-scatter stream, right behind the collective
            self.in_flight.append((self._pending_input, rt.current_stream(), done))
            self._pending_input = None


def train(policy: str) -> tuple[EarlyReuseWatcher, dict]:
    rt = init_runtime("sim")
    try:
        watcher = EarlyReuseWatcher()
        rt.add_observer(watcher)
        install(rt, parse_profile("rs_delay"))
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 32))
        mesh = Mesh(MeshConfig(shard=1), runtime=rt)
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh, main_grad_policy=policy, runtime=rt)
        fully_shard(model, mesh=mesh, main_grad_policy=policy, runtime=rt)
        for _ in range(2):
            model(torch.randn(8, 32)).square().mean().backward()
        rt.synchronize()
        return watcher, dict(vars(rt.allocator.stats))
    finally:
        shutdown_runtime()


def test_baseline_hands_reduce_scatter_input_to_default_stream_while_queued():
    watcher, stats = train("baseline")
    assert watcher.in_flight, "no reduce-scatter was observed"
    assert watcher.early_reuses, f"no early reuse seen; allocator stats {stats}"
    assert {stream for _, stream in watcher.early_reuses} == {"default"}


@pytest.mark.parametrize("policy", ["fixed", "record_stream", "hold_until_wait"])
def test_safe_arms_never_hand_the_input_out_early(policy):
    watcher, stats = train(policy)
    assert watcher.in_flight, "no reduce-scatter was observed"
    assert watcher.early_reuses == [], f"{policy}: early reuse of a queued reduce-scatter's input"
    if policy == "record_stream":
        assert stats["deferred_frees"] > 0, "record_stream never deferred a free"
