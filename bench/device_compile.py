"""Device benchmark phases about the fast path: each fast-path switch against the default, and
torch.compile with CUDA graphs."""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
import torch

from bench.device_stream import person_boxes
from bench.devicekit import Ctx, p50, p95
from stages.sapiens2.weights import load_model


def _ablation_row(ctx: Ctx, rows: list[list[Any]], label: str, make: Callable[[], Any], crops: torch.Tensor, n: int,
                  base: torch.Tensor | None, base_ms: float | None) -> tuple[Any, torch.Tensor | None, float | None]:
    """Build an estimator with make(), time its infer on crops and take its largest difference from
    base (relative to base's largest value). A variant that fails costs its own row only."""
    try:
        est = make()
        with torch.inference_mode():
            out = est.infer(crops, n).float()
            samples = ctx.ms(lambda: est.infer(crops, n))
    except Exception as exc:  # noqa: BLE001 - e.g. a kernel that passed the probe but rejects the real call
        if base is None:
            raise
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        ctx.report.results["fastpath"].append(dict(variant=label, error=f"{type(exc).__name__}: {first}"))
        rows.append([label, f"failed: {type(exc).__name__}: {first}", None, None, None, "-", "-"])
        return None, None, None
    diff = None if base is None else float((out - base).abs().max() / base.abs().max())
    ms = p50(samples)
    row = dict(variant=label, resolved=est.fastpath.describe(est.model), batch=int(crops.shape[0]), ms=samples,
               max_rel_diff=diff)
    ctx.report.results["fastpath"].append(row)
    rows.append([label, row["resolved"], row["batch"], ms, p95(samples),
                 "-" if base_ms is None else f"{base_ms / ms:.2f}x", "-" if diff is None else f"{diff:.1e}"])
    return est, out, ms


def phase_fastpath(ctx: Ctx) -> None:
    """Each fast-path switch against the default, one at a time, on the pose model with 4 persons."""
    from stages.sapiens2.estimators import PoseEstimator
    from stages.sapiens2.fastpath import FastPath

    ctx.say(f"\n## Fast-path switches, pose {ctx.model('0.4b')}, {ctx.precision}, 4 persons "
            "(crops -> heatmaps; CUDA events on a GPU)\n")
    ctx.report.results["fastpath"] = []
    rows: list[list[Any]] = []
    rng = np.random.default_rng(0)
    h, w = ctx.frame
    image = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
    boxes = person_boxes(4, w, h)
    fused = load_model(ctx.ckpt("pose"), device=ctx.device, dtype=ctx.dtype)

    def estimator(model=fused, **kwargs) -> Callable[[], PoseEstimator]:
        return lambda: PoseEstimator(model, input_size=ctx.size, **kwargs)

    default = estimator()()
    with torch.inference_mode():
        image_t = default.image_tensor(image)
        boxes_t = torch.as_tensor(boxes, device=ctx.device)
        crops = default.preprocess(image_t, boxes_t)
        crops3 = default.preprocess(image_t, boxes_t[:3])  # 3 persons, padded to a batch of 4
    _, base, base_ms = _ablation_row(ctx, rows, "default", lambda: default, crops, 4, None, None)
    unfused = load_model(ctx.ckpt("pose"), device=ctx.device, dtype=ctx.dtype, fuse_qkv=False)
    _ablation_row(ctx, rows, "QKV projections unfused", estimator(unfused), crops, 4, base, base_ms)
    del unfused
    for attention in ("flash", "efficient", "cudnn", "math"):
        _ablation_row(ctx, rows, f"attention {attention}", estimator(fastpath=FastPath(attention=attention)), crops,
                      4, base, base_ms)
    flip = not (default.fastpath.channels_last or False)
    _ablation_row(ctx, rows, f"channels_last {'on' if flip else 'off'}",
                  estimator(fastpath=FastPath(channels_last=flip)), crops, 4, base, base_ms)
    estimator()()  # the shared model back to the default layout
    # Buckets: 3 persons padded to a batch of 4 (default) vs exactly 3.
    _, padded3, padded_ms = _ablation_row(ctx, rows, "3 persons, padded to bucket 4 (default)", lambda: default,
                                          crops3, 3, None, None)
    _ablation_row(ctx, rows, "3 persons, no buckets (batch 3)", estimator(buckets=False), crops3[:3], 3, padded3,
                  padded_ms)
    ctx.report.table(["variant", "resolved options", "batch", "ms p50", "p95", "speed vs default",
                      "max abs diff / max"],
                     rows)
    ctx.say("\nSpeed and difference are against the row marked default above each; \"resolved\" shows what ran "
            "(a backend that cannot run here falls back to auto, with a warning in the log). Buckets exist so "
            "1-8 persons need 4 shapes (1/2/4/8) instead of 8 for cuDNN autotuning and compiled graphs.")


def phase_compile(ctx: Ctx) -> None:
    """torch.compile with CUDA graphs ("reduce-overhead"): its start-up cost and its per-call gain."""
    from stages.sapiens2.estimators import PoseEstimator
    from stages.sapiens2.fastpath import FastPath

    mode = "default" if ctx.smoke else "reduce-overhead"
    ctx.say(f"\n## torch.compile (mode {mode}), pose {ctx.model('0.4b')}, {ctx.precision}, 4 persons\n")
    model = load_model(ctx.ckpt("pose"), device=ctx.device, dtype=ctx.dtype)
    eager = PoseEstimator(model, input_size=ctx.size)
    compiled = PoseEstimator(model, input_size=ctx.size, fastpath=FastPath(compile=mode))
    crops = torch.randn(4, 3, *ctx.size, device=ctx.device).to(ctx.dtype)
    with torch.inference_mode():
        base = eager.infer(crops, 4).float()
        eager_ms = ctx.ms(lambda: eager.infer(crops, 4))  # first: kept even if compiling is cut short
        ctx.report.results["compile"] = dict(mode=mode, eager_ms=eager_ms)
        ctx.report.save()
        ctx.say(f"compiling (eager p50 {p50(eager_ms):.1f} ms; {ctx.left_s():.0f} s left before the watchdog) ...")
        t0 = time.perf_counter()
        for _ in range(3):  # compile, record the graph, replay
            out = compiled.infer(crops, 4)
        ctx.sync()
        startup = time.perf_counter() - t0
        diff = float((out.float() - base).abs().max() / base.abs().max())
        compiled_ms = ctx.ms(lambda: compiled.infer(crops, 4))
    from torch._dynamo.utils import counters

    # Inductor drops CUDA graphs silently for a graph it cannot capture; it counts each time it does.
    skips = int(counters["inductor"].get("cudagraph_skips", 0))
    ctx.report.results["compile"] = dict(mode=mode, startup_s=startup, eager_ms=eager_ms, compiled_ms=compiled_ms,
                                         max_rel_diff=diff, cudagraph_skips=skips)
    ctx.report.table(["path", "ms p50", "p95", "speed-up", "start-up (compile) s", "max abs diff / max"], [
        ["eager (default)", p50(eager_ms), p95(eager_ms), "-", "-", "-"],
        [f"compiled, {mode}", p50(compiled_ms), p95(compiled_ms), f"{p50(eager_ms) / p50(compiled_ms):.2f}x",
         f"{startup:.1f}", f"{diff:.1e}"],
    ])
    if mode == "reduce-overhead":
        ctx.say(f"\nCUDA graphs: {'used' if skips == 0 else f'SKIPPED {skips} time(s): this row is plain Inductor'}.")
    ctx.say("\nThe start-up cost is paid once per input shape (one shape here; a pipeline warms every pose "
            "bucket at start-up, `--compile` logs the total).")
