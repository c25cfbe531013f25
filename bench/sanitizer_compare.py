"""racecheck's detector and torch.cuda._sanitizer, side by side, on a plain-PyTorch reproduction of
the motivating race and on its three correct versions (needs one CUDA GPU).

    python bench/sanitizer_compare.py --out reports/gpu

The pattern (README.md, "The motivating race"), in plain PyTorch, for G gradient groups:
a group's `main_grad` A is allocated on the default stream; inside a reduce-scatter stream context
the gradient is accumulated into A and a reduce-scatter reads A into a new buffer B; then A loses
its last reference (the rebinding `main_grad = B`) and the next default-stream allocation of its
size gets A's block. A `torch.cuda._sleep` holds the reduce-scatter back so that, with no tool,
the corruption shows. Versions:
  race             the pattern as above
  fixed            A allocated lazily inside the reduce-scatter stream context
  record_stream    A.record_stream(reduce_scatter_stream) before the drop
  hold_until_wait  A held with an event until the default stream waited on it (FSDP2's way)
The collective is a one-rank NCCL reduce-scatter (a copy kernel if NCCL cannot start).

Every (version, tool) pair runs in a fresh process, so that one tool's CUDA trace callbacks never
see the other's run: tool `none` (the corruption alone), `racecheck`
(racecheck.detect.TorchRaceTracker) and `sanitizer` (torch.cuda._sanitizer.enable_cuda_sanitizer).
Writes DIR/sanitizer_compare.csv, DIR/sanitizer_compare.md and DIR/racecheck_report_race.txt (the
report racecheck printed for the race), and prints the table last; exit code 1 when a run did not
finish.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VERSIONS = {  # version -> expected verdict
    "race": "race",
    "fixed": "safe",
    "record_stream": "safe",
    "hold_until_wait": "safe",
}
TOOLS = ("none", "racecheck", "sanitizer")


# -- the pattern (child process) ---------------------------------------------------------------
def reduce_scatter_fn(mode: str):
    import torch.distributed as dist

    if mode == "nccl":
        return lambda out, inp: dist.reduce_scatter_tensor(out, inp)  # async_op=False: current stream
    return lambda out, inp: out.copy_(inp)


def run_pattern(
    version: str, *, numel: int, groups: int, steps: int, sleep_cycles: int, collective: str, tracker=None
) -> float:
    """Runs the pattern; returns the largest relative error of a reduced gradient."""
    import torch

    dev = torch.device("cuda", 0)
    default = torch.cuda.current_stream(dev)
    rs = torch.cuda.Stream(dev)  # the reduce-scatter stream
    if tracker is not None:
        tracker.name_stream(rs, "reduce_scatter")
    reduce_scatter = reduce_scatter_fn(collective)
    gen = torch.Generator(device=dev).manual_seed(0)
    grads = [torch.randn(numel, device=dev, generator=gen) for _ in range(groups)]  # autograd's output
    eager = version != "fixed"
    main_grads = [torch.zeros(numel, device=dev) if eager else None for _ in range(groups)]  # __init__
    worst = 0.0
    for _ in range(steps):
        reduced, held = [], []
        for g in range(groups):
            rs.wait_stream(default)  # producer: default wrote the gradient; consumer: rs
            with torch.cuda.stream(rs):
                a = main_grads[g] if eager else torch.zeros(numel, device=dev)  # fixed: allocated on rs
                a.add_(grads[g])
                torch.cuda._sleep(sleep_cycles)  # the collective is held back, as on a busy NCCL stream
                b = torch.empty(numel, device=dev)
                reduce_scatter(b, a)
                if version == "record_stream":
                    # Producer: default allocated A; consumer: rs, which the allocator waits for
                    # before A's block goes back to the default pool.
                    a.record_stream(rs)
                elif version == "hold_until_wait":
                    ev = torch.cuda.Event()
                    ev.record(rs)  # marks rs's last read of A; the default stream waits on it below
                    held.append((a, ev))
                reduced.append(b)
            main_grads[g] = None
            del a  # `self.main_grad = B`: A's last reference
            if eager:
                main_grads[g] = torch.zeros(numel, device=dev)  # default stream: reuses A's block (race)
        for _, ev in held:
            default.wait_event(ev)  # producer: rs read A; consumer: the default stream's reuse
        held.clear()
        default.wait_stream(rs)  # the optimizer reads the reduced gradients
        for g in range(groups):
            err = ((reduced[g] - grads[g]).norm() / grads[g].norm()).item()
            worst = max(worst, err)
    torch.cuda.synchronize()
    return worst


def init_collective(requested: str) -> str:
    import torch
    import torch.distributed as dist

    if requested == "copy":
        return "copy"
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group(
            "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1, device_id=torch.device("cuda", 0)
        )
        probe = torch.ones(4, device="cuda")
        out = torch.empty(4, device="cuda")
        dist.reduce_scatter_tensor(out, probe)
        torch.cuda.synchronize()
        return "nccl"
    except Exception as exc:  # noqa: BLE001 - any failure: fall back to a copy kernel
        print(f"NCCL unavailable ({type(exc).__name__}: {exc}); using a copy kernel", file=sys.stderr)
        return "copy"


def child(args) -> dict:
    import torch

    sys.path.insert(0, str(REPO))
    collective = init_collective(args.collective)
    result = {
        "version": args.version,
        "tool": args.tool,
        "collective": collective,
        "reported": False,
        "reports": 0,
        "first": "",
        "text": "",
        "max_rel_error": None,
        "errors": [],
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
    }
    kw = dict(
        numel=args.numel, groups=args.groups, steps=args.steps, sleep_cycles=args.sleep_cycles, collective=collective
    )
    started = time.perf_counter()
    if args.tool == "racecheck":
        from racecheck.detect import TorchRaceTracker

        with TorchRaceTracker() as tracker:
            result["max_rel_error"] = run_pattern(args.version, tracker=tracker, **kw)
        reports = tracker.reports()
        result.update(reported=bool(reports), reports=len(reports), errors=tracker.errors)
        if reports:
            result["first"] = reports[0].sentence()
            result["text"] = tracker.render()
    elif args.tool == "sanitizer":
        import torch.cuda._sanitizer as csan

        csan.enable_cuda_sanitizer()
        try:
            result["max_rel_error"] = run_pattern(args.version, **kw)
        except csan.CUDASanitizerErrors as exc:
            result.update(
                reported=True,
                reports=len(exc.errors),
                first=str(exc.errors[0]).strip().splitlines()[1] if exc.errors else str(exc),
                text="\n".join(str(e) for e in exc.errors),
            )
    else:
        result["max_rel_error"] = run_pattern(args.version, **kw)
    result["seconds"] = round(time.perf_counter() - started, 3)
    return result


# -- the table (parent process) ----------------------------------------------------------------
def parent(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    env = {**os.environ, "CUDA_MODULE_LOADING": "EAGER", "PYTHONUNBUFFERED": "1"}
    for version in VERSIONS:
        for tool in TOOLS:
            result_path = out / f".compare-{version}-{tool}.json"
            cmd = [
                sys.executable,
                __file__,
                "--child",
                "--version",
                version,
                "--tool",
                tool,
                "--json",
                str(result_path),
                "--numel",
                str(args.numel),
                "--groups",
                str(args.groups),
                "--steps",
                str(args.steps),
                "--sleep-cycles",
                str(args.sleep_cycles),
                "--collective",
                args.collective,
            ]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
            if proc.returncode != 0 or not result_path.exists():
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
                row = {"version": version, "tool": tool, "reported": None, "errors": tail}
            else:
                row = json.loads(result_path.read_text())
                result_path.unlink()
            row["expected"] = VERSIONS[version]
            rows.append(row)
            print(
                f"{version:16} {tool:10} reported={row.get('reported')} "
                f"max_rel_error={row.get('max_rel_error')} {row.get('errors') or ''}",
                flush=True,
            )
    write_outputs(out, rows)
    return 0 if all(r.get("reported") is not None for r in rows) else 1  # a run that did not finish fails


def verdict(row) -> str:
    if row.get("reported") is None:
        return "did not run"
    if row["tool"] == "none":
        return "-"
    return "reported" if row["reported"] else "not reported"


def corrupted(row) -> str:
    err = row.get("max_rel_error")
    if err is None:
        return "n/a (stopped)" if row.get("reported") else "n/a"
    return f"{'yes' if err > 1e-5 else 'no'} ({err:.0%})"


def write_outputs(out: Path, rows: list[dict]) -> None:
    fields = [
        "version",
        "expected",
        "tool",
        "reported",
        "reports",
        "max_rel_error",
        "corrupted",
        "collective",
        "seconds",
        "first",
        "errors",
        "torch",
        "device",
    ]
    with open(out / "sanitizer_compare.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for row in rows:
            w.writerow({**row, "corrupted": corrupted(row), "errors": " | ".join(map(str, row.get("errors") or []))})
    race = next((r for r in rows if r["version"] == "race" and r["tool"] == "racecheck" and r.get("text")), None)
    if race is not None:
        (out / "racecheck_report_race.txt").write_text(race["text"] + "\n")
    meta = next((r for r in rows if r.get("torch")), {})
    lines = [
        "# racecheck vs torch.cuda._sanitizer on the motivating race (plain PyTorch)",
        "",
        f"Device: {meta.get('device', '?')}; torch {meta.get('torch', '?')}; collective: "
        f"{meta.get('collective', '?')}. One run per cell, no perturbation beyond the pattern's own "
        f"`torch.cuda._sleep` before the collective; each cell is a fresh process.",
        "",
        "| version | expected | racecheck | torch.cuda._sanitizer | corrupted without a tool |",
        "| --- | --- | --- | --- | --- |",
    ]
    by = {(r["version"], r["tool"]): r for r in rows}
    for version, expected in VERSIONS.items():
        none, rc, san = (by.get((version, t), {"tool": t}) for t in ("none", "racecheck", "sanitizer"))
        lines.append(f"| {version} | {expected} | {verdict(rc)} | {verdict(san)} | {corrupted(none)} |")
    lines += [
        "",
        "Details (one row per run):",
        "",
        "| version | tool | reported | reports | corrupted | seconds | first sentence |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        first = str(r.get("first", "")).replace("|", "\\|")[:200]
        lines.append(
            f"| {r['version']} | {r['tool']} | {verdict(r)} | {r.get('reports', '')} | {corrupted(r)} | "
            f"{r.get('seconds', '')} | {first} |"
        )
    if race is not None:
        lines += ["", "racecheck's report for the race: `racecheck_report_race.txt`."]
    (out / "sanitizer_compare.md").write_text("\n".join(lines) + "\n")
    print()
    print("\n".join(lines[4 : 4 + 2 + len(VERSIONS)]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="reports/gpu", help="output folder (CSV + Markdown)")
    p.add_argument("--numel", type=int, default=4 << 20, help="floats per group buffer (default 16 MiB)")
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--sleep-cycles", type=int, default=1_000_000, help="torch.cuda._sleep before the collective")
    p.add_argument("--collective", choices=["nccl", "copy"], default="nccl")
    p.add_argument("--timeout", type=float, default=300, help="seconds per run")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--version", choices=list(VERSIONS), help=argparse.SUPPRESS)
    p.add_argument("--tool", choices=TOOLS, help=argparse.SUPPRESS)
    p.add_argument("--json", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        result = child(args)
        Path(args.json).write_text(json.dumps(result))
        return 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
