"""Moving parameter values in and out of the shards: full and sharded state dicts, and the
initialization of modules that were built on the meta device.

Keys are the original parameter names of the unwrapped model (`0.weight`, `layers.3.linear1.bias`);
persistent buffers are included as they are. A full state dict holds every parameter whole, on the
CPU, on every rank (gathering it is collective). A sharded state dict holds, per parameter, the
1-D slice of the flattened parameter that this rank's shard contains (possibly empty); it loads
only into a model sharded the same way. Both round trips are bitwise. The optimizer's own
state_dict is already sharded: its parameters are the flat shards.

All copies into a shard are enqueued on the default stream, where the optimizer reads the shard
and before the all-gather stream reads it (unshard waits for the default stream).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from racecheck.fsdp.flat_param import ParamInfo, flatten_into
from racecheck.fsdp.param_group import ParamGroup


def _fqns(model: nn.Module) -> dict[tuple[int, str], str]:
    """(id(owner module), attr) -> the parameter's name in the unwrapped model."""
    names = {id(m): n for n, m in model.named_modules()}
    out = {}
    for group in model.param_groups():
        for info in group.infos:
            owner = names[id(info.module)]
            out[(id(info.module), info.attr)] = f"{owner}.{info.attr}" if owner else info.attr
    return out


def _name(fqns, info: ParamInfo) -> str:
    return fqns[(id(info.module), info.attr)]


def _buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v for k, v in model.state_dict(keep_vars=True).items() if "flat_param_shard" not in k}


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    fqns, out = _fqns(model), {}
    for group in model.param_groups():
        rt = group.runtime
        shard = group.flat_param_shard.detach()
        with rt.stream(rt.default_stream()):
            full = rt.empty(group.padded_numel, dtype=shard.dtype)
            # Producer and consumer: the default stream (the shard's writers and the copy below).
            rt.all_gather(full, shard, group=group.mesh.shard_group)
        rt.default_stream().synchronize()  # the host copies `full` out next
        for info, view in zip(group.infos, group.layout.views(full), strict=True):
            out[_name(fqns, info)] = view.to("cpu", copy=True)
    for name, buf in _buffers(model).items():
        out[name] = buf.detach().to("cpu", copy=True)
    return out


def _check_keys(expected: set[str], sd: dict, strict: bool) -> None:
    missing, unexpected = expected - set(sd), set(sd) - expected
    if strict and (missing or unexpected):
        raise KeyError(f"state dict mismatch: missing {sorted(missing)}, unexpected {sorted(unexpected)}")


def _write_shard(group: ParamGroup, src: torch.Tensor) -> None:
    rt = group.runtime
    with rt.stream(rt.default_stream()):
        rt.launch("load_shard", lambda out, s: out.copy_(s), reads=(src,), writes=(group.flat_param_shard.detach(),))
    group.needs_init = False


def _load_buffers(model: nn.Module, sd: dict) -> None:
    with torch.no_grad():
        for name, buf in _buffers(model).items():
            if name in sd:
                buf.copy_(sd[name])


def load_full_state_dict(model: nn.Module, sd: dict[str, torch.Tensor], *, strict: bool = True) -> None:
    fqns = _fqns(model)
    _check_keys(set(fqns.values()) | set(_buffers(model)), sd, strict)
    for group in model.param_groups():
        layout = group.layout
        tensors = []
        for info in group.infos:
            name = _name(fqns, info)
            t = sd.get(name)
            if t is None:
                raise KeyError(f"load_full_state_dict: no value for {name!r}")
            if t.shape != info.shape:
                raise ValueError(
                    f"{name!r}: shape {tuple(t.shape)} in the state dict, {tuple(info.shape)} in the model"
                )
            tensors.append(t)
        flat = torch.empty(layout.padded_numel, dtype=layout.dtype)
        flatten_into(layout, tensors, flat)
        start, end = layout.shard_range(group.mesh.shard_index)
        _write_shard(group, flat[start:end].to(group.runtime.device))
    _load_buffers(model, sd)


def sharded_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    fqns, out = _fqns(model), {}
    for group in model.param_groups():
        group.runtime.default_stream().synchronize()  # the optimizer's last writes
        shard = group.flat_param_shard.detach()
        start, _ = group.layout.shard_range(group.mesh.shard_index)
        for info, lo, hi in group.layout.pieces(group.mesh.shard_index):
            at = info.offset + lo - start
            out[_name(fqns, info)] = shard[at : at + hi - lo].to("cpu", copy=True)
    for name, buf in _buffers(model).items():
        out[name] = buf.detach().to("cpu", copy=True)
    return out


def load_sharded_state_dict(model: nn.Module, sd: dict[str, torch.Tensor], *, strict: bool = True) -> None:
    fqns = _fqns(model)
    _check_keys(set(fqns.values()) | set(_buffers(model)), sd, strict)
    for group in model.param_groups():
        shard = torch.zeros(group.shard_numel, dtype=group.layout.dtype)
        start, _ = group.layout.shard_range(group.mesh.shard_index)
        for info, lo, hi in group.layout.pieces(group.mesh.shard_index):
            piece = sd[_name(fqns, info)]
            if piece.numel() != hi - lo:
                raise ValueError(
                    f"{_name(fqns, info)!r}: {piece.numel()} elements in the sharded state dict, "
                    f"{hi - lo} in this rank's shard (was it saved on another mesh?)"
                )
            at = info.offset + lo - start
            shard[at : at + hi - lo] = piece
        _write_shard(group, shard.to(group.runtime.device))
    _load_buffers(model, sd)


def _default_init(module: nn.Module) -> None:
    for name in ("reset_parameters", "_reset_parameters"):
        fn = getattr(type(module), name, None)
        if fn is not None:
            fn(module)
            return


def init_parameters(
    model: nn.Module, init_fn: Callable[[nn.Module], None] | None = None, *, device: torch.device | str | None = None
) -> None:
    """Give every group's shard its initial values by running `init_fn(module)` (default: the
    module's reset_parameters) on each module that owns parameters, in `model.modules()` order,
    with the module's parameters set to plain tensors of a full-size unsharded buffer on this rank,
    on `device` (default: the runtime's; that device's RNG draws the values, so "cpu" reproduces a
    model constructed on the CPU under the same seed).

    Not collective: every rank computes the same full values (seed the RNG alike on every rank)
    and keeps its slice. Memory: one group's full parameters at a time, plus the groups whose
    modules are still pending (a root group whose modules come first and last stays, say)."""
    init_fn = init_fn or _default_init
    groups = model.param_groups()
    owners: dict[int, list[ParamGroup]] = {}
    remaining: dict[ParamGroup, int] = {}
    for group in groups:
        for m in {id(i.module): i.module for i in group.infos}.values():
            owners.setdefault(id(m), []).append(group)
            remaining[group] = remaining.get(group, 0) + 1
    fulls: dict[ParamGroup, torch.Tensor] = {}
    with torch.no_grad():
        for module in model.modules():
            for group in owners.get(id(module), ()):
                if group not in fulls:
                    full = torch.zeros(
                        group.padded_numel, dtype=group.layout.dtype, device=device or group.runtime.device
                    )
                    fulls[group] = full
                    for info, view in zip(group.infos, group.layout.views(full), strict=True):
                        setattr(info.module, info.attr, view)
            if id(module) in owners:
                init_fn(module)
            for group in owners.get(id(module), ()):
                remaining[group] -= 1
                if remaining[group] == 0:
                    full = fulls.pop(group)
                    group.hide_parameters()
                    start, end = group.layout.shard_range(group.mesh.shard_index)
                    _write_shard(group, full[start:end].to(group.runtime.device))
