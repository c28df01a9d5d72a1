"""Parity with the reference implementation (transformers 5.23 Sapiens2*), float32 on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import Sapiens2ImageProcessor

from stages.sapiens2 import load_model
from stages.sapiens2.estimators import MattingEstimator, NormalEstimator, PointmapEstimator, PoseEstimator, Segmenter
from stages.tasks import TASKS
from tests.refutil import reference_model

ARCHS = {
    "default": {},
    "more_heads": dict(hidden_size=96, num_attention_heads=6, num_key_value_attention_heads=3,
                       num_hidden_layers=4, num_first_full_attention_layers=2, num_last_full_attention_layers=1),
    "no_registers": dict(num_register_tokens=0),
    "explicit_kv": dict(num_hidden_layers=3, num_key_value_heads_per_layer=[4, 1, 2], num_register_tokens=4),
    "no_key_bias": dict(key_bias=False, image_size=[96, 128]),
}


def _ref_output(task, out):
    return {"pose": out.heatmaps if task == "pose" else None, "seg": getattr(out, "logits", None),
            "normal": getattr(out, "normals", None), "pointmap": getattr(out, "pointmaps", None),
            "matting": None if task != "matting" else torch.cat([out.foregrounds, out.alphas], 1)}[task]


@pytest.mark.parametrize("task", list(TASKS))
@pytest.mark.parametrize("arch", list(ARCHS))
def test_forward_matches_reference(tmp_path, task, arch):
    ref = reference_model(task, **ARCHS[arch])
    ref.save_pretrained(tmp_path)
    h, w = ref.config.image_size
    x = torch.randn(2, 3, h, w)
    with torch.no_grad():
        expected = _ref_output(task, ref(x))
        ours, scale = load_model(tmp_path, device="cpu", dtype="float32")(x)
    # fused q/k/v, RMSNorm and RoPE reorder float32 sums only: within 1e-5 of the output's scale
    assert (ours - expected).abs().max().item() <= 1e-5 * expected.abs().max().item(), (task, arch)
    if TASKS[task].scale_head:
        assert torch.allclose(scale, ref(x).scales, rtol=0, atol=1e-5 * ref(x).scales.abs().max().item())


@pytest.mark.parametrize("size", [(64, 48), (128, 96), (96, 160)])
def test_other_input_sizes_match(tmp_path, size):
    ref = reference_model("seg")
    ref.save_pretrained(tmp_path)
    x = torch.randn(1, 3, *size)
    with torch.no_grad():
        expected = ref(x).logits
        ours, _ = load_model(tmp_path, device="cpu")(x)
    assert (ours - expected).abs().max() <= 1e-5 * expected.abs().max()  # as at the trained size


def _photo(h=240, w=320, seed=0):
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([(xx * 255 / w), (yy * 255 / h), ((xx + yy) % 64) * 4], -1)
    return np.clip(base + rng.normal(0, 20, (h, w, 3)), 0, 255).astype(np.uint8)


def _clear_peaks(heatmaps: torch.Tensor, margin: float = 1e-3) -> np.ndarray:
    """(N, K) mask of keypoints whose heatmap maximum beats every value outside its 5x5
    neighbourhood by `margin` (relative). Random weights give flat, multi-peaked heatmaps where
    float rounding (batch size, fused GEMMs) legitimately moves the argmax to another peak;
    trained models give one clear peak, and only those keypoints are compared."""
    n, k, h, w = heatmaps.shape
    flat = heatmaps.reshape(n, k, -1)
    peak, idx = flat.max(-1)
    yy, xx = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    near = ((yy.reshape(-1) - (idx // w)[..., None]).abs() <= 2) & ((xx.reshape(-1) - (idx % w)[..., None]).abs() <= 2)
    second = flat.masked_fill(near, -float("inf")).max(-1).values
    return ((peak - second) > margin * peak.abs()).numpy()


def _stable_refinement(proc, out, flipped, xywh, expected, rel: float = 1e-6) -> np.ndarray:
    """(N, K) mask of keypoints whose reference decoding stays within 0.01 px when its heatmaps move by a
    relative ``rel`` (float32 rounding: our fused kernels sum in another order). The DARK Newton step of a
    flat or saddle-shaped heatmap is ill-conditioned (steps of hundreds of pixels) and amplifies any rounding."""
    stable = np.ones((len(expected), len(expected[0]["keypoints"])), bool)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        def nudged(o):
            if o is None:
                return None
            noise = 1 + rel * torch.randn(o.heatmaps.shape, generator=gen)
            return type(o)(heatmaps=o.heatmaps * noise)
        again = proc.post_process_pose_estimation(nudged(out), boxes=xywh, outputs_flipped=nudged(flipped))[0]
        for i, (a, b) in enumerate(zip(again, expected)):
            stable[i] &= (np.abs(a["keypoints"].numpy() - b["keypoints"].numpy()).max(-1) < 0.01)
    return stable


@pytest.mark.parametrize("flip", [False, True])
def test_pose_pipeline_matches_reference(tmp_path, flip):
    ref = reference_model("pose", image_size=[128, 96])
    ref.save_pretrained(tmp_path)
    image = _photo()
    # shrinking crops (bilinear), an enlarging one (bicubic) and one that leaves the frame
    boxes = np.array([[10, 5, 300, 230], [100, 60, 130, 110], [250, 150, 340, 260], [40, 20, 200, 220]],
                     np.float32)
    xywh = [[[float(x1), float(y1), float(x2 - x1), float(y2 - y1)] for x1, y1, x2, y2 in boxes]]
    proc = Sapiens2ImageProcessor(size={"height": 128, "width": 96})
    inputs = proc(image, boxes=xywh, return_tensors="pt")
    # max_refine_offset=None: the reference's refinement exactly, wild Newton steps included
    est = PoseEstimator(tmp_path, device="cpu", flip_test=flip, max_refine_offset=None)
    with torch.no_grad():
        out = ref(inputs["pixel_values"])
        flipped = ref(inputs["pixel_values"].flip(-1), flip_pairs=est.flip_pairs) if flip else None
    expected = proc.post_process_pose_estimation(out, boxes=xywh, outputs_flipped=flipped)[0]
    heatmaps = out.heatmaps if flipped is None else (out.heatmaps + flipped.heatmaps) / 2
    clear = _clear_peaks(heatmaps) & _stable_refinement(proc, out, flipped, xywh, expected)
    assert clear.mean() > 0.8, "test model too flat to compare"
    got = est.predict(image, boxes)
    assert got.xy.shape == (4, 308, 2) and got.scores.shape == (4, 308)
    for i, person in enumerate(expected):
        np.testing.assert_allclose(got.scores[i], person["scores"].numpy(), rtol=1e-4, atol=1e-5)
        err = np.abs(got.xy[i] - person["keypoints"].numpy()).max(-1)
        assert err[clear[i]].max() < 0.05, f"person {i}: {err[clear[i]].max():.4f} px"


def test_seg_and_matting_postprocess_match_reference(tmp_path):
    image = _photo(180, 250)
    for task, cls in (("seg", Segmenter), ("matting", MattingEstimator)):
        ref = reference_model(task)
        ref.save_pretrained(tmp_path / task)
        proc = Sapiens2ImageProcessor(size={"height": 128, "width": 96})
        with torch.no_grad():
            out = ref(proc(image, return_tensors="pt")["pixel_values"])
        est = cls(tmp_path / task, device="cpu")
        if task == "seg":
            expected = proc.post_process_semantic_segmentation(out, target_sizes=[(180, 250)])[0].numpy()
            got = est.predict(image)
            assert got.shape == (180, 250) and got.dtype == np.uint8
            assert (got == expected).mean() > 0.999
        else:
            bg = _photo(180, 250, seed=1)
            expected = proc.post_process_image_matting(out, target_sizes=[(180, 250)], backgrounds=bg)[0]
            matte = est.predict(image)
            np.testing.assert_allclose(matte.alpha, expected["alpha"][0].numpy(), atol=1e-4)
            np.testing.assert_allclose(matte.foreground, expected["foreground"].permute(1, 2, 0).numpy(), atol=1e-4)
            comp = MattingEstimator.composite(matte, bg)
            assert np.abs(comp.astype(int) - expected["composite"].permute(1, 2, 0).numpy().astype(int)).max() <= 1


@pytest.mark.parametrize("task", ["normal", "pointmap"])
def test_dense_postprocess_matches_reference(tmp_path, task):
    image = _photo(150, 260)
    ref = reference_model(task)
    ref.save_pretrained(tmp_path)
    proc = Sapiens2ImageProcessor(size={"height": 128, "width": 96}, do_pad=True)
    with torch.no_grad():
        out = ref(proc(image, return_tensors="pt")["pixel_values"])
    if task == "normal":
        expected = proc.post_process_normal_estimation(out, source_sizes=[(150, 260)])[0]["normals"]
        got = NormalEstimator(tmp_path, device="cpu").predict(image)
    else:
        expected = proc.post_process_pointmap_estimation(out, source_sizes=[(150, 260)])[0]["pointmap"]
        got = PointmapEstimator(tmp_path, device="cpu").predict(image)
    expected = expected.permute(1, 2, 0).numpy()
    assert got.shape == (150, 260, 3)
    assert np.abs(got - expected).max() <= 1e-4 * max(1.0, np.abs(expected).max())


def test_bfloat16_close_to_float32(tmp_path):
    ref = reference_model("pose")
    ref.save_pretrained(tmp_path)
    x = torch.randn(2, 3, 128, 96)
    with torch.no_grad():
        full, _ = load_model(tmp_path, device="cpu", dtype="float32")(x)
        half, _ = load_model(tmp_path, device="cpu", dtype="bfloat16")(x)
    assert half.dtype == torch.bfloat16
    rel = (half.float() - full).norm() / full.norm()
    assert rel < 0.05


def test_default_refinement_drops_wild_newton_steps(tmp_path):
    """By default a DARK step longer than one heatmap pixel (flat/saddle neighbourhood) is dropped,
    so keypoints stay next to their heatmap peak; the exact-reference mode keeps them."""
    ref = reference_model("pose", image_size=[128, 96])
    ref.save_pretrained(tmp_path)
    image = _photo()
    boxes = np.array([[10, 5, 300, 230], [40, 20, 200, 220]], np.float32)
    safe = PoseEstimator(tmp_path, device="cpu").predict(image, boxes)
    exact = PoseEstimator(tmp_path, device="cpu", max_refine_offset=None).predict(image, boxes)
    est = PoseEstimator(tmp_path, device="cpu")
    with torch.no_grad():
        image_t, boxes_t = est.image_tensor(image), torch.as_tensor(boxes)
        heatmaps = est.infer(est.preprocess(image_t, boxes_t), 2)
    from stages.sapiens2.postprocess import argmax_keypoints, crop_params

    peak, _ = argmax_keypoints(heatmaps)
    center, size = crop_params(boxes_t, (128, 96))
    hm = torch.tensor([heatmaps.shape[-1] - 1, heatmaps.shape[-2] - 1], dtype=torch.float32)
    peak_px = (peak / hm * size[:, None] + center[:, None] - 0.5 * size[:, None]).numpy()
    cell = (size / hm).numpy()[:, None, :]  # image pixels per heatmap pixel, (N, 1, 2)
    assert (np.abs(safe.xy - peak_px) <= 1.001 * cell).all()
    assert (np.abs(exact.xy - peak_px) > 2 * cell).any()  # the hazard is real on random weights


def test_pose_decoding_matches_reference_on_gaussian_peaks():
    """DARK-UDP decoding alone, on well-shaped heatmaps: Gaussian peaks at sub-pixel positions,
    some next to the border (where the zero-border blur matters). Exact agreement is expected here,
    unlike on random-weight heatmaps."""
    from types import SimpleNamespace

    from stages.sapiens2.postprocess import decode_pose

    rng = np.random.default_rng(3)
    n, k, h, w = 3, 308, 64, 48
    cx = rng.uniform(-0.4, w - 0.6, (n, k))
    cy = rng.uniform(-0.4, h - 0.6, (n, k))
    cx[:, :20], cy[:, :20] = rng.uniform(-0.4, 1.5, (n, 20)), rng.uniform(h - 2.5, h - 0.6, (n, 20))
    sigma = rng.uniform(1.5, 3.0, (n, k))
    yy, xx = np.mgrid[0:h, 0:w]
    maps = np.exp(-((xx - cx[..., None, None]) ** 2 + (yy - cy[..., None, None]) ** 2)
                  / (2 * sigma[..., None, None] ** 2)) * rng.uniform(0.3, 1.0, (n, k, 1, 1))
    heatmaps = torch.tensor(maps, dtype=torch.float32)
    boxes = np.array([[10, 5, 300, 230], [100, 60, 130, 110], [250, 150, 340, 260]], np.float32)
    xywh = [[[float(x1), float(y1), float(x2 - x1), float(y2 - y1)] for x1, y1, x2, y2 in boxes]]
    proc = Sapiens2ImageProcessor(size={"height": 4 * h, "width": 4 * w})
    expected = proc.post_process_pose_estimation(SimpleNamespace(heatmaps=heatmaps), boxes=xywh)[0]
    xy, scores = decode_pose(heatmaps, torch.as_tensor(boxes), (4 * h, 4 * w), max_offset=None)
    for i, person in enumerate(expected):
        np.testing.assert_allclose(scores[i].numpy(), person["scores"].numpy(), rtol=1e-6)
        # image pixels per heatmap pixel is at most ~6 here; 1e-3 heatmap px is far below any visible error
        np.testing.assert_allclose(xy[i].numpy(), person["keypoints"].numpy(), atol=5e-3)


@pytest.mark.parametrize("kernel", [3, 5, 11])
def test_heatmap_blur_is_the_references_bit_for_bit(kernel):
    """The DARK blur is one depthwise convolution over zero-padded maps (faster than torchvision's
    blur of a twice-padded map); its sums must be exactly the reference's."""
    from transformers.models.sapiens2.image_processing_sapiens2 import gaussian_blur_preserve_max

    from stages.sapiens2.postprocess import blur_preserve_max

    gen = torch.Generator().manual_seed(kernel)
    for b, k, h, w in ((1, 308, 64, 48), (3, 17, 33, 21)):
        maps = torch.rand(b, k, h, w, generator=gen) ** 8 - 0.01  # peaky, some negative values
        got = blur_preserve_max(maps, kernel)
        expected = gaussian_blur_preserve_max(maps.reshape(b * k, h, w), kernel).reshape(b, k, h, w)
        assert torch.equal(got, expected)


