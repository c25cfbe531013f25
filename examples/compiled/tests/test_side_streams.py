"""Work handed to a side stream, as overlap code does it: a torch.compile'd function (Inductor's
Triton kernel), the project's own Triton kernel called eagerly, or that kernel inside a compiled
function, reads a tensor the default stream made; the default stream then reads what the side
stream wrote. The result must equal the same work done on the default stream alone.

Two hand-offs every arm must order (conftest.py's SIDE_STREAM_ORDERING):
- the input: the side stream reads it after the default stream dropped it. `fixed` calls
  `record_stream(side)`, so its block waits for the side stream's work before the caching allocator
  hands it out again; `hold` keeps the tensor until the default stream has waited on an event the
  side stream recorded after its work (FSDP2's way). `drop_early` drops it at once: the default
  stream's next allocation may take its block and fill it before the side stream reads it.
- the output: `fixed` makes the default stream wait for the side stream, `hold` waits on the event;
  `no_wait` reads it at once, possibly before the side stream wrote it.
"""

import functools

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: the kernels are Triton's")

N = 1 << 22  # 16 MiB of float32: a block of its own in the caching allocator
SCALE, SHIFT = 3.0, 1.0


@functools.cache
def side_work(kind: str):
    """The function the side stream runs, compiled once per process."""
    if kind == "compiled":
        return torch.compile(lambda x: x * SCALE + SHIFT)
    from scale_kernel import scale_shift  # the project's Triton kernel

    if kind == "triton":
        return lambda x: scale_shift(x, SCALE, SHIFT)
    return torch.compile(lambda x: scale_shift(x, SCALE, SHIFT) * 1.0)


@pytest.mark.parametrize("kind", ["compiled", "triton", "triton_in_compiled"])
def test_side_stream_work_matches_the_default_stream(kind, ordering, generator):
    work = side_work(kind)
    side = torch.cuda.Stream()
    x = torch.randn(N, device="cuda", generator=generator)  # produced on the default stream
    expected = x * SCALE + SHIFT  # the same work, on the default stream
    side.wait_stream(torch.cuda.current_stream())  # consumer side, producer default: x is ready
    with torch.cuda.stream(side):
        out = work(x)  # reads x, writes out, on the side stream
        done = torch.cuda.Event()
        done.record(side)
    held = None
    if ordering in ("fixed", "no_wait"):
        x.record_stream(side)  # x's block is not handed out again before side's work is done
    elif ordering == "hold":
        held = x  # dropped below, once the default stream waited on `done`
    del x
    filler = torch.full((N,), -7.0, device="cuda")  # the default stream's next allocation of x's size
    if ordering == "fixed":
        torch.cuda.current_stream().wait_stream(side)  # consumer default, producer side: out is written
    elif ordering in ("hold", "drop_early"):
        torch.cuda.current_stream().wait_event(done)
    held = None  # noqa: F841 - the hold ends once the default stream waited
    got = out.clone()  # read on the default stream
    torch.cuda.synchronize()
    # Close, not equal: a Triton kernel may fuse x * scale + shift into one rounding. A race leaves
    # other values altogether (the filler's -7 scaled, or memory not yet written).
    torch.testing.assert_close(got, expected)
    del filler
