"""The kernel watch (racecheck/detect/kernel_launches.py) on the CPU: which tensors a launch reads
and writes, the wrappers it puts on the launch methods and takes off again, and its import hook,
which gives a module imported after the watch started its wrapper. The launches themselves need a
GPU (tests/test_detect_cuda.py, bench/gpu_check.sh); here Inductor's CachingAutotuner.run is called
on a stand-in for a compiled kernel, and the original method's failure on it is expected."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import types

import pytest
import torch

from racecheck.detect.kernel_launches import KernelWatch, inductor_roles


def test_inductor_kernels_are_read_and_written_by_their_argument_names():
    names = ["in_ptr0", "out_ptr0", "in_out_ptr0", "ws_ptr", "xnumel"]
    signature = {"in_ptr0": "*fp32", "out_ptr0": "*fp32", "in_out_ptr0": "*bf16", "ws_ptr": "*u8", "xnumel": "i32"}
    assert inductor_roles(names, signature) == ((0, True, False), (1, False, True), (2, True, True), (3, False, True))
    assert inductor_roles(["x_ptr", "out_ptr0"], {"x_ptr": "*fp32", "out_ptr0": "*fp32"}) is None  # not Inductor's


class _Tuner:
    """What the watch reads of a CachingAutotuner: enough to classify a launch, not to run one."""

    def __init__(self, kernel_name: str, names: list[str], signature: dict[str, str]) -> None:
        self.triton_meta = {"signature": signature, "constants": {}}
        self.inductor_meta = {"kernel_name": kernel_name}
        self.fn = types.SimpleNamespace(arg_names=names, __name__=kernel_name)
        self.launchers: list = []


@pytest.fixture
def watch():
    from torch._inductor.runtime import triton_heuristics

    launches: list = []
    errors: list = []
    original = triton_heuristics.CachingAutotuner.run
    w = KernelWatch(lambda *launch: launches.append(launch), errors.append)
    assert w.install()
    assert triton_heuristics.CachingAutotuner.run is not original
    assert not KernelWatch(lambda *a: None, errors.append).install()  # one watch at a time
    yield w, launches, errors, triton_heuristics
    w.uninstall()
    assert triton_heuristics.CachingAutotuner.run is original


def _launch(module, tuner, *args, stream, **kwargs):
    with pytest.raises(Exception):  # noqa: B017 - the real method cannot run a stand-in
        module.CachingAutotuner.run(tuner, *args, stream=stream, **kwargs)


def test_an_inductor_launch_is_reported_on_its_stream_with_its_reads_and_writes(watch):
    w, launches, errors, module = watch
    x, out = torch.zeros(4), torch.zeros(4)
    tuner = _Tuner(
        "triton_poi_fused_add_0",
        ["in_ptr0", "out_ptr0", "xnumel", "XBLOCK"],
        {"in_ptr0": "*fp32", "out_ptr0": "*fp32", "xnumel": "i32", "XBLOCK": "constexpr"},
    )
    _launch(module, tuner, x, out, 4, 7, stream=0x51)  # 7: a grid argument after the kernel's own
    ((name, stream, reads, writes, known),) = launches
    assert (name, stream, known) == ("triton_poi_fused_add_0", 0x51, True)
    assert reads == [x] and writes == [out]
    assert errors == []


def test_a_user_kernel_the_analysis_cannot_read_counts_as_reads_and_says_so(watch):
    """On the CPU there is no Triton to analyze the kernel with: its writes are unknown."""
    w, launches, errors, module = watch
    x, out = torch.zeros(4), torch.zeros(4)
    tuner = _Tuner("add_kernel_0", ["x_ptr", "out_ptr", "n"], {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"})
    _launch(module, tuner, x, out, 4, stream=0)
    ((name, stream, reads, writes, known),) = launches
    assert (name, known, writes) == ("add_kernel_0", False, [])
    assert reads == [x, out]


def test_a_benchmarking_run_is_not_the_programs_launch(watch):
    w, launches, errors, module = watch
    tuner = _Tuner("triton_poi_fused_add_0", ["in_ptr0"], {"in_ptr0": "*fp32"})
    _launch(module, tuner, torch.zeros(2), stream=0, benchmark_run=True)
    assert launches == []


def test_a_module_imported_after_the_watch_started_gets_its_wrapper_and_keeps_its_loader():
    script = textwrap.dedent(
        """
        import sys
        from racecheck.detect.kernel_launches import KernelWatch
        assert "torch._inductor.runtime.triton_heuristics" not in sys.modules
        hooks = list(sys.meta_path)
        w = KernelWatch(lambda *a: None, print)
        w.install()
        from torch._inductor.runtime import triton_heuristics as th
        wrapped = getattr(th.CachingAutotuner.run, "_racecheck_watch", None) is w
        loader = type(th.__loader__).__name__, type(th.__spec__.loader).__name__
        w.uninstall()
        print(wrapped, loader, getattr(th.CachingAutotuner.run, "_racecheck_watch", None), sys.meta_path == hooks)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.stdout.split("\n")[-2] == "True ('SourceFileLoader', 'SourceFileLoader') None True", out.stderr[-2000:]
