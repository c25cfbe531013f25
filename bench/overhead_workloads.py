"""The training steps that bench/detector_overhead_native.py times and bench/native_replay.py
records: what each workload is, its sizes, and the one-rank process group the FSDP2 ones run in.

    mlp-sgd          8 Linear(2048, 2048) + GELU, batch 64, MSE loss; SGD with momentum (foreach)
    mlp-adamw        the same MLP; AdamW (foreach)
    mlp-adamw-fused  the same MLP; AdamW (fused)
    fsdp2-adamw      a transformer of 4 encoder layers of width 512 (8 heads, batch 8 x 256) with
                     torch.distributed.fsdp.fully_shard on every layer and the root, bf16 parameters
                     and fp32 reductions (FSDP2's MixedPrecisionPolicy), one rank; AdamW (foreach)
    fsdp2-compiled   the same, each layer compiled (Module.compile, --compile-backend) before it is
                     sharded, as torchtitan compiles each block

The sizes are options (add_workload_options). A workload's table key is its model and optimizer:
`mlp`, `fsdp2` or `fsdp2_compiled`, with `sgd`, `adamw` or `adamw_fused`.

Part of bench/detector_overhead_native.py (reports/gpu/detector_overhead_native.*) and
bench/native_replay.py (reports/native_engine_cpu.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket


@dataclasses.dataclass(frozen=True)
class Workload:
    model: str  # mlp, fsdp2, fsdp2_compiled
    optimizer: str  # sgd, adamw, adamw_fused


WORKLOADS = {
    "mlp-sgd": Workload("mlp", "sgd"),
    "mlp-adamw": Workload("mlp", "adamw"),
    "mlp-adamw-fused": Workload("mlp", "adamw_fused"),
    "fsdp2-adamw": Workload("fsdp2", "adamw"),
    "fsdp2-compiled": Workload("fsdp2_compiled", "adamw"),
}
# The names runs CSVs written before the optimizer was a column used.
OLD_NAMES = {"mlp": "mlp-sgd", "fsdp2": "fsdp2-adamw"}


def add_workload_options(p: argparse.ArgumentParser) -> None:
    """The workloads' sizes (build reads them)."""
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--fsdp2-layers", type=int, default=4)
    p.add_argument("--fsdp2-width", type=int, default=512)
    p.add_argument("--fsdp2-heads", type=int, default=8)
    p.add_argument("--fsdp2-batch", type=int, default=8)
    p.add_argument("--fsdp2-seq", type=int, default=256)
    p.add_argument("--compile-backend", default="inductor", help="fsdp2-compiled: torch.compile's backend")


OPTIMIZERS = {"sgd": "SGD with momentum", "adamw": "AdamW (foreach)", "adamw_fused": "AdamW (fused)"}


def describe(name: str, args) -> str:
    w = WORKLOADS[name]
    optimizer = OPTIMIZERS[w.optimizer]
    if w.model == "mlp":
        return f"{args.layers}-layer {args.width}-wide MLP (GELU), batch {args.batch}, {optimizer}"
    compiled = f", each layer compiled ({args.compile_backend})" if w.model == "fsdp2_compiled" else ""
    return (
        f"{args.fsdp2_layers}-layer width-{args.fsdp2_width} transformer, batch {args.fsdp2_batch} x "
        f"{args.fsdp2_seq}, bf16, FSDP2 (fully_shard per layer and root) on one rank{compiled}, {optimizer}"
    )


def step_name(name: str, args) -> str:
    """The workload's model in a few words (the README's table names its rows so)."""
    w = WORKLOADS[name]
    if w.model == "mlp":
        return f"MLP ({args.layers} x {args.width}, GELU)"
    fsdp2 = f"FSDP2 transformer ({args.fsdp2_layers} layers, width {args.fsdp2_width}, bf16)"
    return fsdp2 if w.model == "fsdp2" else f"{fsdp2}, each layer compiled"


def _optimizer(kind: str, params):
    import torch

    if kind == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=True)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, foreach=True)
    return torch.optim.AdamW(params, lr=1e-4, fused=True)


def build(name: str, args, dev):
    """(step, what it is) for the workload, built on `dev`; the FSDP2 ones in init_world's group."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    w = WORKLOADS[name]
    if w.model == "mlp":
        layers: list[nn.Module] = []
        for _ in range(args.layers):
            layers += [nn.Linear(args.width, args.width, device=dev), nn.GELU()]
        model = nn.Sequential(*layers)
        opt = _optimizer(w.optimizer, model.parameters())
        x = torch.randn(args.batch, args.width, device=dev)
        y = torch.randn(args.batch, args.width, device=dev)

        def step():
            opt.zero_grad(set_to_none=True)
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()

        return step, describe(name, args)
    model = _fsdp2_model(args, dev, compiled=w.model == "fsdp2_compiled")
    opt = _optimizer(w.optimizer, model.parameters())
    x = torch.randn(args.fsdp2_batch, args.fsdp2_seq, args.fsdp2_width, device=dev)

    def fsdp2_step():
        opt.zero_grad(set_to_none=True)
        model(x).float().pow(2).mean().backward()
        opt.step()

    return fsdp2_step, describe(name, args)


def _fsdp2_model(args, dev, *, compiled: bool):
    import torch
    from torch import nn
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    width = args.fsdp2_width
    model = nn.Sequential(
        *[
            nn.TransformerEncoderLayer(width, args.fsdp2_heads, 4 * width, dropout=0.0, batch_first=True, device=dev)
            for _ in range(args.fsdp2_layers)
        ]
    )
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model:
        if compiled:
            layer.compile(backend=args.compile_backend)  # in place: the module fully_shard gets stays the layer
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    return model


def uses_world(name: str) -> bool:
    return WORKLOADS[name].model != "mlp"


def init_world(name: str, cpu: bool) -> None:
    """The one-rank process group an FSDP2 workload runs in (gloo on the CPU, NCCL on CUDA)."""
    if not uses_world(name):
        return
    import torch
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    if not cpu:
        torch.cuda.set_device(0)
    dist.init_process_group("gloo" if cpu else "nccl", rank=0, world_size=1)
