"""What the tests of racecheck's stream runtimes share (test_device_contract.py, test_cuda_runtime.py,
test_sim_semantics.py): a runtime for one test (conftest.py's `rt` fixture makes it here), holding
a stream while the host checks what has not run yet, and the CUDA warm-up that keeps a kernel's
first launch from synchronizing the device.

On the emulation a stream is held by a host gate its worker waits for, so no ordering depends on
timing; on CUDA by a spinning kernel (torch.cuda._sleep through rt.sleep) of HOLD_S seconds, far
longer than any host step between a launch and the check after it.
"""

from __future__ import annotations

import threading

import torch

HOLD_S = 0.2  # seconds a CUDA stream is held by a spinning kernel
GATE_TIMEOUT_S = 10.0  # a gate never opened fails the test instead of hanging it
LARGE = 1 << 20  # floats: a 4 MiB buffer, from CUDA's large pool


class StreamHold:
    """`hold()` holds the current stream's later work; `hold.release()` lets every held stream go
    (on CUDA the sleeps end by themselves). Never call it on the emulation's default stream: that
    one runs on the host, which would wait for its own gate."""

    def __init__(self, rt) -> None:
        self.rt = rt
        self.gates: list[threading.Event] = []

    def __call__(self) -> None:
        if self.rt.backend == "cuda":
            self.rt.sleep(HOLD_S)
            return
        gate = threading.Event()
        self.gates.append(gate)
        self.rt.launch("hold", lambda: gate.wait(GATE_TIMEOUT_S))

    def release(self) -> None:
        for gate in self.gates:
            gate.set()


def new_runtime(backend: str):
    """A runtime of `backend` for one test: the CPU emulation as the process's runtime (`sim`),
    or CUDA's, warmed up and with no cached block left over from earlier tests (`cuda`)."""
    if backend == "sim":
        from racecheck.device import init_runtime

        return init_runtime("sim")
    from racecheck.device.cuda import CudaRuntime

    torch.cuda.synchronize()
    runtime = CudaRuntime()
    warm_kernels(runtime.device)
    torch.cuda.empty_cache()  # no cached blocks left over from earlier tests or the warm-up
    return runtime


def close_runtime(runtime) -> None:
    if runtime.backend == "sim":
        from racecheck.device import shutdown_runtime

        shutdown_runtime()
    else:
        runtime.close()


def warm_kernels(device: torch.device) -> None:
    """Launch once each kernel the CUDA tests use, so that no later first launch (CUDA loads
    modules lazily) synchronizes the device and drains a held stream."""
    for n in (1, LARGE):
        x = torch.zeros(n, device=device)
        x.fill_(1.0).add_(1.0).mul_(3.0)
        torch.empty_like(x).copy_(x)
        bool((x == 1.0).all()), x.sum()
    torch.cuda.synchronize(device)
