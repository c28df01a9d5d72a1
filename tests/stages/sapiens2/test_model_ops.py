"""Kernels per Sapiens2 forward: on a GPU every aten op that is not a view is a kernel launch, and at
batch 1 the launches, not the math, set the speed (1,125 per 0.4B forward on 2026-12-04: 21.6 ms on an
H200 for ~5 ms of math). Counted on the meta device (no memory, no math) with the model as the pipeline
runs it: published 0.4B architecture, bfloat16, 1024x768."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from stages.sapiens2.config import variant
from stages.sapiens2.model import Sapiens2

MAX_KERNELS = 600  # per 0.4B forward (the target; 1,125 before fused norms, RoPE and QKV)


class CountOps(TorchDispatchMode):
    """Aten ops dispatched: all of them, and those that compute: not views, and a ``to`` only when it
    copies (its schema says it may alias, so ``is_view`` alone would hide every dtype cast)."""

    def __init__(self) -> None:
        super().__init__()
        self.all: Counter[str] = Counter()
        self.compute: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = str(func.overloadpacket)
        self.all[name] += 1
        returns_input = isinstance(out, torch.Tensor) and any(out is a for a in args)
        if not returns_input and (name == "aten.to" or not func.is_view):
            self.compute[name] += 1
        return out


def count_forward(task: str, size: str = "0.4b", dtype: torch.dtype = torch.bfloat16) -> CountOps:
    with torch.device("meta"):
        model = Sapiens2(variant(task, size)).eval().set_precision(dtype)
    pixels = torch.empty(1, 3, 1024, 768, device="meta")
    with torch.inference_mode():
        model(pixels)  # the first call makes the RoPE tables (once per input size)
        with CountOps() as counted:
            model(pixels)
    return counted


@pytest.mark.parametrize("task", ["pose", "seg"])
def test_a_forward_launches_at_most_600_kernels(task: str) -> None:
    counted = count_forward(task)
    total = sum(counted.compute.values())
    top = ", ".join(f"{k.removeprefix('aten.')} {v}" for k, v in counted.compute.most_common(8))
    assert total <= MAX_KERNELS, f"{task}: {total} kernels per forward ({top})"
    # per block: one fused norm per norm, one GEMM per projection, no concatenation or dtype round trips
    blocks = variant(task, "0.4b").num_hidden_layers
    assert counted.compute["aten.rms_norm"] == 4 * blocks + 1
    assert counted.compute["aten.linear"] == 4 * blocks
    assert counted.compute["aten.cat"] <= 1 and counted.compute["aten.to"] <= 1  # the input's cast


def test_float16_keeps_its_float32_norms_within_the_budget() -> None:
    """float16 casts around its float32 norms and residual: still under the budget."""
    assert sum(count_forward("pose", dtype=torch.float16).compute.values()) <= MAX_KERNELS
