"""Patch mode next to modern PyTorch: FSDP2, DTensor and the functional collectives imported after it
started, and torch.compile (Inductor's C++ backend on the CPU), work as they do without it, under
every profile patch mode takes; uninstalling leaves torch's operators and Dynamo's tables as they
were.

Each check runs in a fresh process, so that the imports really happen while patch mode is
installed: the first profile is installed before anything of torch.distributed is imported, the
others one after the other in the same process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from run_kit import free_port

from racecheck.perturb.patch import PatchMode
from racecheck.perturb.profiles import PROFILES, parse_profile

# What one process does: for each profile, install patch mode, use the modern APIs, uninstall and
# compare what torch and Dynamo look up with what they held before.
SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    from racecheck.perturb.patch import PatchMode
    from racecheck.perturb.profiles import parse_profile

    def namespace_view():
        ns = torch.ops._c10d_functional
        names = ["all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "wait_tensor",
                 "all_gather_into_tensor_out"]
        return {n: (getattr(ns, n), tuple(getattr(ns, n).overloads())) for n in names}, dict(vars(ns))

    def python_kernels():
        return sorted(
            name for name in torch._C._dispatch_get_all_op_names()
            if name.startswith("_c10d_functional")
            and torch._C._dispatch_has_kernel_for_dispatch_key(name, "BackendSelect")
        )

    before = namespace_view()  # what torch holds before patch mode ever starts
    kernels_before = python_kernels()
    results = []
    for i, spec in enumerate(sys.argv[1:]):
        patch = PatchMode(parse_profile(spec), seed=i).install()
        try:
            # Imported here the first time round: the modules register autograd formulas, fake
            # kernels and lowerings for the functional collectives as they load.
            import torch.distributed as dist
            import torch.distributed._functional_collectives as funcol
            from torch.distributed.fsdp import fully_shard
            from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

            if not dist.is_initialized():
                os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
                dist.init_process_group("gloo", rank=0, world_size=1)
                mesh = torch.distributed.device_mesh.init_device_mesh("cpu", (1,))
            during = python_kernels()
            torch._dynamo.reset()

            @torch.compile(backend="inductor")
            def step(x):
                return funcol.all_reduce(x * 2 + 1, "sum", dist.group.WORLD).sin()

            x = torch.arange(8.0)
            got = step(x)
            gathered = distribute_tensor(torch.arange(6.0), mesh, [Shard(0)]).redistribute(mesh, [Replicate()])
            model = fully_shard(torch.nn.Sequential(torch.nn.Linear(4, 4)), mesh=mesh)
            model(torch.ones(2, 4)).sum().backward()
            results.append({
                "spec": spec,
                "compiled": torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0,
                "right": bool(torch.allclose(got, (x * 2 + 1).sin())),
                "dtensor": bool(torch.equal(gathered.full_tensor(), torch.arange(6.0))),
                "kernels_during": during,
            })
        finally:
            patch.uninstall()
        after = namespace_view()
        results[-1]["namespace_same"] = (
            all(after[0][n][0] is before[0][n][0] and after[0][n][1] == before[0][n][1] for n in before[0])
            and all(after[1].get(k) is v for k, v in before[1].items())
        )
        results[-1]["kernels_after"] = python_kernels() == kernels_before
        rules = torch._dynamo.trace_rules.get_torch_obj_rule_map()
        results[-1]["dynamo_rules"] = torch.cuda.set_stream in rules and torch.cuda.stream in rules
    print("RESULTS " + json.dumps(results))
    """
)


def _patch_profiles() -> list[str]:
    """Every named profile patch mode takes (the others need racecheck's runtime)."""
    names = []
    for name in PROFILES:
        if name == "off":
            continue
        try:
            PatchMode(parse_profile(name), actions=object())
        except ValueError:
            continue
        names.append(name)
    return names


def test_patch_mode_takes_the_named_profiles_of_a_users_suite():
    names = _patch_profiles()
    assert {"enter_delay", "wait_delay", "record_delay", "poison", "pressure", "random", "systematic"} <= set(names)


def test_modern_pytorch_works_under_patch_mode_and_is_left_as_it_was(tmp_path):
    """The issue's reproduction first (`from torch.distributed.fsdp import fully_shard`, or a
    torch.compile'd function, under a profile with a collective point), then, in the same process,
    the systematic and random schedules and every other named profile."""
    first = "sleep@before_all_gather:5ms"
    specs = [first, "systematic", "random", *[p for p in _patch_profiles() if p not in ("systematic", "random")]]
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, *specs],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        env={**os.environ, "PORT": str(free_port()), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")},
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULTS ")), None)
    assert line is not None, proc.stderr[-3000:]
    results = json.loads(line[len("RESULTS ") :])
    assert [r["spec"] for r in results] == specs
    for r in results:
        assert r["compiled"] and r["right"] and r["dtensor"], r
        assert r["namespace_same"] and r["kernels_after"] and r["dynamo_rules"], r
    # While a profile with collective points was installed, the functional collectives had patch
    # mode's kernel at the dispatcher (and only then: kernels_after).
    assert results[0]["kernels_during"], results[0]
