"""racecheck.fsdp matches a single-process reference on the CPU emulation over gloo: FSDP on 2 ranks
and HSDP on a 2x2 mesh, over the matrix of racecheck.scenario_kit.fsdp_parity.default_matrix (microbatches,
set_to_none, prefetch, accumulation without sync, bf16, AdamW with clipping, meta init, reshard
settings, a small transformer, the safe main_grad policies), plus the bitwise state-dict round trip.

One world per mesh runs every case; each case is then its own test that reads the world's verdict
(already max-reduced over the ranks). Process start dominates the cost, so ranks are forked from a
forkserver that imported torch (and torch._dynamo, which torch.optim imports on first use) once: a
fork of a process without threads, where a spawn would import torch again in every rank.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import time
import traceback
from multiprocessing import get_context

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from run_kit import free_port

from racecheck.scenario_kit import fsdp_parity as parity

MESHES = {"fsdp2": (2, 1), "hsdp2x2": (2, 2)}  # name -> (shard, replicate)
CASES = parity.default_matrix()
PERTURBED = parity.perturbed_matrix()
WORLD_TIMEOUT_S = 100


def _worker(rank: int, world: int, port: int, shard: int, replicate: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    from racecheck.device import init_runtime, shutdown_runtime
    from racecheck.fsdp import Mesh, MeshConfig

    rt = init_runtime("sim")
    results = []
    try:
        mesh = Mesh(MeshConfig(shard=shard, replicate=replicate), runtime=rt)
        for case in CASES:
            results.append(dataclasses.asdict(parity.run_case(case, mesh=mesh, runtime=rt)))
        for profile, case in parity.perturbed_matrix():
            results.append(dataclasses.asdict(parity.run_case(case, mesh=mesh, runtime=rt, perturb=profile)))
        baseline = parity.ParityCase(microbatches=3, policy="baseline")
        results.append(dataclasses.asdict(parity.run_case(baseline, mesh=mesh, runtime=rt, perturb=parity.TEETH)))
        results.append(dataclasses.asdict(parity.state_dict_round_trip(mesh=mesh, runtime=rt)))
        rt.synchronize()
    except BaseException:
        results.append({"name": "<crash>", "ok": False, "detail": traceback.format_exc()})
        raise
    finally:
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)
        shutdown_runtime()
        dist.destroy_process_group()


def _start_world(name: str, out_dir: str):
    """The ranks of one mesh's world, started; `_world_results` waits for them."""
    shard, replicate = MESHES[name]
    world = shard * replicate
    get_context("forkserver").set_forkserver_preload(["torch", "torch._dynamo", "racecheck.scenario_kit.fsdp_parity"])
    return mp.start_processes(
        _worker,
        args=(world, free_port(), shard, replicate, out_dir),
        nprocs=world,
        join=False,
        start_method="forkserver",
    )


def _world_results(name: str, ctx, started: float, out_dir: str) -> dict[str, dict]:
    deadline = started + WORLD_TIMEOUT_S
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                raise RuntimeError(f"{name}: the world did not finish (a hang in a collective?)")
    except mp.ProcessRaisedException:
        pass  # its traceback is in the rank's results, reported by the tests that need it
    with open(os.path.join(out_dir, "rank0.json")) as f:
        return {r["name"]: r for r in json.load(f)}


def _meshes_selected(request) -> list[str]:
    """The meshes that this module's selected tests read."""
    params = [getattr(item, "callspec", None) for item in request.session.items if item.module is request.module]
    return [name for name in MESHES if any(p is not None and p.params.get("mesh_name") == name for p in params)]


@pytest.fixture(scope="module")
def worlds(request, tmp_path_factory):
    """Each mesh's world, shared by every test of this module. At first use every world that the
    selected tests need starts at once: on a machine of few cores one world's ranks compute while
    another's wait in a collective, so together they take less time than one after the other."""
    needed = _meshes_selected(request)
    running: dict[str, tuple] = {}
    cache: dict[str, dict[str, dict]] = {}

    def get(name: str) -> dict[str, dict]:
        if name not in cache:
            for other in dict.fromkeys([name, *needed]):
                if other not in cache and other not in running:
                    out_dir = str(tmp_path_factory.mktemp(other))
                    running[other] = (_start_world(other, out_dir), time.monotonic(), out_dir)
            ctx, started, out_dir = running.pop(name)
            cache[name] = _world_results(name, ctx, started, out_dir)
        return cache[name]

    yield get
    for ctx, _, _ in running.values():  # a world that no test read in the end (the run stopped early)
        for p in ctx.processes:
            p.kill()
            p.join()


def _verdict(results: dict[str, dict], name: str) -> None:
    if name not in results:
        crash = results.get("<crash>", {}).get("detail", "no result and no crash report")
        pytest.fail(f"{name}: no result; the world stopped early:\n{crash}")
    r = results[name]
    assert r["ok"], (
        f"{name}: worst parameter {r.get('worst_param')!r} update off by "
        f"{r.get('param_error', float('nan')):.3g}, losses off by {r.get('loss_error', float('nan')):.3g} "
        f"(tolerance {r.get('rtol')}) {r.get('detail', '')}"
    )


@pytest.mark.slow
@pytest.mark.parametrize("mesh_name", list(MESHES))
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_parity(worlds, mesh_name, case):
    _verdict(worlds(mesh_name), case.name)


@pytest.mark.slow
@pytest.mark.parametrize("mesh_name", list(MESHES))
@pytest.mark.parametrize("profile,case", PERTURBED, ids=[f"{c.name}@{p}" for p, c in PERTURBED])
def test_parity_under_perturbation(worlds, mesh_name, profile, case):
    _verdict(worlds(mesh_name), f"{case.name}@{profile}")


@pytest.mark.slow
@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_parity_fails_for_the_baseline_race(worlds, mesh_name):
    """Poison-on-free fills the dropped main_grad with NaN while the (delayed) reduce-scatter still
    has to read it: the baseline policy must fail the same comparison the safe ones pass."""
    r = worlds(mesh_name).get(f"mlp-mb3-none-prefetch-baseline@{parity.TEETH}")
    assert r is not None and not r["ok"], f"the baseline race went unnoticed: {r}"


@pytest.mark.slow
@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_state_dict_round_trip_is_bitwise(worlds, mesh_name):
    _verdict(worlds(mesh_name), "state_dict-transformer")
