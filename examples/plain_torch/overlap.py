"""Six ways of overlapping work with a side stream in plain PyTorch, each with its known mistake.

Each class is written the way training code of its kind is (activation offloading, parameter
prefetch, DDP-style gradient all-reduce, FSDP1/ZeRO-style gradient reduce-scatter, statistics
copied to the host for logging, an input pipeline on a side stream); `fixed=False` leaves out the
one line that makes it correct, `fixed=True` has it:

- ActivationOffloader: a device-to-host copy of each activation on a copy stream, the device copy
  dropped once the copy is queued. Mistake: no `record_stream(copy_stream)`, so the block returns
  to the compute stream's pool while the copy still reads it. No collective at all.
- AllGatherPrefetcher: the next layer's weight all-gathered on a prefetch stream while the current
  layer computes. Mistake: the "gathered" event recorded outside the prefetch stream's context,
  on the compute stream, so waiting on it orders nothing.
- DoubleBufferedAllReduce: each gradient packed into one of two staging buffers and all-reduced on
  a comm stream as backward produces it. Mistake: packing into a buffer without waiting for the
  comm stream's last use of it (two gradients earlier).
- BucketedReduceScatter: each layer's gradients flattened into a bucket and reduce-scattered on a
  comm stream, the bucket and the gradients dropped right after. Mistake: no
  `record_stream(comm_stream)` on the bucket.
- HostStatistics: per-row statistics copied into pinned host memory on a copy stream, with an
  event, for the host to log. Mistake: the host reads the buffer without synchronizing that event
  (a race between the host and a stream).
- StagedInputs: each batch normalized on a side stream into a fresh buffer, handed to the compute
  stream with an event. Mistake: the event recorded before the work it should mark.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist


class ActivationOffloader:
    """Moves activations to pinned host memory on a copy stream and frees their device memory."""

    def __init__(self, *, slots: int, shape: torch.Size, dtype: torch.dtype, fixed: bool) -> None:
        self.fixed = fixed
        # Pinned host buffers are allocated once, up front: pinning memory synchronizes the whole
        # device, which would serialize every copy with the compute around it.
        self._free = [torch.empty(shape, dtype=dtype, pin_memory=True) for _ in range(slots)]
        # Device-to-host copies run here so that they overlap the next layers' compute.
        self.copy_stream = torch.cuda.Stream()
        self._saved: list[tuple[torch.Tensor, torch.cuda.Event]] = []

    def offload(self, activation: torch.Tensor) -> int:
        """Queue the copy of `activation`; the caller drops its device tensor after this returns."""
        host = self._free.pop()
        # Producer: the compute stream wrote `activation`; consumer: the copy stream.
        self.copy_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.copy_stream):
            host.copy_(activation, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record()
        if self.fixed:
            # The copy stream still reads the block: keep it out of the compute stream's pool
            # until the copy stream has passed this point.
            activation.record_stream(self.copy_stream)
        self._saved.append((host, copied))
        return len(self._saved) - 1

    def fetch(self, handle: int) -> torch.Tensor:
        """The host copy, once its copy has finished."""
        host, copied = self._saved[handle]
        copied.synchronize()
        return host


@dataclasses.dataclass(frozen=True)
class Gathered:
    """An all-gathered weight and the event after which it may be read."""

    full: torch.Tensor
    ready: torch.cuda.Event


class AllGatherPrefetcher:
    """Yields each layer's full weight from its shard, all-gathering one layer ahead."""

    def __init__(self, shards: list[torch.Tensor], shape: torch.Size, group, *, fixed: bool) -> None:
        self.shards = shards
        self.shape = shape
        self.group = group
        self.fixed = fixed
        # All-gathers run here, one layer ahead of the compute stream.
        self.stream = torch.cuda.Stream()

    def _gather(self, index: int) -> Gathered:
        shard = self.shards[index]
        world = dist.get_world_size(self.group)
        # Producer: the compute stream last wrote the shard (the optimizer step); consumer: the
        # prefetch stream.
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            full = torch.empty(shard.numel() * world, dtype=shard.dtype, device=shard.device)
            dist.all_gather_into_tensor(full, shard, group=self.group)
        ready = torch.cuda.Event()
        if self.fixed:
            ready.record(self.stream)  # after the all-gather, on the stream that runs it
        else:
            ready.record()  # on the current stream: it has not waited for the all-gather
        return Gathered(full, ready)

    def weights(self):
        upcoming = self._gather(0)
        for index in range(len(self.shards)):
            current = upcoming
            if index + 1 < len(self.shards):
                upcoming = self._gather(index + 1)  # overlaps this layer's compute
            compute = torch.cuda.current_stream()
            # Consumer: the compute stream reads what the prefetch stream gathered.
            compute.wait_event(current.ready)
            # Allocated on the prefetch stream, read here: its block must wait for this stream.
            current.full.record_stream(compute)
            yield current.full.view(self.shape)


