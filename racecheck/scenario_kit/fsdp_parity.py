"""The parity workload: train a small model with racecheck.fsdp and a single-process reference built
from the same seed on the same global batch, then compare losses and final parameters. Shared by
tests/test_fsdp_parity.py (CPU emulation over gloo) and bench/gpu_parity.py (CUDA over NCCL), so
both backends run exactly the same checks.

Every rank computes the reference on the whole global batch itself; errors are max-reduced over
the world, so every rank reaches the same verdict. The error of a parameter is the relative L2
error of its update (final - initial) against the reference's update.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from racecheck.device import Runtime
from racecheck.fsdp.api import fully_shard
from racecheck.fsdp.config import MixedPrecisionPolicy
from racecheck.fsdp.mesh import Mesh
from racecheck.scenario_kit.harness import max_over_ranks, update_errors

GLOBAL_BATCH = 24  # divisible by every world size (1, 2, 4) times every microbatch count (1, 3)
FP32_RTOL = 1e-4
BF16_RTOL = 5e-2  # bf16 compute against an fp32 reference: 8 mantissa bits, a few steps


class TinyTransformer(nn.Module):
    """Input projection, pre-norm encoder layers, final norm and head: the benchmark's shape in small."""

    def __init__(
        self, *, d_in: int = 6, d: int = 16, nhead: int = 2, ff: int = 24, layers: int = 2, d_out: int = 5
    ) -> None:
        super().__init__()
        self.inp = nn.Linear(d_in, d)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d, nhead, ff, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(d)
        self.out = nn.Linear(d, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for layer in self.layers:
            h = layer(h)
        return self.out(self.norm(h))


def make_model(kind: str) -> nn.Module:
    """Sizes are odd on purpose: most groups' sizes do not divide by the shard count (padding)."""
    if kind == "mlp":
        return nn.Sequential(
            nn.Linear(12, 31), nn.Tanh(), nn.Linear(31, 29), nn.LayerNorm(29), nn.Tanh(), nn.Linear(29, 7)
        )
    if kind == "transformer":
        return TinyTransformer()
    raise ValueError(f"unknown parity model {kind!r}")


def submodules_to_shard(model: nn.Module) -> list[nn.Module]:
    if isinstance(model, TinyTransformer):
        return list(model.layers)
    return [m for m in model if isinstance(m, nn.Linear)]


def global_batches(kind: str, *, steps: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    shape_in, shape_out = (
        ((GLOBAL_BATCH, 12), (GLOBAL_BATCH, 7)) if kind == "mlp" else ((GLOBAL_BATCH, 5, 6), (GLOBAL_BATCH, 5, 5))
    )
    return [(torch.randn(shape_in, generator=gen), torch.randn(shape_out, generator=gen)) for _ in range(steps)]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ParityCase:
    model: str = "mlp"
    microbatches: int = 1
    set_to_none: bool = True
    prefetch: bool = True
    sync_each_microbatch: bool = True  # False: no_sync() for all but the last microbatch
    bf16: bool = False  # bf16 compute parameters, fp32 reduction and main gradients
    optimizer: str = "sgd"  # sgd | adamw
    clip: float | None = None  # max global gradient norm
    meta_init: bool = False  # build on the meta device, then init_parameters()
    reshard_after_forward: bool | None = None
    policy: str = "fixed"
    steps: int = 3

    @property
    def name(self) -> str:
        parts = [
            self.model,
            f"mb{self.microbatches}",
            "none" if self.set_to_none else "zero",
            "prefetch" if self.prefetch else "noprefetch",
        ]
        if not self.sync_each_microbatch:
            parts.append("nosync")
        parts += [flag for flag, on in (("bf16", self.bf16), ("meta", self.meta_init)) if on]
        if self.optimizer != "sgd":
            parts.append(self.optimizer)
        if self.clip is not None:
            parts.append(f"clip{self.clip:g}")
        if self.reshard_after_forward is not None:
            parts.append("reshard" if self.reshard_after_forward else "keep")
        if self.policy != "fixed":
            parts.append(self.policy)
        return "-".join(parts)

    @property
    def rtol(self) -> float:
        return BF16_RTOL if self.bf16 else FP32_RTOL


@dataclasses.dataclass
class CaseResult:
    name: str
    ok: bool
    loss_error: float  # worst relative loss difference over steps (and ranks)
    param_error: float  # worst relative update error over parameters (and ranks)
    worst_param: str
    rtol: float
    detail: str = ""


def _world() -> tuple[int, int]:
    return (dist.get_world_size(), dist.get_rank()) if dist.is_initialized() else (1, 0)


def _optimizer(kind: str, params) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.05)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01)
    raise ValueError(f"unknown optimizer {kind!r}")


