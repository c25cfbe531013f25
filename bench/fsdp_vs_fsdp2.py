"""racecheck.fsdp against PyTorch's own FSDP2 (`torch.distributed.fsdp.fully_shard`) on the same
transformer-like model, in one run, on the same GPUs.

    torchrun --nproc-per-node 2 bench/fsdp_vs_fsdp2.py [--out reports/gpu] [--steps 20]

Model: token embedding, N pre-norm nn.TransformerEncoderLayers (d=1536, 12 heads, feed-forward
6144, no dropout), final LayerNorm and an untied output head; 10 layers and a vocabulary of 8192
make 308.5M parameters. Both implementations shard each layer and the root, compute in bf16 with
fp32 gradient reduction and fp32 sharded parameters, step AdamW on the shards, and train on
8 x 1024 random tokens per rank with cross-entropy. The root keeps its parameters from forward to
backward in both (FSDP2's default heuristic, racecheck's default too); the layers reshard.

Each implementation runs `--repeats` times, alternating, each time `--warmup` steps and then
`--steps` timed steps (CUDA events around the whole run of steps, no host sync inside it). Rows:
step_ms is the median over repeats of the mean step time, peak_mem_gib the largest peak allocated
memory over ranks and repeats (torch.cuda.max_memory_allocated, reset after warm-up), tokens_per_s
the global tokens per second at that step time. Writes DIR/fsdp_vs_fsdp2.csv (gpus,params,impl,
step_ms,peak_mem_gib,tokens_per_s) and DIR/fsdp_vs_fsdp2.md.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import gc
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

IMPLS = ("fsdp2", "racecheck")


class Transformer(nn.Module):
    def __init__(self, *, vocab: int, d: int, layers: int, heads: int, ff: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, activation="gelu", batch_first=True, norm_first=True)
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.head(self.norm(h))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("reports/gpu"), help="directory for the CSV and Markdown")
    p.add_argument("--layers", type=int, default=10)
    p.add_argument("--d-model", type=int, default=1536)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--ff", type=int, default=6144)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--batch", type=int, default=8, help="sequences per rank")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--impls", default=",".join(IMPLS), help="comma-separated subset of " + ",".join(IMPLS))
    p.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="run on the CPU over gloo (racecheck's CPU emulation): checks the script, measures nothing",
    )
    return p.parse_args()


class Meshes:
    """One mesh per implementation over all ranks, built once (building is collective)."""

    def __init__(self, device: str, world: int) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        from racecheck.device import get_runtime
        from racecheck.fsdp import Mesh, MeshConfig

        self.runtime = get_runtime()
        self.fsdp2 = init_device_mesh(device, (world,))
        self.racecheck = Mesh(MeshConfig(shard=world), runtime=self.runtime)


def build(impl: str, args, meshes: Meshes) -> nn.Module:
    torch.manual_seed(0)
    with torch.device(args.device):
        model = Transformer(vocab=args.vocab, d=args.d_model, layers=args.layers, heads=args.heads, ff=args.ff)
    if impl == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model.layers:
            fully_shard(layer, mesh=meshes.fsdp2, mp_policy=mp)
        fully_shard(model, mesh=meshes.fsdp2, mp_policy=mp)
    else:
        from racecheck.fsdp import MixedPrecisionPolicy, fully_shard

        rt = meshes.runtime
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16)  # reduce_dtype None: the shard's, fp32
        for layer in model.layers:
            fully_shard(layer, mesh=meshes.racecheck, mixed_precision=mp, runtime=rt)
        fully_shard(model, mesh=meshes.racecheck, mixed_precision=mp, runtime=rt)
    return model


class Timer:
    """CUDA events around the timed steps on a GPU; the host clock after a sync on the CPU."""

    def __init__(self, device: str) -> None:
        self.cuda = device == "cuda"
        if self.cuda:
            self._start, self._end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._start.record()
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> tuple[float, float]:
        """(elapsed ms, peak GiB)."""
        if self.cuda:
            self._end.record()
            torch.cuda.synchronize()
            return self._start.elapsed_time(self._end), torch.cuda.max_memory_allocated() / 2**30
        return (time.perf_counter() - self._t0) * 1000, 0.0


def run(impl: str, args, meshes: Meshes) -> tuple[float, float]:
    """(mean step ms, peak GiB on this rank) for one repeat of one implementation."""
    model = build(impl, args, meshes)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    gen = torch.Generator(device=args.device).manual_seed(1 + dist.get_rank())
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), device=args.device, generator=gen)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def step(model: nn.Module, opt: torch.optim.Optimizer) -> torch.Tensor:
        logits = model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, args.vocab).float(), targets.reshape(-1))
        loss.backward()
        opt.step()
        model.zero_grad(set_to_none=True)
        return loss.detach()

    for _ in range(args.warmup):
        step(model, opt)
    timer = Timer(args.device)
    timer.start()
    losses = [step(model, opt) for _ in range(args.steps)]
    elapsed_ms, peak = timer.stop()
    if not torch.isfinite(torch.stack(losses)).all():
        raise RuntimeError(f"{impl}: non-finite loss")
    if dist.get_rank() == 0:
        print(f"{impl}: loss {losses[0].item():.4f} -> {losses[-1].item():.4f}", flush=True)
    del model, opt, losses
    gc.collect()
    if args.device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return elapsed_ms / args.steps, peak


def main() -> int:
    args = parse_args()
    impls = [i for i in args.impls.split(",") if i]
    if not dist.is_torchelastic_launched() or any(i not in IMPLS for i in impls):
        sys.exit("usage: torchrun --nproc-per-node N bench/fsdp_vs_fsdp2.py [--impls fsdp2,racecheck]")
    args.device = "cpu" if args.cpu_smoke else "cuda"
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    else:
        torch.set_num_threads(1)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", timeout=datetime.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    from racecheck.device import init_runtime

    init_runtime("cuda" if args.device == "cuda" else "sim")
    meshes = Meshes(args.device, world)
    with torch.device("meta"):
        params = sum(
            p.numel()
            for p in Transformer(
                vocab=args.vocab, d=args.d_model, layers=args.layers, heads=args.heads, ff=args.ff
            ).parameters()
        )
    times: dict[str, list[float]] = {i: [] for i in impls}
    peaks: dict[str, list[float]] = {i: [] for i in impls}
    for repeat in range(args.repeats):
        for impl in impls if repeat % 2 == 0 else impls[::-1]:
            step_ms, peak = run(impl, args, meshes)
            t = torch.tensor([step_ms, peak], device=args.device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            times[impl].append(t[0].item())
            peaks[impl].append(t[1].item())
            if rank == 0:
                print(f"repeat {repeat} {impl:9s} {t[0].item():8.2f} ms/step  peak {t[1].item():.2f} GiB", flush=True)
    if rank == 0:
        tokens = world * args.batch * args.seq
        rows = [
            dict(
                gpus=world,
                params=params,
                impl=i,
                step_ms=round(statistics.median(times[i]), 2),
                peak_mem_gib=round(max(peaks[i]), 3),
                tokens_per_s=round(tokens / (statistics.median(times[i]) / 1000)),
            )
            for i in impls
        ]
        write(args, rows, world, params)
    dist.destroy_process_group()
    return 0


def write(args, rows: list[dict], world: int, params: int) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "fsdp_vs_fsdp2.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["gpus", "params", "impl", "step_ms", "peak_mem_gib", "tokens_per_s"])
        w.writeheader()
        w.writerows(rows)
    device = torch.cuda.get_device_name() if args.device == "cuda" else "CPU (smoke run, not a measurement)"
    lines = [
        f"# racecheck.fsdp vs FSDP2: {world} x {device}",
        "",
        f"torch {torch.__version__}, {datetime.date.today()}; `torchrun --nproc-per-node {world} "
        f"bench/fsdp_vs_fsdp2.py` ({params / 1e6:.1f}M parameters: {args.layers} pre-norm encoder layers, "
        f"d={args.d_model}, ff={args.ff}, vocab {args.vocab}; bf16 compute, fp32 reduction, AdamW; "
        f"{args.batch}x{args.seq} tokens per rank; median of {args.repeats} repeats of {args.steps} steps).",
        "",
        "| impl | gpus | params | step ms | peak GiB | tokens/s |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {r['impl']} | {r['gpus']} | {r['params']:,} | {r['step_ms']} | {r['peak_mem_gib']} | "
        f"{r['tokens_per_s']:,} |"
        for r in rows
    ]
    (args.out / "fsdp_vs_fsdp2.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
