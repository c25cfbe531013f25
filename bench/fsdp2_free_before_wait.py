"""FSDP2's free before the wait, alone: the order of operations that failed correct FSDP2 under
racecheck's allocator actions, in plain torch.cuda, run under patch mode with any racecheck.

    python3 bench/fsdp2_free_before_wait.py [--perturb SPEC] [--trials 10]

A sharded gradient is allocated on the reduce-scatter stream and read by the optimizer on the
default stream; zero_grad frees it on the default stream while that read may still be queued, so
its block is back in the reduce-scatter stream's pool at once; the reduce-scatter stream waits for
the default stream before it next allocates. That is correct under the caching allocator's rules.
An action on the freed block done before that wait (at the free, or at the next stream call)
overwrites the gradient under the optimizer's read; done at the next allocation on the
reduce-scatter stream, behind the wait, it cannot. Prints the failing trials and the actions taken.

Its run on one H200, which the README cites, is reports/gpu/verdicts/fsdp2_free_before_wait.log
(bench/verdicts_gpu.sh runs it).
"""

from __future__ import annotations

import argparse
import sys

import torch

N = 1 << 22  # 16 MiB of float32: a large-pool block


def freed_before_the_wait() -> bool:
    """One step of the pattern; True when the optimizer's read saw something else (a failure)."""
    rs = torch.cuda.Stream()
    with torch.cuda.stream(rs):
        grad = torch.full((N,), 1.0, device="cuda")  # the reduce-scatter output
    torch.cuda.current_stream().wait_stream(rs)  # the default stream consumes it
    seen = torch.empty(N, device="cuda")
    seen.copy_(grad)  # the optimizer's read, on the default stream
    del grad  # zero_grad(set_to_none=True), on the default stream
    rs.wait_stream(torch.cuda.current_stream())  # before the reduce-scatter stream allocates again
    with torch.cuda.stream(rs):
        torch.zeros(8, device="cuda")  # its next allocation (another pool: the block stays free)
        nxt = torch.empty(N, device="cuda")
        nxt.fill_(2.0)  # the next step's reduce-scatter output
    torch.cuda.synchronize()
    del nxt
    return bool((seen != 1.0).any())


def main() -> int:
    from racecheck.perturb.patch import PatchMode
    from racecheck.perturb.profiles import parse_profile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--perturb", default="sleep@stream_enter:3ms,sleep@stream_wait:3ms,pressure@free")
    parser.add_argument("--trials", type=int, default=10)
    args = parser.parse_args()
    freed_before_the_wait()  # warm-up: kernels loaded, the pools made
    failures, counts = 0, {}
    for seed in range(args.trials):
        with PatchMode(parse_profile(args.perturb), seed=seed) as patch:
            failures += freed_before_the_wait()
        for k, v in patch.counts.items():
            counts[k] = counts.get(k, 0) + v
    print(f"{args.perturb}: {failures}/{args.trials} trials failed; actions {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
