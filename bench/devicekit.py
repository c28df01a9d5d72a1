"""The device benchmark's scaffolding: the report, the run context, one phase run in isolation
(``call_phase``, ``run_phase``) and its bookkeeping (``record_outcome``). Timing is bench/harness.py's
(``Ctx.measure`` is its ``measure`` on the run's device): one implementation for every benchmark.

bench/device_bench.py lists the phases (bench/device_model.py, bench/device_stream.py);
bench/devicewatch.py runs each one in a worker process under a deadline. Inside the worker a phase
is called through ``call_phase``: a Python exception costs that phase only. ``run_phase`` is the
same without a worker (no deadline can be enforced in-process; tests and quick local runs).
"""

from __future__ import annotations

import contextlib
import gc
import json
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from bench.harness import REPO, Stats, measure, sync

OUR_CODE = (str(REPO / "stages"), str(REPO / "pipeline"))  # where a host sync is ours to fix
# The smoke run's tiny models: 3 layers (GQA in the middle one) at a 128x96 input, so that every phase's
# CPU forwards cost little (the smoke run checks the code paths, not the figures).
SMOKE_SIZE, SMOKE_LAYERS = (128, 96), 3
BOOKKEEPING = ("errors", "skipped", "phase_seconds", "phases")  # results keys owned by the phase runner
FAILED = ("failed", "killed", "crashed", "stopped")  # outcomes that count as errors


