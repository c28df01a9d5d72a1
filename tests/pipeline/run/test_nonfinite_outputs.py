"""Non-finite outputs are caught where the model makes them, before anything clamps them.

+Inf, -Inf and NaN are put into the raw output of each head's float16 model (the heatmaps of pose,
the maps of the dense heads), and ±Inf into pose's decoded keypoints before the engine clamps them
to the image: none of it is published, the stage falls back to bfloat16 (said once) and the step's
results are those of a bfloat16 run from the start.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.run.build import Stages
from pipeline.run.engine import FrameEngine
from stages.sapiens2 import load_model
from stages.sapiens2.estimators import estimator_for
from stages.sapiens2.tiny import make_tiny
from stages.tasks import TASKS
from stages.types import Detections, Frame

pytestmark = pytest.mark.timeout(300)
BAD = {"+inf": float("inf"), "-inf": float("-inf"), "nan": float("nan")}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    # the pointmap head's scale branch fixes its own input size
    return {task: make_tiny(tmp_path_factory.mktemp(task), task, **({} if task == "pointmap" else
                                                                     {"image_size": (64, 48)}))
            for task in TASKS}


class TwoPeople:
    random_weights = False

    def detect_batch(self, images: list[np.ndarray]) -> list[Detections]:
        boxes = np.array([[10, 10, 60, 90], [50, 20, 110, 95]], np.float32)
        return [Detections(boxes, np.array([0.9, 0.8], np.float32), np.arange(2)) for _ in images]


def _frame() -> Frame:
    image = np.random.default_rng(0).integers(0, 256, (100, 120, 3), dtype=np.uint8)
    return Frame(0, image, 0, None, time.time_ns(), "cam")


def _estimator(task: str, folder: Path, dtype: str):
    model = load_model(folder, device="cpu", dtype=dtype)
    kwargs = {"input_size": tuple(model.cfg.image_size)} if task == "pointmap" else {}
    return estimator_for(task)(model, **kwargs)


def _outputs(result) -> dict[str, np.ndarray]:
    out = {"seg": result.seg, "normal": result.normals, "pointmap": result.pointmap}
    if result.matte is not None:
        out.update(alpha=result.matte.alpha, fg=result.matte.foreground)
    if result.keypoints is not None:
        out.update(xy=result.keypoints.xy, scores=result.keypoints.scores)
    return {k: v for k, v in out.items() if v is not None}


def _run_poisoned(task: str, folder: Path, poison, caplog: pytest.LogCaptureFixture) -> dict[str, np.ndarray]:
    """One frame through an engine whose float16 stage is poisoned by ``poison(est)``; the fall-back
    must have happened once; returns what was published."""
    est = _estimator(task, folder, "float16")
    poison(est)
    engine = FrameEngine(Stages(torch.device("cpu"), TwoPeople(), {task: est}), kpt_threshold=0.0)
    with caplog.at_level(logging.WARNING, "pipeline.run.engine"):
        result = engine.finish(engine.submit(_frame()), False)
    assert est.model.dtype == torch.bfloat16, "the float16 stage did not fall back to bfloat16"
    assert len([r for r in caplog.records if "float16 overflowed" in r.getMessage()]) == 1
    return _outputs(result)


def _clean(task: str, folder: Path) -> dict[str, np.ndarray]:
    """What a run in bfloat16 from the start publishes (cast from float16 as the fall-back casts)."""
    est = _estimator(task, folder, "float16")
    est.set_dtype(torch.bfloat16)
    engine = FrameEngine(Stages(torch.device("cpu"), TwoPeople(), {task: est}), kpt_threshold=0.0)
    return _outputs(engine.finish(engine.submit(_frame()), False))


def _assert_same(published: dict[str, np.ndarray], clean: dict[str, np.ndarray]) -> None:
    assert published.keys() == clean.keys()
    for name, array in published.items():
        assert np.isfinite(array).all(), name
        np.testing.assert_array_equal(array, clean[name], err_msg=name)


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("task", TASKS)
def test_a_non_finite_raw_output_is_not_published_and_float16_falls_back(
        task: str, bad: str, checkpoints: dict[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    """The first value of the raw output (pose: the top-left heatmap pixel of the first person's
    first keypoint, which a -Inf cannot make the peak) is poisoned while the model runs in float16."""

    def poison(est) -> None:
        real = est.forward

        def forward(pixels: torch.Tensor):
            maps, scale = real(pixels)
            if est.model.dtype == torch.float16:
                maps = maps.clone()
                maps.view(-1)[0] = BAD[bad]  # (B, C, h, w): [0, 0, 0, 0]
            return maps, scale

        est.forward = forward

    _assert_same(_run_poisoned(task, checkpoints[task], poison, caplog), _clean(task, checkpoints[task]))


@pytest.mark.parametrize("bad", ["+inf", "-inf"])
def test_an_infinite_keypoint_is_caught_before_it_is_clamped_to_the_image(
        bad: str, checkpoints: dict[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    """The engine clamps keypoints to the image: an Inf checked after that is the image's edge."""

    def poison(est) -> None:
        real = est.postprocess

        def postprocess(heatmaps: torch.Tensor, boxes: torch.Tensor):
            xy, scores = real(heatmaps, boxes)
            if est.model.dtype == torch.float16:
                xy = xy.clone()
                xy[0, 0] = BAD[bad]  # (N, K, 2): the first person's first keypoint
            return xy, scores

        est.postprocess = postprocess

    _assert_same(_run_poisoned("pose", checkpoints["pose"], poison, caplog), _clean("pose", checkpoints["pose"]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_finite_check_is_exact_at_the_ends_of_each_dtype(dtype: torch.dtype) -> None:
    """all_finite sums in float64 (one pass, no bool tensor of the input's size): the largest finite
    values of a dtype do not overflow it, and one Inf, -Inf or NaN (or Inf and -Inf together) is seen."""
    from pipeline.run.streams import all_finite

    big = torch.full((1000,), torch.finfo(dtype).max, dtype=dtype)
    assert bool(all_finite([big, -big]))
    for bad in [*BAD.values(), None]:
        poisoned = big.clone()
        if bad is None:
            poisoned[0], poisoned[1] = float("inf"), float("-inf")
        else:
            poisoned[7] = bad
        assert not bool(all_finite([big, poisoned])), bad
