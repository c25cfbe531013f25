"""The copies of generated programs written as compiled code or as a kernel of the program's own
(program_ops.FORMS): a torch.compile'd function (Inductor's kernel: C++ on the CPU, Triton on
CUDA) and, on CUDA, a Triton kernel called eagerly. Each is built once per process.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch


@functools.cache
def compiled_copy() -> Callable[[torch.Tensor, torch.Tensor], None]:
    """out <- src through a compiled function (`src * 1.0`: one generated kernel, NaN kept)."""
    scaled = torch.compile(lambda src: src * 1.0, dynamic=True)

    def copy(out: torch.Tensor, src: torch.Tensor) -> None:
        out.copy_(scaled(src))

    return copy


@functools.cache
def triton_copy() -> Callable[[torch.Tensor, torch.Tensor], None]:
    """out <- src through a Triton kernel, launched eagerly on the current stream (CUDA only)."""
    import triton
    import triton.language as tl

    @triton.jit
    def copy_kernel(src_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(out_ptr + offsets, tl.load(src_ptr + offsets, mask=mask), mask=mask)

    def copy(out: torch.Tensor, src: torch.Tensor) -> None:
        n = src.numel()
        copy_kernel[(triton.cdiv(n, 1024),)](src, out, n, BLOCK=1024)

    return copy
