"""The device benchmark's scaffolding: the report, the run context, timing helpers, isolated phases.

bench/device_bench.py runs the phases (bench/device_model.py, bench/device_stream.py) through
``run_phase``: each one isolated, timed, skipped when the budget is short, and the report rewritten
after it so a run cut short keeps what it measured.
"""

from __future__ import annotations

import contextlib
import gc
import json
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import measure, percentile  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
OUR_CODE = (str(REPO / "stages"), str(REPO / "pipeline"))  # where a host sync is ours to fix


class Report:
    """Markdown lines and a JSON tree, both written to OUT after every phase."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.lines: list[str] = []
        self.results: dict[str, Any] = {"errors": {}, "skipped": [], "phase_seconds": {}}

    def say(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)

    def table(self, header: list[str], rows: list[list[Any]]) -> None:
        self.say("| " + " | ".join(header) + " |")
        self.say("|" + "---|" * len(header))
        for row in rows:
            self.say("| " + " | ".join(_cell(v) for v in row) + " |")

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "device_bench.md").write_text("\n".join(self.lines) + "\n")
        (self.out / "device_bench.json").write_text(json.dumps(self.results, indent=1, default=str))


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


@dataclass
class Ctx:
    """What every phase needs: where, at which precision, how long, and the checkpoints."""

    device: torch.device
    smoke: bool
    iters: int
    seconds: float
    deadline: float
    report: Report
    ckpts: dict[str, Path] = field(default_factory=dict)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def dtype(self) -> torch.dtype:  # the run's precision: bf16 on the GPU, fp32 for the CPU smoke run
        return torch.bfloat16 if self.cuda else torch.float32

    @property
    def size(self) -> tuple[int, int]:  # model input (pose crops and dense frames)
        return (256, 192) if self.smoke else (1024, 768)

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

    def ms(self, fn: Callable[[], object], warmup: int = 3, iters: int | None = None) -> list[float]:
        """Per-call milliseconds (CUDA events on a GPU, wall clock on the CPU), warm-up excluded."""
        return measure(fn, iters or self.iters, warmup, self.device).samples_ms

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)


def p50(samples: list[float]) -> float:
    return percentile(sorted(samples), 50.0)


def p95(samples: list[float]) -> float:
    return percentile(sorted(samples), 95.0)


def wall_ms(fn: Callable[[], object], iters: int, warmup: int = 3) -> list[float]:
    """Wall-clock milliseconds per call: for host-side costs (a blocking copy, an encoder)."""
    return measure(fn, iters, warmup, "cpu").samples_ms


def run_phase(ctx: Ctx, name: str, fn: Callable[[Ctx], None], needs_s: float) -> None:
    """Run one phase in isolation: skipped when the budget is short, its failure reported, not fatal."""
    report = ctx.report
    left = ctx.deadline - time.perf_counter()
    if left < needs_s:
        report.say(f"\n(phase `{name}` skipped: {left:.0f} s of the time budget left, it needs about {needs_s:.0f} s)")
        report.results["skipped"].append(name)
        report.save()
        return
    t0 = time.perf_counter()
    try:
        fn(ctx)
    except Exception as exc:  # noqa: BLE001 - one broken phase must not cost the others' numbers
        trace = traceback.format_exc()
        print(trace, file=sys.stderr, flush=True)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        report.say(f"\n**phase `{name}` failed**: {type(exc).__name__}: {first[:300]}")
        report.results["errors"][name] = trace
    finally:
        report.results["phase_seconds"][name] = round(time.perf_counter() - t0, 1)
        report.say(f"\n_(phase `{name}`: {time.perf_counter() - t0:.0f} s)_")
        report.save()
        gc.collect()
        if ctx.cuda:
            torch.cuda.empty_cache()


# -- checkpoints ---------------------------------------------------------------------------------
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
