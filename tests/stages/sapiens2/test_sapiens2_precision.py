"""Precision: the fp16 mode survives a residual stream beyond the fp16 range (a naive half cast
does not), non-finite outputs are caught by every estimator, and dtype defaults/parsing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from stages.sapiens2 import load_model
from stages.sapiens2.estimators import (
    NonFiniteOutputError,
    PoseEstimator,
    estimator_for,
)
from stages.sapiens2.model import LayerScale, RMSNorm, Sapiens2
from stages.sapiens2.tiny import make_tiny, random_init, tiny_config, write_checkpoint
from stages.sapiens2.weights import parse_dtype
from stages.tasks import TASKS

SIZE = (128, 96)
FP16_MAX = torch.finfo(torch.float16).max  # 65504
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def hot_dir(tmp_path_factory):
    """A tiny pose checkpoint whose LayerScale gammas (3e4) push the residual stream past 1e5."""
    model = random_init(Sapiens2(tiny_config("pose", image_size=SIZE)), seed=3)
    with torch.no_grad():
        for block in model.backbone.blocks:
            block.attn.gamma.weight.fill_(3e4)
    return write_checkpoint(model, tmp_path_factory.mktemp("hot"))


@pytest.fixture(scope="module")
def pixels():
    return torch.randn(2, 3, *SIZE, generator=torch.Generator().manual_seed(0))


def _residual_peak(model: Sapiens2, pixels: torch.Tensor) -> tuple[torch.Tensor, float]:
    """(output, largest |value| leaving any transformer block)."""
    peaks: list[float] = []
    hooks = [b.register_forward_hook(lambda m, i, o: peaks.append(o.float().abs().max().item()))
             for b in model.backbone.blocks]
    try:
        with torch.no_grad():
            out, _ = model(pixels)
    finally:
        for h in hooks:
            h.remove()
    return out, max(peaks)


def test_naive_fp16_cast_overflows(hot_dir, pixels):
    """The hazard is real: the float32 residual stream exceeds the fp16 range, and a plain .half() breaks."""
    full = load_model(hot_dir, device="cpu", dtype="float32")
    expected, peak = _residual_peak(full, pixels)
    assert torch.isfinite(expected).all()
    assert peak > 1e5 > FP16_MAX
    naive = load_model(hot_dir, device="cpu", dtype="float32").half()
    assert naive.backbone.residual_dtype is None  # the residual stream follows the weights: fp16
    with torch.no_grad():
        out, _ = naive(pixels)
    bad = not torch.isfinite(out).all() or (out.float() - expected).norm() / expected.norm() > 0.1
    assert bad, "naive fp16 unexpectedly fine: the test model does not exercise the overflow"


def test_fp16_mode_is_finite_and_close_to_float32(hot_dir, pixels):
    full = load_model(hot_dir, device="cpu", dtype="float32")
    half = load_model(hot_dir, device="cpu", dtype="float16")
    expected, _ = _residual_peak(full, pixels)
    out, peak = _residual_peak(half, pixels)
    assert peak > FP16_MAX  # the residual stream really held values fp16 cannot
    assert out.dtype == torch.float16
    assert torch.isfinite(out).all()
    rel = ((out.float() - expected).norm() / expected.norm()).item()
    assert rel < 1e-2, rel


def test_fp16_mode_parameter_dtypes(hot_dir):
    model = load_model(hot_dir, device="cpu", dtype="float16")
    assert model.dtype == torch.float16
    assert model.backbone.residual_dtype == torch.float32
    norms = [m for m in model.modules() if isinstance(m, RMSNorm)]
    qk = [n for b in model.backbone.blocks for n in (b.attn.q_norm, b.attn.k_norm)]
    residual = [n for n in norms if all(n is not q for q in qk)]
    scales = [m for m in model.modules() if isinstance(m, LayerScale)]
    assert len(residual) == 1 + 2 * 4 and len(qk) == 2 * 4  # final norm and ln1/ln2; q/k norms of 4 blocks
    assert all(m.weight.dtype == torch.float32 for m in residual + scales)  # the residual stream's
    assert all(m.weight.dtype == torch.float16 for m in qk)  # on float16 GEMM outputs, float32 inside
    linears = [m for m in model.modules() if isinstance(m, nn.Linear | nn.Conv2d | nn.ConvTranspose2d)]
    assert linears and all(m.weight.dtype == torch.float16 for m in linears)
    assert all(m.bias is None or m.bias.dtype == torch.float16 for m in linears)
    assert model.backbone.cls_token.dtype == torch.float16


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_other_dtypes_cast_everything(hot_dir, dtype):
    model = load_model(hot_dir, device="cpu", dtype=dtype)
    want = parse_dtype(dtype, CPU)
    assert model.backbone.residual_dtype is None
    assert all(p.dtype == want for p in model.parameters())


# --- non-finite outputs -------------------------------------------------------------------------------------------

def _image(h=120, w=160):
    return np.random.default_rng(0).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _predict(est, task):
    if task == "pose":
        return est.predict(_image(), np.array([[10, 10, 100, 110], [60, 5, 150, 115]], np.float32))
    return est.predict(_image())


@pytest.mark.parametrize("task", list(TASKS))
def test_nan_weights_raise_non_finite(tmp_path, task):
    model = load_model(make_tiny(tmp_path, task, image_size=SIZE), device="cpu")
    est = estimator_for(task)(model)
    _predict(est, task)  # healthy weights: fine
    with torch.no_grad():
        model.backbone.blocks[1].ffn.w3.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteOutputError) as info:
        _predict(est, task)
    assert str(info.value).startswith(f"{task}:"), str(info.value)


@pytest.mark.parametrize("bad", ["negative", "nan"])
def test_pose_decode_survives_keypoints_without_a_positive_peak(bad):
    """A keypoint whose heatmap max is <= 0 (an absent joint) or NaN is located at -1 by the argmax;
    the sub-pixel refinement must not crash on it nor disturb the other keypoints."""
    from stages.sapiens2.postprocess import decode_pose

    heatmaps = torch.rand(2, 3, 32, 24, generator=torch.Generator().manual_seed(0)) + 0.01
    heatmaps[0, 1] = -heatmaps[0, 1] if bad == "negative" else float("nan")
    boxes = torch.tensor([[0.0, 0.0, 96.0, 128.0], [10.0, 20.0, 70.0, 100.0]])
    xy, scores = decode_pose(heatmaps, boxes, SIZE)
    assert xy.shape == (2, 3, 2) and scores.shape == (2, 3)
    good_xy, good_scores = decode_pose(heatmaps[1:], boxes[1:], SIZE)
    assert torch.allclose(xy[1:], good_xy) and torch.equal(scores[1:], good_scores)
    if bad == "negative":
        assert scores[0, 1] <= 0


def test_fp16_overflow_is_caught_by_the_estimator(hot_dir):
    """The naive fp16 model's Inf/NaN never leaves PoseEstimator as keypoints."""
    naive = load_model(hot_dir, device="cpu", dtype="float32").half()
    with pytest.raises(NonFiniteOutputError, match="^pose:"):
        PoseEstimator(naive).predict(_image(), np.array([[10, 10, 100, 110]], np.float32))
    safe = PoseEstimator(hot_dir, device="cpu", dtype="float16")
    kps = safe.predict(_image(), np.array([[10, 10, 100, 110]], np.float32))
    assert np.isfinite(kps.xy).all() and np.isfinite(kps.scores).all()