@pytest.mark.parametrize("height, width", [(1, 1), (1, 500), (300, 1)])
def test_a_frame_one_pixel_high_or_wide_crops_to_its_pixels(height, width):
    """The crop grid divides by (size - 1): a frame one pixel across gave NaN crops, and the run
    blamed the checkpoint. Every sample of a one-pixel axis is that pixel row or column."""
    from stages.sapiens2.preprocess import MEAN, STD, crop_persons

    image = torch.full((3, height, width), 200, dtype=torch.uint8)
    boxes = torch.tensor([[0.0, 0.0, float(width), float(height)]])
    pixel = (200 / 255 - MEAN[0]) / STD[0]  # the frame's colour, normalised (channel 0)
    for sampling in ("select", "per-box"):
        crops = crop_persons(image, boxes, (64, 48), sampling=sampling)
        assert crops.shape == (1, 3, 64, 48) and torch.isfinite(crops).all(), sampling
        assert (crops[0, 0] - pixel).abs().min() < 1e-4, sampling  # the frame itself is in the crop


@pytest.mark.parametrize("native", [True, False])  # torch's uint8 CPU kernel; float32 and back (GPUs, old CPUs)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "view"])
def test_resize_is_torchvisions_bit_for_bit(native: bool, layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Our bilinear antialiased resize (written out: importing torchvision costs 1.3 s) gives torchvision's
    pixels, down and up, odd sizes, each memory layout a frame reaches it in."""
    from torchvision.transforms.v2 import functional as tvF
    from torchvision.transforms.v2.functional import _geometry

    from stages.sapiens2 import preprocess

    monkeypatch.setattr(preprocess, "_native_uint8_bilinear", lambda device: native)
    monkeypatch.setattr(_geometry, "_do_native_uint8_resize_on_cpu", lambda interpolation: native)
    rng = np.random.default_rng(3)
    hwc = torch.from_numpy(rng.integers(0, 256, (97, 131, 3), dtype=np.uint8))
    image = {"contiguous": hwc.permute(2, 0, 1).contiguous(), "channels_last": hwc.permute(2, 0, 1),
             "view": hwc.permute(2, 0, 1)[:, 5:90, 7:120]}[layout]
    for size in ((48, 64), (33, 17), (256, 192), tuple(image.shape[1:])):
        expected = tvF.resize(image, list(size), interpolation=tvF.InterpolationMode.BILINEAR, antialias=True)
        got = preprocess.resize_bilinear(image, size)
        assert got.dtype == torch.uint8 and got.shape == expected.shape
        assert torch.equal(got, expected), (layout, size, native)


@pytest.mark.parametrize("kernel", [3, 5, 11, 17])
def test_blur_weights_are_torchvisions(kernel: int) -> None:
    """The DARK blur's weights, made without torchvision, are its blur of a unit impulse, exactly."""
    from torchvision.transforms.v2 import functional as tvF

    from stages.sapiens2.postprocess import _blur_kernel

    sigma = 0.3 * ((kernel - 1) * 0.5 - 1) + 0.8
    impulse = torch.zeros(1, 2 * kernel - 1, 2 * kernel - 1)
    impulse[0, kernel - 1, kernel - 1] = 1.0
    half = kernel // 2
    expected = tvF.gaussian_blur(impulse, [kernel, kernel], [sigma, sigma])[0, half:half + kernel, half:half + kernel]
    assert torch.equal(_blur_kernel(kernel, torch.device("cpu")), expected)
