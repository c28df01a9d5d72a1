"""Small timing library for the benchmarks (the CPU scripts and the device benchmark's phases alike):
warm-up excluded, p50/p95, CUDA events on the GPU.

    stats = measure(lambda: model(x), iters=50, warmup=5, device=x.device)
    print(stats.p50, stats.p95, stats.throughput)

On a CUDA device each iteration is bracketed by CUDA events recorded on the current stream and
read after one synchronize at the end, so timing adds no host sync between iterations (the
function itself may sync, e.g. to copy a result to the host). On the CPU it is perf_counter.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

REPO = Path(__file__).resolve().parents[1]  # the repository root: `python -m bench.<name>` runs there

@dataclass
class Stats:
    """Milliseconds per call over ``n`` timed calls; throughput in items per second (from the mean)."""

    p50: float
    p95: float
    mean: float
    throughput: float
    n: int
    samples_ms: list[float] = field(default_factory=list, repr=False)

    @classmethod
    def from_samples(cls, samples_ms: Sequence[float], items: int = 1) -> Stats:
        s = sorted(float(x) for x in samples_ms)
        if not s:
            raise ValueError("no samples")
        mean = statistics.fmean(s)
        return cls(p50=percentile(s, 50.0), p95=percentile(s, 95.0), mean=mean,
                   throughput=items * 1000.0 / mean if mean > 0 else float("inf"), n=len(s), samples_ms=s)

    def summary(self) -> dict[str, float]:
        """The numbers without the raw samples."""
        return {k: v for k, v in asdict(self).items() if k != "samples_ms"}


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile of values in any order (numpy's default method), q in 0..100."""
    s = sorted(float(v) for v in values)
    if not s:
        raise ValueError("percentile of no values")
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def sync(device: torch.device | str | None = None) -> None:
    """Wait for the work queued on a CUDA device; nothing to wait for on the CPU."""
    if torch.device(device or "cpu").type == "cuda":
        torch.cuda.synchronize(device)


class Timer:
    """Times one region: CUDA events on a CUDA device, perf_counter otherwise. Read ``ms`` after exit."""

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.cuda = torch.device(device or "cpu").type == "cuda"
        self._start: Any = None
        self._end: Any = None

    def __enter__(self) -> Timer:
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.cuda:
            self._end.record()
        else:
            self._end = time.perf_counter()

    @property
    def ms(self) -> float:
        """Elapsed milliseconds (waits for the end event on CUDA)."""
        if self.cuda:
            self._end.synchronize()
            return float(self._start.elapsed_time(self._end))
        return (self._end - self._start) * 1000.0


def measure(fn: Callable[[], object], iters: int, warmup: int = 3, device: torch.device | str | None = None,
            items: int = 1) -> Stats:
    """Call ``fn`` warmup times untimed, then ``iters`` timed times; ``items`` per call for throughput."""
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    for _ in range(warmup):
        fn()
    sync(device)
    timers = []
    for _ in range(iters):
        with Timer(device) as t:
            fn()
        timers.append(t)
    sync(device)
    return Stats.from_samples([t.ms for t in timers], items)


def measure_interleaved(fns: dict[str, Callable[[], object]], iters: int, warmup: int = 3,
                        device: torch.device | str | None = None, items: int = 1) -> dict[str, Stats]:
    """Like ``measure`` for several functions called in turn each iteration (A, B, A, B, ...).

    On a shared machine a burst of outside load then hits every path alike, so their ratio stays
    meaningful even when the absolute numbers are noisy.
    """
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    sync(device)
    timers: dict[str, list[Timer]] = {k: [] for k in fns}
    for _ in range(iters):
        for key, fn in fns.items():
            with Timer(device) as t:
                fn()
            timers[key].append(t)
    sync(device)
    return {k: Stats.from_samples([t.ms for t in ts], items) for k, ts in timers.items()}


def load_average() -> float | None:
    """1-minute load average (how busy the machine was with other work), None where unknown."""
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def cpu_busy(interval_s: float = 1.0) -> float | None:
    """Fraction (0..1) of all CPU time spent busy over interval_s, from /proc/stat; None where unknown."""

    def sample() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields), idle

    try:
        total0, idle0 = sample()
        time.sleep(interval_s)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return 1.0 - (idle1 - idle0) / max(1, total1 - total0)


def wait_quiet(max_wait_s: float, busy_below: float = 0.15) -> float | None:
    """Wait (up to max_wait_s) until other work leaves the CPU mostly idle; returns the last busy fraction."""
    deadline = time.monotonic() + max_wait_s
    busy = cpu_busy()
    while busy is not None and busy >= busy_below and time.monotonic() < deadline:
        busy = cpu_busy()
    return busy


def machine_info(device: torch.device | str | None = None) -> dict[str, Any]:
    """What the numbers were measured on: CPU count, threads, versions, GPU name."""
    import os

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "load_average_1m": load_average(),
    }
    if torch.device(device or "cpu").type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None, floatfmt: str = ".2f") -> str:
    """A plain fixed-width text table of dict rows (missing cells blank); returns the text."""
    if not rows:
        return "(no rows)"
    cols = list(columns or dict.fromkeys(k for r in rows for k in r))

    def cell(v: Any) -> str:
        if v is None:
            return ""
        if isinstance(v, float):
            return format(v, floatfmt)
        return str(v)

    cells = [[cell(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(cols, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def add_common_args(ap: "argparse.ArgumentParser", iters: int, warmup: int) -> None:
    """--iters, --warmup, --threads, --wait-quiet and --json, shared by every benchmark script."""
    ap.add_argument("--iters", type=int, default=iters)
    ap.add_argument("--warmup", type=int, default=warmup)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--wait-quiet", type=float, default=0.0, metavar="S",
                    help="wait up to S seconds for other jobs to leave the CPU idle first (shared machines)")
    ap.add_argument("--json", help="write every number (with raw samples) here")


def dump_json(path: str | Path, data: Any) -> None:
    """Write ``data`` as indented JSON (dataclasses such as Stats are converted)."""

    def default(o: Any) -> Any:
        if isinstance(o, Stats):
            return asdict(o)
        if isinstance(o, (torch.device, torch.dtype, Path)):
            return str(o)
        raise TypeError(f"not JSON serialisable: {type(o).__name__}")

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=2, default=default))


__all__ = ["REPO", "Stats", "Timer", "cpu_busy", "dump_json", "load_average", "machine_info", "measure",
           "measure_interleaved", "percentile", "sync", "table", "wait_quiet"]
