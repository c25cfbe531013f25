"""The GPU machine's scripts select the tests they say they run: a CUDA test of the detector that
no script selects would be taken for checked on a GPU without ever running there."""

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def collected(*args: str) -> set[str]:
    """The test functions pytest collects with `args` (parametrizations folded into their function)."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return {m[1] for m in re.finditer(r"^tests/\S+?::(\w+)", done.stdout, re.M)}


def test_the_native_paths_gpu_check_runs_every_cuda_test_of_the_detector_but_those_modern_code_runs():
    script = (ROOT / "bench" / "native_gpu.sh").read_text()
    (selection,) = re.findall(r'^NATIVE_CHECK="([^"]+)"$', script, re.M)
    assert 'tests/test_detect_engines.py -k "$NATIVE_CHECK"' in script
    source = (ROOT / "tests" / "test_detect_cuda.py").read_text()
    tests = {f.name for f in ast.parse(source).body if isinstance(f, ast.FunctionDef) and f.name.startswith("test_")}
    left_out = tests - collected("tests/test_detect_cuda.py", "-k", selection)
    # the compiled and Triton kernels' tests compile; bench/modern_code.sh runs the whole file
    assert left_out == {"test_kernels_below_the_dispatcher_are_tracked"}
    assert re.search(r"pytest .*tests/test_detect_cuda\.py", (ROOT / "bench" / "modern_code.sh").read_text())
    # among those run: the staging loop's test, which the selection before this left out
    assert "test_a_staging_buffers_block_allocated_again_after_its_upload_races_nothing" in tests - left_out
