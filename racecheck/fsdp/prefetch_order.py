"""The iteration schedule shared by every group under one root module: when each group unshards,
prefetches and reshards in forward and backward, and the end-of-backward step that hands the
gradients to the optimizer.

[Note: prefetch order]
Forward: each forward records the order in which groups begin (pre-forward). In the next forward,
when group k begins, the all-gather of the group that followed k last time is enqueued right after
k's own, so it runs on the all-gather stream while k computes. The first forward has no order yet
and prefetches nothing.
Backward: runs groups in the reverse of the order in which their forwards *ended* (post-forward;
the root ends last and its backward comes first). When backward reaches group k (the first
gradient of one of k's outputs, see register_pre_backward), k is all-gathered if it was resharded
and the group before k in post-forward order is prefetched. Together with the engine's ordering
(see [Note: reshard after forward] in autograd.py), at most two groups are unsharded at a time.
A prefetched group that the iteration then does not use is resharded at the end of backward (or of
a no-grad forward).
"""

from __future__ import annotations

import threading

import torch

from racecheck.device import Point, Runtime
from racecheck.fsdp.autograd import SavedParamHooks, register_pre_backward
from racecheck.fsdp.param_group import GroupState, ParamGroup
from racecheck.fsdp.streams import FSDPStreams


def _neighbour(order: list[ParamGroup], group: ParamGroup, step: int) -> ParamGroup | None:
    """The group `step` places after `group` in `order` (None at either end or if absent)."""
    try:
        i = order.index(group) + step
    except ValueError:
        return None
    return order[i] if 0 <= i < len(order) else None


class Schedule:
    """Created by the root's first forward; every group under the root points to it."""

    def __init__(self, *, runtime: Runtime, streams: FSDPStreams, groups: list[ParamGroup]) -> None:
        self.runtime = runtime
        self.streams = streams
        self.groups = groups
        self._forward_order: list[ParamGroup] = []  # this forward's pre-forward order
        self._prefetch_order: list[ParamGroup] = []  # the previous forward's
        self._post_forward_order: list[ParamGroup] = []
        self._hooks = SavedParamHooks()
        self._end_queued = False
        self._lock = threading.Lock()

    # -- forward -----------------------------------------------------------------------------------
    def root_pre_forward(self) -> None:
        if self._forward_order:
            self._prefetch_order = self._forward_order
        self._forward_order, self._post_forward_order = [], []
        if torch.is_grad_enabled():
            self._hooks.enter()  # [Note: reshard after forward]

    def group_pre_forward(self, group: ParamGroup) -> None:
        self._forward_order.append(group)
        group.unshard()  # its own all-gather first: the all-gather stream runs in issue order
        if group.options.prefetch:
            nxt = _neighbour(self._prefetch_order, group, +1)
            if nxt is not None:
                nxt.unshard()  # [Note: prefetch order]
        group.wait_for_unshard()
        group.expose_parameters()

    def group_post_forward(self, group: ParamGroup, output) -> None:
        self._post_forward_order.append(group)
        group.hide_parameters()
        grad = torch.is_grad_enabled()
        if not grad or group.reshard_after_forward:
            group.reshard()  # saved parameters are handles now; backward gathers them again
        if grad:
            register_pre_backward(output, lambda: self.pre_backward(group))

    def root_post_forward(self) -> None:
        self._hooks.exit()
        if not torch.is_grad_enabled():  # no backward will reshard what forward left unsharded
            for group in self.groups:
                group.reshard()
        # The last layers' retired buffers would otherwise live until backward's first all-gather,
        # across the loss, where activation memory peaks.
        self.streams.retired_unsharded.release()

    # -- backward ----------------------------------------------------------------------------------
    def pre_backward(self, group: ParamGroup) -> None:
        """Backward reached one of `group`'s outputs."""
        if group.pre_backward_seen:
            return
        group.pre_backward_seen = True
        self.backward_running()
        group.unshard()
        if group.options.prefetch:
            prev = _neighbour(self._post_forward_order, group, -1)
            if prev is not None:
                prev.unshard()  # [Note: prefetch order]
        group.wait_for_unshard()

    def backward_running(self) -> None:
        """Called from inside backward: make sure the end-of-backward step runs when it ends."""
        with self._lock:
            if self._end_queued:
                return
            self._end_queued = True
        torch.autograd.Variable._execution_engine.queue_callback(self.end_of_backward)

    def end_of_backward(self) -> None:
        rt, s = self.runtime, self.streams
        # Producers: the reduce-scatter and all-reduce streams wrote the shards' .grad, the
        # all-gather stream read the shards; consumer: the optimizer on the default stream, which
        # reads the gradients and overwrites the shards.
        s.default.wait_stream(s.reduce_scatter)
        s.default.wait_stream(s.all_reduce)
        s.default.wait_stream(s.all_gather)
        rt.point(Point.END_OF_BACKWARD)
        for group in self.groups:
            group.finish_backward()
        for group in self.groups:
            if group.state is not GroupState.SHARDED:
                group.reshard()  # parameters that got no gradient, or an unused prefetch
        s.retired_unsharded.release()  # the all-gather stream waits for backward's compute
        with self._lock:
            self._end_queued = False