class DoubleBufferedAllReduce:
    """Averages gradients over `group` during backward, through two staging buffers."""

    def __init__(self, params: list[torch.nn.Parameter], group, *, fixed: bool) -> None:
        self.group = group
        self.fixed = fixed
        numel = max(p.numel() for p in params)
        device = params[0].device
        self.staging = [torch.empty(numel, device=device) for _ in range(2)]
        self.released: list[torch.cuda.Event | None] = [None, None]  # comm stream done with it
        self.reduced = {p: torch.empty_like(p) for p in params}
        self._count = 0
        # All-reduces run here, overlapping the rest of backward.
        self.comm_stream = torch.cuda.Stream()
        for p in params:
            p.register_post_accumulate_grad_hook(self._reduce)

    def _reduce(self, param: torch.nn.Parameter) -> None:
        slot = self._count % 2
        self._count += 1
        buffer = self.staging[slot][: param.numel()]
        compute = torch.cuda.current_stream()
        if self.fixed and self.released[slot] is not None:
            # Producer of the buffer's last use: the comm stream (all-reduce and copy-out two
            # gradients ago); consumer: this stream, about to overwrite it.
            compute.wait_event(self.released[slot])
        buffer.copy_(param.grad.view(-1))
        # Producer: the compute stream packed the buffer; consumer: the comm stream.
        self.comm_stream.wait_stream(compute)
        with torch.cuda.stream(self.comm_stream):
            dist.all_reduce(buffer, op=dist.ReduceOp.AVG, group=self.group)
            self.reduced[param].view(-1).copy_(buffer)
            self.released[slot] = self.comm_stream.record_event()

    def finish(self) -> None:
        """Make the compute stream wait for every all-reduce; call after backward."""
        torch.cuda.current_stream().wait_stream(self.comm_stream)


class BucketedReduceScatter:
    """Reduce-scatters each layer's gradients during backward and frees them."""

    def __init__(self, layers: list[torch.nn.Module], group, *, fixed: bool) -> None:
        self.group = group
        self.fixed = fixed
        world = dist.get_world_size(group)
        self.shards: dict[torch.nn.Module, torch.Tensor] = {}
        # Reduce-scatters run here, overlapping the rest of backward.
        self.comm_stream = torch.cuda.Stream()
        for layer in layers:
            params = list(layer.parameters())
            numel = sum(p.numel() for p in params)
            self.shards[layer] = torch.empty(numel // world, device=params[0].device)
            ready = {p: False for p in params}
            for p in params:
                p.register_post_accumulate_grad_hook(self._hook(layer, params, ready))

    def _hook(self, layer, params, ready):
        def hook(param: torch.nn.Parameter) -> None:
            ready[param] = True
            if all(ready.values()):
                self._reduce(layer, params)
                ready.update(dict.fromkeys(ready, False))

        return hook

    def _reduce(self, layer: torch.nn.Module, params: list[torch.nn.Parameter]) -> None:
        bucket = torch.cat([p.grad.view(-1) for p in params])
        for p in params:
            p.grad = None  # the full gradients are not kept: only this rank's shard is
        # Producer: the compute stream flattened the bucket; consumer: the comm stream.
        self.comm_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.comm_stream):
            dist.reduce_scatter_tensor(self.shards[layer], bucket, op=dist.ReduceOp.AVG, group=self.group)
        if self.fixed:
            # The bucket dies when this returns while the reduce-scatter may still read it.
            bucket.record_stream(self.comm_stream)

    def finish(self) -> None:
        """Make the compute stream wait for every reduce-scatter; call after backward."""
        torch.cuda.current_stream().wait_stream(self.comm_stream)


class HostStatistics:
    """Copies statistics of a device tensor to pinned host memory for the host to log."""

    def __init__(self, numel: int, *, fixed: bool) -> None:
        self.fixed = fixed
        self.host = torch.empty(numel, pin_memory=True)
        # The device-to-host copy runs here so that the compute stream does not wait for it.
        self.copy_stream = torch.cuda.Stream()

    def snapshot(self, values: torch.Tensor) -> torch.Tensor:
        """The values, on the host, for the host to read."""
        # Producer: the compute stream wrote `values`; consumer: the copy stream.
        self.copy_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.copy_stream):
            self.host.copy_(values, non_blocking=True)
            copied = self.copy_stream.record_event()
        values.record_stream(self.copy_stream)
        if self.fixed:
            # Producer: the copy stream; consumer: the host, which reads the buffer next.
            copied.synchronize()
        return self.host


class StagedInputs:
    """Normalizes each batch on a side stream, ahead of the compute stream that uses it."""

    def __init__(self, *, fixed: bool) -> None:
        self.fixed = fixed
        # Input preparation runs here, overlapping the compute stream's work.
        self.stream = torch.cuda.Stream()

    def stage(self, batch: torch.Tensor) -> torch.Tensor:
        """The batch normalized per row, safe for the current stream to read."""
        # Producer: the current stream wrote `batch`; consumer: the side stream.
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            out = torch.empty_like(batch)
            if not self.fixed:
                ready = self.stream.record_event()  # too early: before the work it should mark
            mean = batch.mean(dim=1, keepdim=True)
            torch.sub(batch, mean, out=out)
            if self.fixed:
                ready = self.stream.record_event()  # after the write: it marks the output done
        # Consumer: the current stream reads `out` once the side stream's event has passed.
        torch.cuda.current_stream().wait_event(ready)
        out.record_stream(torch.cuda.current_stream())  # allocated on the side stream, read here
        batch.record_stream(self.stream)
        return out
