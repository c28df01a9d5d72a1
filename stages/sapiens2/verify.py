"""Fast paths checked against the eager path on the user's own device.

Every fast path of an estimator (float16, a chosen attention kernel, channels_last, the compiled
module, CUDA-graph replay) runs once on the same input as the plain eager path and is compared
with it. An exception, a non-finite output where eager is finite, or a difference beyond the
dtype's tolerance switches that fast path off for the run, with one warning naming it and the
difference; the run goes on without it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

log = logging.getLogger(__name__)

Outputs = tuple[Tensor, Tensor | None]

# Relative L2 difference of the raw outputs allowed between a fast path and eager, by dtype. Two
# correct bfloat16 runs of the 0.4B model differ by a few 1e-2 (each is ~5e-2 from float32 on an
# H200, 2026-12-04); a wrong kernel, cast or graph is off by ~1.
TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 0.15, torch.float16: 0.02}


def tolerance(dtype: torch.dtype) -> float:
    return TOLERANCE.get(dtype, TOLERANCE[torch.bfloat16])


def difference(got: Outputs, want: Outputs) -> float:
    """Relative L2 difference of two forward outputs (maps and, where there is one, the scale);
    inf when the shapes differ or ``got`` is not finite where ``want`` is."""
    worst = 0.0
    for a, b in zip(got, want):
        if a is None or b is None:
            if (a is None) != (b is None):
                return math.inf
            continue
        if a.shape != b.shape:
            return math.inf
        a, b = a.detach().double(), b.detach().double()
        if not bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all()):
            return math.inf
        norm = float(torch.linalg.vector_norm(b))
        diff = float(torch.linalg.vector_norm(a - b))
        worst = max(worst, diff / norm if norm > 0 else diff)
    return worst if math.isfinite(worst) else math.inf


def disagreement(run: Callable[[], Outputs], reference: Outputs, dtype: torch.dtype) -> str | None:
    """Why the fast path ``run`` cannot be trusted against ``reference``, or None when it agrees."""
    try:
        got = run()
    except Exception as exc:  # any failure of a fast path turns it off; the eager path goes on
        return f"it raised {raised(exc)}"
    return mismatch(got, reference, dtype)


def raised(exc: BaseException) -> str:
    """``TypeName: first line of the message`` (at most 160 characters of it), for one-line reports."""
    first = (str(exc).strip().splitlines() or [""])[0][:160]
    return f"{type(exc).__name__}{': ' + first if first else ''}"


def mismatch(got: Outputs, reference: Outputs, dtype: torch.dtype) -> str | None:
    """Why ``got`` differs from ``reference`` beyond the dtype's tolerance, or None."""
    diff = difference(got, reference)
    limit = tolerance(dtype)
    if diff <= limit:
        return None
    if math.isinf(diff):
        return "its output is not finite or not of the eager output's shape"
    return f"it differs from the eager path by {diff:.2g} (relative L2; tolerance {limit:g} in {str(dtype)[6:]})"


def switched_off(task: str, name: str, reason: str) -> None:
    """The one warning line of a fast path turned off."""
    log.warning("%s: fast path %s switched off for this run: %s", task, name, reason)


def check_image(hw: tuple[int, int]) -> np.ndarray:
    """(H, W, 3) uint8: a fixed picture with structure at every scale (gradients, a disc, noise),
    the input the fast paths and the eager path are compared on."""
    h, w = hw
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    disc = ((yy - h / 2) ** 2 + (xx - w / 2) ** 2 < (min(h, w) / 3) ** 2) * 80.0
    noise = np.random.default_rng(20261205).normal(0.0, 12.0, (h, w, 3))
    base = np.stack([xx * 255 / max(w - 1, 1), yy * 255 / max(h - 1, 1), disc + 60.0], -1)
    return np.clip(base + noise, 0, 255).astype(np.uint8)


__all__ = ["TOLERANCE", "check_image", "difference", "disagreement", "mismatch", "raised", "switched_off", "tolerance"]