def build_sharded(case: ParityCase, *, mesh: Mesh, runtime: Runtime, seed: int, meta: bool = False) -> nn.Module:
    torch.manual_seed(seed)
    with torch.device("meta") if meta else contextlib.nullcontext():
        model = make_model(case.model)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16) if case.bf16 else None
    kwargs = dict(
        mesh=mesh,
        runtime=runtime,
        main_grad_policy=case.policy,
        prefetch=case.prefetch,
        mixed_precision=mp,
        reshard_after_forward=case.reshard_after_forward,
    )
    for sub in submodules_to_shard(model):
        fully_shard(sub, **kwargs)
    return fully_shard(model, **kwargs)


def _loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out.float(), y)


def run_case(
    case: ParityCase, *, mesh: Mesh, runtime: Runtime, seed: int = 0, perturb: str | None = None
) -> CaseResult:
    """Train `case` on racecheck.fsdp and on the reference; collective over the world. `perturb`
    is a racecheck.perturb profile installed on the runtime for the case's duration."""
    from racecheck.perturb.injector import install, uninstall
    from racecheck.perturb.profiles import parse_profile

    injector = install(runtime, parse_profile(perturb or "off"), seed=seed)
    try:
        result = _run_case(case, mesh=mesh, runtime=runtime, seed=seed)
    finally:
        uninstall(runtime, injector)
        runtime.synchronize()
    if perturb:
        result.name = f"{case.name}@{perturb}"
    return result


def _run_case(case: ParityCase, *, mesh: Mesh, runtime: Runtime, seed: int) -> CaseResult:
    world, rank = _world()
    device = runtime.device
    torch.manual_seed(seed)
    reference = make_model(case.model).to(device)
    initial = {n: p.detach().clone() for n, p in reference.named_parameters()}
    model = build_sharded(case, mesh=mesh, runtime=runtime, seed=seed, meta=case.meta_init)
    detail = ""
    if case.meta_init:
        torch.manual_seed(seed)  # module order = construction order for these models: same draws
        model.init_parameters(device="cpu")  # the CPU RNG, as the reference's construction
        start = model.full_state_dict()
        if any(not torch.equal(start[n], initial[n].cpu()) for n in initial):
            detail = "meta init differs from the reference's initial parameters"
    opt, ref_opt = _optimizer(case.optimizer, model.parameters()), _optimizer(case.optimizer, reference.parameters())
    losses, ref_losses = [], []
    for x, y in global_batches(case.model, steps=case.steps, seed=seed + 1):
        x, y = x.to(device), y.to(device)
        ref_opt.zero_grad(set_to_none=case.set_to_none)
        ref_loss = _loss(reference(x), y)
        ref_loss.backward()
        if case.clip is not None:
            nn.utils.clip_grad_norm_(reference.parameters(), case.clip)
        ref_opt.step()
        ref_losses.append(ref_loss.item())

        losses.append(_sharded_step(case, model, opt, x.chunk(world)[rank], y.chunk(world)[rank]) / world)

    # Worst over ranks (every rank reaches the same verdict): the update errors, then the loss
    # error and whether any rank saw a detail.
    errors = update_errors(initial, [model.full_state_dict()], reference.state_dict())
    loss_err = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, ref_losses, strict=True))
    loss_err, bad_detail = max_over_ranks(
        torch.tensor([loss_err, 1.0 if detail else 0.0], dtype=torch.float64)
    ).tolist()
    worst = max(errors, key=lambda e: (e.rel_error != e.rel_error, e.rel_error))
    ok = all(e.rel_error <= case.rtol for e in errors) and loss_err <= case.rtol and not bad_detail
    if bad_detail and not detail:
        detail = "meta init differs on another rank"
    return CaseResult(case.name, ok, loss_err, worst.rel_error, worst.name, case.rtol, detail)


def _sharded_step(case: ParityCase, model, opt, x: torch.Tensor, y: torch.Tensor) -> float:
    """One step of the sharded model on this rank's part of the batch, in the case's microbatches;
    the loss summed over the ranks."""
    model.zero_grad(set_to_none=case.set_to_none)
    local = torch.zeros((), device=x.device)
    chunks = list(zip(x.chunk(case.microbatches), y.chunk(case.microbatches), strict=True))
    for i, (xb, yb) in enumerate(chunks):
        last = i == len(chunks) - 1
        quiet = model.no_sync() if not (case.sync_each_microbatch or last) else contextlib.nullcontext()
        with quiet:
            loss = _loss(model(xb), yb) / case.microbatches
            loss.backward()
        local += loss.detach()
    if case.clip is not None:
        model.clip_grad_norm_(case.clip)
    opt.step()
    if dist.is_initialized():
        dist.all_reduce(local)
    return local.item()


def _equal_shards(a: nn.Module, b: nn.Module) -> bool:
    return all(
        torch.equal(ga.flat_param_shard.detach().cpu(), gb.flat_param_shard.detach().cpu())
        for ga, gb in zip(a.param_groups(), b.param_groups(), strict=True)
    )


