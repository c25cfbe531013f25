#!/usr/bin/env bash
# On a one-GPU machine: what a user's own suite sees there (the README's "Your own code"), each with
# the command a user types, into $OUT/own_suite.log:
#   - a one-rank project whose conftest joins the world as under torchrun
#     (`if "RANK" in os.environ: dist.init_process_group("nccl")`) passes through `racecheck run`;
#   - `--world-size 2` on one GPU is a usage error (exit 2, one line) before any session starts;
#   - a hand-off point of a package installed with `pip install --target` (megatron-fsdp in
#     /tmp/site, bench/gpu_install.sh) is named below its sys.path entry, not by a machine path.
# Run after bench/gpu_install.sh has installed racecheck (bench/verdicts_gpu.sh does).
# Regenerates reports/gpu/verdicts/own_suite_x1.log (bench/verdicts_gpu.sh runs it).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 3
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/own-out}
P=$(mktemp -d)/project
mkdir -p "$P/tests"
cat >"$P/pyproject.toml" <<'EOF'
[tool.racecheck]
tests = ["tests"]
[tool.racecheck.arms.a]
expect = "safe"
EOF
cat >"$P/tests/conftest.py" <<'EOF'
import os

import pytest
import torch
import torch.distributed as dist


@pytest.fixture(scope="session", autouse=True)
def world():
    if "RANK" in os.environ:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
    yield
    if dist.is_initialized():
        dist.destroy_process_group()
EOF
cat >"$P/tests/test_world.py" <<'EOF'
import torch
import torch.distributed as dist


def test_all_reduce():
    t = torch.ones(4, device="cuda")
    dist.all_reduce(t)
    assert dist.get_world_size() == 1 and t.sum().item() == 4
EOF
{
  echo "== one rank, init_process_group('nccl') with its defaults"
  (cd "$P" && python3 -m racecheck run --trials 2 --out "$P/out" --no-perturb); echo "exit $?"
  echo "== --world-size 2 on $(python3 -c 'import torch; print(torch.cuda.device_count())') GPU(s)"
  (cd "$P" && python3 -m racecheck run --trials 2 --world-size 2 --out "$P/out2"); echo "exit $?"
  echo "== a hand-off point of megatron-fsdp installed with --target (/tmp/site)"
  (cd examples/megatron_fsdp && python3 -m racecheck run --arms asis --trials 1 --quiet --perturb systematic \
    --out "$P/out3" -- "tests/test_hsdp.py::test_hsdp_losses_match_baseline[1-True]")
  echo "exit $?"
  python3 -c "import json, glob; print([k for f in glob.glob('$P/out3/handoffs/*.json') for k in json.load(open(f))['points']][:6])"
} 2>&1 | tee "$OUT/own_suite.log"
