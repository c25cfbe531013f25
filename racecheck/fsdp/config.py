"""The options of one `fully_shard` call, validated on construction: mixed precision, when to reshard,
whether to prefetch, and the lifetime policy of the gradient buffer.

One frozen dataclass per concern, keyword-only, so that a ParamGroup receives one validated value
instead of a long argument list (the mesh has its own dataclass, mesh.MeshConfig).
"""

from __future__ import annotations

import dataclasses

import torch

from racecheck.fsdp.main_grad import MainGradPolicy

_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MixedPrecisionPolicy:
    """Dtypes of a group's unsharded copies; the shard itself (the optimizer's parameter) always
    keeps the module's original dtype.

    param_dtype: dtype of the all-gather and of forward/backward compute (None: the shard's).
    reduce_dtype: dtype of `main_grad`, the reduce-scatter and the HSDP all-reduce (None: the
    shard's). bf16 compute with fp32 reduction is `param_dtype=torch.bfloat16, reduce_dtype=None`.
    cast_forward_inputs: cast floating-point forward inputs of the module to param_dtype."""

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    cast_forward_inputs: bool = True

    def __post_init__(self) -> None:
        for field in ("param_dtype", "reduce_dtype"):
            dtype = getattr(self, field)
            if dtype is not None and dtype not in _FLOATS:
                raise ValueError(f"MixedPrecisionPolicy.{field} must be a floating dtype, got {dtype!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class GroupOptions:
    """How one parameter group is driven.

    main_grad_policy: the lifetime strategy of the unsharded gradient buffer (main_grad.py).
    hold_reduce_output: keep the HSDP reduce output alive until the default stream has waited for
      the all-reduce (False reproduces the cross-layer aliasing race).
    reshard_after_forward: free the unsharded parameters after forward and all-gather them again in
      backward; None means True except for the root group, whose parameters backward needs first.
    prefetch: when this group's forward (backward) begins, start the all-gather of the group that
      comes next in forward (backward) order, so that it overlaps this group's compute.
    mixed_precision: see MixedPrecisionPolicy."""

    main_grad_policy: MainGradPolicy = MainGradPolicy.FIXED
    hold_reduce_output: bool = True
    reshard_after_forward: bool | None = None
    prefetch: bool = True
    mixed_precision: MixedPrecisionPolicy = MixedPrecisionPolicy()

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "main_grad_policy", MainGradPolicy(self.main_grad_policy))
        except ValueError:
            known = ", ".join(p.value for p in MainGradPolicy)
            raise ValueError(f"unknown main_grad_policy {self.main_grad_policy!r}; known: {known}") from None
        for field in ("hold_reduce_output", "prefetch"):
            if not isinstance(getattr(self, field), bool):
                raise TypeError(f"{field} must be a bool, got {getattr(self, field)!r}")
        if self.reshard_after_forward not in (None, True, False):
            raise TypeError(f"reshard_after_forward must be a bool or None, got {self.reshard_after_forward!r}")
        if not isinstance(self.mixed_precision, MixedPrecisionPolicy):
            raise TypeError("mixed_precision must be a MixedPrecisionPolicy")