# --- dtype defaults and parsing -----------------------------------------------------------------------------------


def test_cpu_default_is_float32(hot_dir):
    model = load_model(hot_dir, device="cpu")
    assert model.dtype == torch.float32 and model.device.type == "cpu"
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert parse_dtype(None, CPU) == parse_dtype("auto", CPU) == torch.float32
    assert parse_dtype(None, torch.device("cuda")) == torch.bfloat16  # no GPU needed: only the device type


@pytest.mark.parametrize("name, want", [("bf16", torch.bfloat16), ("bfloat16", torch.bfloat16),
                                        ("fp16", torch.float16), ("float16", torch.float16),
                                        ("half", torch.float16), ("float32", torch.float32),
                                        ("fp32", torch.float32), (torch.float16, torch.float16)])
def test_parse_dtype(name, want):
    assert parse_dtype(name, CPU) == want


@pytest.mark.parametrize("name", ["int8", "float64", "FP16", ""])
def test_parse_dtype_unknown(name):
    with pytest.raises(ValueError, match="unknown dtype"):
        parse_dtype(name, CPU)


def test_load_model_rejects_unknown_dtype_before_reading(tmp_path):
    with pytest.raises(ValueError, match="unknown dtype"):
        load_model(tmp_path / "does_not_matter", device="cpu", dtype="float8")
