"""The flat layout of one parameter group: where each original parameter lives inside one padded
1-D buffer, which slice of it a rank holds, and how the shard is built from the module's parameters.

[Note: flat layout and padding]
A group's parameters are laid end to end in `named_modules()` order, each starting at a multiple of
ALIGN_NUMEL elements (so that every parameter view of the unsharded buffer is 64-byte aligned in
fp32, 32-byte in bf16, as fast GPU kernels want); the gaps and the tail are padding. The total is
rounded up to a multiple of `shard_count * ALIGN_NUMEL`, so every rank's shard has the same length
(collectives need equal chunks) and starts aligned. Shard k is flat[k*shard_numel:(k+1)*shard_numel].
Padding starts as zeros, receives zero gradient (main_grad's padding is never written), and so stays
zero under any optimizer whose update of a zero parameter with a zero gradient is zero (SGD, Adam,
AdamW, ...); it is never exposed to the module.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import torch
from torch import nn

ALIGN_NUMEL = 16

# Marks a group's shard, so that an enclosing fully_shard leaves it alone.
SHARD_MARK = "_racecheck_flat_shard"


@dataclasses.dataclass(frozen=True)
class ParamInfo:
    """Where one original parameter lives inside the group's flat buffer."""

    fqn: str  # relative to the module fully_shard was called on
    module: nn.Module  # owner; the parameter is module.<attr>
    attr: str
    shape: torch.Size
    offset: int
    numel: int


@dataclasses.dataclass(frozen=True)
class FlatLayout:
    infos: tuple[ParamInfo, ...]
    numel: int  # end of the last parameter
    padded_numel: int
    shard_count: int
    dtype: torch.dtype  # the original parameters' (and the shard's) dtype

    @property
    def shard_numel(self) -> int:
        return self.padded_numel // self.shard_count

    def shard_range(self, shard_index: int) -> tuple[int, int]:
        start = shard_index * self.shard_numel
        return start, start + self.shard_numel

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's view of an unsharded flat buffer, in `infos` order."""
        return [flat[i.offset : i.offset + i.numel].view(i.shape) for i in self.infos]

    def pieces(self, shard_index: int) -> Iterator[tuple[ParamInfo, int, int]]:
        """(info, lo, hi) for each parameter overlapping the shard: elements [lo, hi) of the
        flattened parameter live in this shard, at shard offset `info.offset + lo - start`."""
        start, end = self.shard_range(shard_index)
        for info in self.infos:
            lo = min(max(start - info.offset, 0), info.numel)
            hi = max(min(end - info.offset, info.numel), lo)
            yield info, lo, hi

    @classmethod
    def of(cls, module: nn.Module, *, shard_count: int) -> FlatLayout:
        """The layout of the parameters of `module` that no nested fully_shard manages."""
        infos, offset, seen, dtypes = [], 0, {}, set()
        for mod_name, mod in module.named_modules():
            for attr, p in list(mod._parameters.items()):
                if p is None or getattr(p, SHARD_MARK, False):
                    continue  # managed by a nested fully_shard
                fqn = f"{mod_name}.{attr}" if mod_name else attr
                if id(p) in seen:
                    raise ValueError(
                        f"fully_shard: {fqn!r} is the same parameter as {seen[id(p)]!r}; "
                        "tied parameters are not supported"
                    )
                seen[id(p)] = fqn
                dtypes.add(p.dtype)
                offset = math.ceil(offset / ALIGN_NUMEL) * ALIGN_NUMEL
                infos.append(ParamInfo(fqn, mod, attr, p.shape, offset, p.numel()))
                offset += p.numel()
        if not infos:
            raise ValueError("fully_shard: the module has no parameters left to shard")
        if len(dtypes) > 1:
            raise ValueError(f"fully_shard: one group needs one parameter dtype, got {sorted(map(str, dtypes))}")
        unit = shard_count * ALIGN_NUMEL
        padded = math.ceil(offset / unit) * unit
        return cls(tuple(infos), offset, padded, shard_count, dtypes.pop())


def flatten_into(layout: FlatLayout, tensors: list[torch.Tensor], out: torch.Tensor) -> None:
    """Write one tensor per parameter (in `infos` order) into the flat buffer `out`, padding zeroed."""
    out.zero_()
    with torch.no_grad():
        for info, t in zip(layout.infos, tensors, strict=True):
            out[info.offset : info.offset + info.numel].copy_(t.reshape(-1))


def take_parameters(layout: FlatLayout) -> list[torch.Tensor]:
    """Remove the original parameters from their modules (they become views of the unsharded buffer
    while the group is unsharded) and return them, in `infos` order."""
    taken = []
    for info in layout.infos:
        taken.append(info.module._parameters.pop(info.attr))
    return taken


def materialize_buffers(module: nn.Module, device: torch.device) -> None:
    """Move the module's own buffers to `device`; buffers on the meta device become uninitialized
    (the module's reset_parameters or a loaded state dict fills them)."""
    for mod in module.modules():
        for name, buf in list(mod._buffers.items()):
            if buf is None or buf.device == device:
                continue
            mod._buffers[name] = torch.empty_like(buf, device=device) if buf.is_meta else buf.to(device)