class Report:
    """Markdown lines and a JSON tree, both written to OUT after every phase (and every event the
    worker sends, see bench/devicewatch.py)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.lines: list[str] = []
        self.results: dict[str, Any] = {"errors": {}, "skipped": [], "phase_seconds": {}, "phases": {}}

    def say(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)

    def table(self, header: list[str], rows: list[list[Any]]) -> None:
        self.table_header(header)
        for row in rows:
            self.table_row(row)

    def table_header(self, header: list[str]) -> None:
        """The head of a table whose rows come one at a time (``table_row`` as each is measured, so a
        phase ended by its watchdog keeps the rows it had in the markdown, not only in the JSON)."""
        self.say("| " + " | ".join(header) + " |")
        self.say("|" + "---|" * len(header))

    def table_row(self, row: list[Any]) -> None:
        self.say("| " + " | ".join(_cell(v) for v in row) + " |")

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "device_bench.md").write_text("\n".join(self.lines) + "\n")
        tmp = self.out / ".device_bench.json.tmp"
        tmp.write_text(json.dumps(self.results, indent=1, default=str))
        tmp.replace(self.out / "device_bench.json")  # never a half-written JSON, even when killed


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


@dataclass
class Ctx:
    """What every phase needs: where, at which precision, how long, and the checkpoints.

    deadline: time.monotonic() by which the current phase must be done (its watchdog limit or the
    end of the run's budget, whichever is first); a phase with rows (pipeline) skips the rows that
    would not fit.
    """

    device: torch.device
    smoke: bool
    iters: int
    seconds: float
    deadline: float
    report: Report
    ckpts: dict[str, Path] = field(default_factory=dict)
    cuda_only: str | None = None  # set by a phase whose measurement needs CUDA (the reason)
    phase_peak_gib: float = 0.0

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def dtype(self) -> torch.dtype:  # the run's precision: bf16 on the GPU, fp32 for the CPU smoke run
        return torch.bfloat16 if self.cuda else torch.float32

    @property
    def size(self) -> tuple[int, int]:  # model input (pose crops and dense frames)
        return SMOKE_SIZE if self.smoke else (1024, 768)

    @property
    def frame(self) -> tuple[int, int]:
        return (240, 320) if self.smoke else (1080, 1920)

    def say(self, line: str = "") -> None:
        self.report.say(line)

    def model(self, size: str) -> str:
        """How a report names a model: its published size, or "tiny" in the smoke run."""
        return "tiny" if self.smoke else size

    @property
    def precision(self) -> str:
        return str(self.dtype).replace("torch.", "")

    def ckpt(self, task: str) -> Path:
        """The checkpoint folder of a task, written by the checkpoints phase."""
        path = self.ckpts[task]
        if not (path / "model.safetensors").is_file():
            raise FileNotFoundError(f"no {task} checkpoint at {path}: the checkpoints phase did not complete")
        return path

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def mark_cuda_only(self, reason: str) -> None:
        """This phase ran its code path, but what it measures needs CUDA: say so in the report."""
        self.cuda_only = reason
        self.say(f"**n/a here (CUDA only)**: {reason}")

    def reset_peak(self) -> None:
        """Reset the CUDA peak-memory counter (for a row's own peak) without losing the phase's."""
        if self.cuda:
            self.phase_peak_gib = max(self.phase_peak_gib, torch.cuda.max_memory_allocated(self.device) / 2**30)
            torch.cuda.reset_peak_memory_stats(self.device)

    def step_peak_gib(self) -> float | None:
        """The peak since the last ``reset_peak`` (GiB), or None on the CPU."""
        return torch.cuda.max_memory_allocated(self.device) / 2**30 if self.cuda else None

    def peak_gib(self) -> float | None:
        if not self.cuda:
            return None
        return max(self.phase_peak_gib, torch.cuda.max_memory_allocated(self.device) / 2**30)

    def measure(self, fn: Callable[[], object], warmup: int = 3, iters: int | None = None) -> Stats:
        """bench.harness.measure on the run's device (CUDA events on a GPU, wall clock on the CPU), ctx.iters
        calls unless ``iters``. For a host-side cost (a blocking copy, an encoder) call harness.measure on
        the CPU: wall clock."""
        return measure(fn, iters or self.iters, warmup, self.device)

    def sync(self) -> None:
        sync(self.device)


# -- one phase -----------------------------------------------------------------------------------
@dataclass
class Outcome:
    """How one phase ended.

    status: ok | failed (a Python exception) | killed (overran its deadline: the watchdog ended it)
    | crashed (the worker process died) | stopped (the whole run was stopped while it ran: SIGTERM
    from the outer timeout) | skipped (not started: budget) | cuda-only (ran, but what it measures
    needs CUDA; ``note`` says why).
    """

    status: str
    seconds: float = 0.0
    error: str | None = None  # one line
    trace: str | None = None  # the traceback (Python's, or faulthandler's dump of every thread)
    note: str | None = None
    peak_gib: float | None = None
    restart: bool = False  # the worker must not run another phase (a CUDA error poisons its context)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _cuda_poisoned(exc: BaseException) -> bool:
    """After these the CUDA context of the process is unusable: the next phase needs a new process."""
    text = f"{type(exc).__name__}: {exc}"
    return "CUDA error" in text or type(exc).__name__ == "AcceleratorError" or "cuDNN error" in text


def call_phase(ctx: Ctx, name: str, fn: Callable[[Ctx], None]) -> Outcome:
    """Run one phase function; a Python exception is caught and becomes a failed Outcome."""
    ctx.cuda_only, ctx.phase_peak_gib = None, 0.0
    if ctx.cuda:
        torch.cuda.reset_peak_memory_stats(ctx.device)
    t0 = time.monotonic()
    try:
        fn(ctx)
        outcome = Outcome("cuda-only" if ctx.cuda_only else "ok", note=ctx.cuda_only)
    except Exception as exc:  # noqa: BLE001 - one broken phase must not cost the others' numbers
        trace = traceback.format_exc()
        print(trace, file=sys.stderr, flush=True)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        outcome = Outcome("failed", error=f"{type(exc).__name__}: {first[:300]}", trace=trace,
                          restart=_cuda_poisoned(exc))
    outcome.seconds = round(time.monotonic() - t0, 1)
    try:
        outcome.peak_gib = ctx.peak_gib()
    except Exception:  # noqa: BLE001 - a poisoned context cannot even say its peak
        outcome.restart = True
    gc.collect()
    if ctx.cuda and not outcome.restart:
        torch.cuda.empty_cache()
    return outcome


def record_outcome(report: Report, name: str, outcome: Outcome, estimate_s: float | None = None,
                   limit_s: float | None = None) -> None:
    """Write how a phase ended into the report (markdown and JSON) and save both."""
    res = report.results
    entry = dict(outcome.to_dict(), estimate_s=estimate_s, limit_s=limit_s)
    entry.pop("restart")
    res["phases"][name] = entry
    if outcome.status == "skipped":
        res["skipped"].append(name)
        report.say(f"\n(phase `{name}` skipped: {outcome.note})")
    else:
        res["phase_seconds"][name] = outcome.seconds
        if outcome.status in FAILED:
            res["errors"][name] = outcome.trace or outcome.error or outcome.status
        if outcome.status == "failed":
            report.say(f"\n**phase `{name}` failed**: {outcome.error}")
        elif outcome.status == "killed":
            limit = "" if limit_s is None else f", limit {limit_s:.0f} s"
            report.say(f"\n**phase `{name}` ended by the watchdog** after {outcome.seconds:.0f} s{limit}: "
                       f"{outcome.error}. Every thread's traceback is in device_bench.log (stderr) and "
                       f"device_bench.json (errors.{name}).")
        elif outcome.status == "stopped":
            report.say(f"\n**phase `{name}` cut short**: {outcome.error}")
        elif outcome.status == "crashed":
            report.say(f"\n**phase `{name}` crashed** (the worker process died): {outcome.error}")
        peak = "" if outcome.peak_gib is None else f", peak GPU memory {outcome.peak_gib:.2f} GiB"
        report.say(f"\n_(phase `{name}`: {outcome.seconds:.0f} s{peak})_")
    report.save()


def run_phase(ctx: Ctx, name: str, fn: Callable[[Ctx], None], needs_s: float) -> Outcome:
    """Run one phase in this process: skipped when the budget left (ctx.deadline) is under needs_s,
    its failure reported, not fatal. No deadline is enforced (bench/devicewatch.py does that)."""
    left = ctx.left_s()
    if left < needs_s:
        outcome = Outcome("skipped", note=f"{left:.0f} s of the time budget left, it needs about {needs_s:.0f} s")
    else:
        outcome = call_phase(ctx, name, fn)
    record_outcome(ctx.report, name, outcome, needs_s)
    return outcome


# -- helpers shared by the phases ----------------------------------------------------------------
@contextlib.contextmanager
def strict_float32():
    """True float32 matmuls and convolutions (cuDNN convolutions default to TF32 on CUDA)."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def sync_sites(fn: Callable[[], object], ours: tuple[str, ...] = OUR_CODE) -> dict[str, int]:
    """Run fn; for every synchronisation warning it raises (torch.cuda.set_sync_debug_mode("warn")
    emits one per synchronising call), the innermost line of our code on the stack, counted."""
    import warnings

    sites: dict[str, int] = {}

    def record(message, category, filename, lineno, file=None, line=None) -> None:
        if "synchroniz" not in str(message):
            return
        frames = [f for f in traceback.extract_stack()[:-1] if f.filename.startswith(ours)]
        where = f"{Path(frames[-1].filename).relative_to(REPO)}:{frames[-1].lineno}" if frames else \
            f"{Path(filename).name}:{lineno} (outside our code)"
        sites[where] = sites.get(where, 0) + 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        fn()
    return sites
