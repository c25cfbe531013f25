"""What asking CUDA whether host memory is pinned costs, per query: the native log asks it, through
PyTorch's CUDA hooks as `Tensor.is_pinned()` does, about host tensors on CUDA where the answer may
matter (op_log.cpp's ask_pinned, [Note: the host's own calls]); asked of every host tensor of a
call, as it once was, AdamW's step counts on the host made about fifty questions a step.

    python bench/pinned_query.py      # on a GPU machine; prints one line per case

Times `is_pinned()` on a 0-dim host tensor, pageable and pinned, against `is_contiguous()` on the
same tensor (a method call through the same binding that asks nothing of CUDA), with
torch.utils.benchmark; the difference is the query's own cost.
"""

from __future__ import annotations

import sys

import torch
from torch.utils.benchmark import Timer


def per_call_us(stmt: str, tensor: torch.Tensor) -> float:
    """Median microseconds per call of `stmt` on `tensor` (torch.utils.benchmark's blocked_autorange)."""
    return Timer(stmt=stmt, globals={"t": tensor}).blocked_autorange(min_run_time=1.0).median * 1e6


def main() -> int:
    if not torch.cuda.is_available():
        print("pinned_query: no CUDA device: nothing to measure", file=sys.stderr)
        return 2
    torch.cuda.init()
    cases = {"pageable": torch.zeros(()), "pinned": torch.zeros((), pin_memory=True)}
    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}")
    for name, tensor in cases.items():
        assert tensor.is_pinned() == (name == "pinned")
        base, asked = per_call_us("t.is_contiguous()", tensor), per_call_us("t.is_pinned()", tensor)
        print(
            f"{name}: is_pinned() {asked:.3f} us a call, is_contiguous() {base:.3f} us, the query {asked - base:.3f} us"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