def _round_trip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf)


def state_dict_round_trip(*, mesh: Mesh, runtime: Runtime, seed: int = 0, model: str = "transformer") -> CaseResult:
    """Full and sharded state dicts (and the optimizer's) survive save/load bitwise: the loaded
    models hold the same shards, report the same state dict, and take the same next step."""
    world, rank = _world()
    device = runtime.device
    case = ParityCase(model=model, optimizer="adamw")
    batches = global_batches(model, steps=3, seed=seed + 1)

    def step(m, opt, x, y):
        m.zero_grad()
        _loss(m(x.chunk(world)[rank].to(device)), y.chunk(world)[rank].to(device)).backward()
        opt.step()

    a = build_sharded(case, mesh=mesh, runtime=runtime, seed=seed)
    opt_a = _optimizer("adamw", a.parameters())
    for x, y in batches[:2]:
        step(a, opt_a, x, y)
    full = _round_trip(a.full_state_dict())
    b = build_sharded(case, mesh=mesh, runtime=runtime, seed=seed, meta=True)
    b.load_full_state_dict(full)
    full_b = b.full_state_dict()
    problems = []
    if set(full_b) != set(full) or any(not torch.equal(full[k], full_b[k]) for k in full):
        problems.append("full state dict differs after load")
    c = build_sharded(case, mesh=mesh, runtime=runtime, seed=seed + 7)
    c.load_sharded_state_dict(_round_trip(a.sharded_state_dict()))
    for other, label in ((b, "full"), (c, "sharded")):
        if not _equal_shards(a, other):
            problems.append(f"{label} load gave other shards")
    opt_b = _optimizer("adamw", b.parameters())
    opt_b.load_state_dict(_round_trip(opt_a.state_dict()))
    x, y = batches[2]
    step(a, opt_a, x, y)
    step(b, opt_b, x, y)
    if not _equal_shards(a, b):
        problems.append("next step after load differs")
    (bad,) = max_over_ranks(torch.tensor([float(bool(problems))], dtype=torch.float64)).tolist()
    if bad and not problems:
        problems.append("failed on another rank")
    return CaseResult(f"state_dict-{model}", not bad, 0.0, 0.0, "-", 0.0, "; ".join(problems))


# Timing and lifetime perturbations (racecheck.perturb profiles) under which the safe cases must
# still match: delays before each reduction collective and after each all-gather wait, NaN-filled
# freed blocks (a use after free reads NaN), and same-size default-stream allocations after each
# free (a block handed to the wrong pool is overwritten).
PERTURBATIONS = ("rs_delay", "ar_delay", "compute_delay", "poison", "pressure")
# The check has teeth: the motivating race (baseline policy) must fail under this one. Poison alone
# catches it on the CPU emulation (the inline default stream poisons the dropped main_grad at
# once); on a GPU the reduce-scatter may win the race, so its read is held back 5 ms first.
TEETH = "sleep@before_reduce_scatter:5ms,poison@free"


def perturbed_matrix() -> list[tuple[str, ParityCase]]:
    cases = [
        ParityCase(microbatches=3),
        ParityCase(microbatches=3, sync_each_microbatch=False, bf16=True, policy="hold_until_wait"),
        ParityCase(model="transformer", microbatches=3, set_to_none=False, policy="record_stream"),
    ]
    return [(profile, case) for profile in PERTURBATIONS for case in cases]


def default_matrix(*, full: bool = True) -> list[ParityCase]:
    """The parity matrix: microbatches x set_to_none x prefetch, gradient accumulation without sync,
    bf16, AdamW with clipping, meta init, per-group reshard settings, the transformer, the policies."""
    cases = [
        ParityCase(microbatches=m, set_to_none=s, prefetch=p)
        for m in (1, 3)
        for s in (True, False)
        for p in (True, False)
    ]
    cases += [
        ParityCase(microbatches=3, sync_each_microbatch=False),
        ParityCase(microbatches=3, sync_each_microbatch=False, set_to_none=False, policy="record_stream"),
        ParityCase(bf16=True),
        ParityCase(bf16=True, microbatches=3, sync_each_microbatch=False),
        ParityCase(optimizer="adamw", clip=0.05),
        ParityCase(meta_init=True, microbatches=3),
        ParityCase(reshard_after_forward=False),
        ParityCase(model="transformer", microbatches=3),
        # SGD: Adam turns the key bias's zero gradient (pure rounding noise) into full-size steps.
        ParityCase(model="transformer", bf16=True, clip=0.5),
    ]
    if full:
        # The safe policies only: baseline fails by timing (that is the scenario's job, not parity's).
        cases += [ParityCase(policy=p, microbatches=3) for p in ("record_stream", "hold_until_wait")]
        cases.append(ParityCase(model="transformer", prefetch=False, reshard_after_forward=True))
    return cases
