"""The per-frame device path must not build tensors from host data once it is warm.

On CUDA, ``torch.tensor(..., device="cuda")`` or ``torch.as_tensor(numpy, device="cuda")`` is a
blocking copy from pageable memory: the host waits for the stream, so the engine cannot queue the
next frame while this one computes and the stages stop overlapping. Constants are made once
(``device_constant``) and host arrays go through ``upload`` (pinned, non-blocking). This machine
has no GPU, so the test watches for the pattern itself on the CPU, through the code the GPU runs
(pose crops sampled the "select" way, as on CUDA, as well as the CPU's per-box way);
bench/device_bench.py counts the real synchronisations on a GPU, the pinned copies included.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from pipeline.run.build import Stages
from pipeline.run.engine import FrameEngine
from stages.keypoints3d import Lift
from stages.sapiens2 import load_model
from stages.sapiens2.estimators import estimator_for
from stages.sapiens2.tiny import make_tiny
from stages.types import Detections, Frame


class TwoPeople:
    random_weights = False

    def detect(self, image: np.ndarray) -> Detections:
        boxes = np.array([[10, 10, 60, 90], [50, 20, 110, 95]], np.float32)
        return Detections(boxes, np.ones(2, np.float32), np.arange(2))

    def detect_batch(self, images: list[np.ndarray]) -> list[Detections]:
        return [self.detect(image) for image in images]


@pytest.fixture(scope="module", params=["select", "per-box"])
def engine(tmp_path_factory, request):
    estimators = {}
    for task in ("pose", "seg", "matting", "normal", "pointmap"):
        arch = {} if task == "pointmap" else {"image_size": (64, 48)}  # its scale branch needs its own size
        model = load_model(make_tiny(tmp_path_factory.mktemp(task), task, **arch), device="cpu")
        kwargs = {"crop_sampling": request.param} if task == "pose" else {}
        if task == "pointmap":
            kwargs["input_size"] = tuple(model.cfg.image_size)  # fixed by the scale branch
        estimators[task] = estimator_for(task)(model, **kwargs)
    # detect_every=2: the second frame takes the boxes carried on the device from the first one's
    # keypoints; pointmap_every=2: the second frame samples the first one's pointmap in 3D
    return FrameEngine(Stages(torch.device("cpu"), TwoPeople(), estimators), detect_every=2,
                       keypoints3d=Lift(), pointmap_every=2)


def _frame(i: int) -> Frame:
    image = np.random.default_rng(i).integers(0, 256, (100, 120, 3), dtype=np.uint8)
    return Frame(i, image, None, None, time.time_ns())


def test_warm_engine_makes_no_tensors_from_host_data(engine, monkeypatch):
    engine.finish(engine.submit(_frame(0)), False)  # first frame: constants are made here, once
    calls: list[str] = []
    real_tensor, real_as_tensor, real_new_tensor = torch.tensor, torch.as_tensor, torch.Tensor.new_tensor

    def watch(name, real):
        def wrapper(*args, **kwargs):
            if name != "as_tensor" or "device" in kwargs:  # as_tensor without a device is a host view
                calls.append(name)
            return real(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(torch, "tensor", watch("tensor", real_tensor))
    monkeypatch.setattr(torch, "as_tensor", watch("as_tensor", real_as_tensor))
    monkeypatch.setattr(torch.Tensor, "new_tensor", watch("new_tensor", real_new_tensor))
    pendings = [engine.submit(_frame(1)), engine.submit(_frame(2))]  # one detected, one carried
    assert calls == [], f"per-frame path built tensors from host data: {calls}"
    assert sorted(p.frames[0].carried for p in pendings) == [False, True]  # the carried path ran too
    result = engine.finish(pendings[0], False)
    engine.finish(pendings[1], False)
    assert result.keypoints.xy.shape == (2, 308, 2) and result.seg.shape == (100, 120)
    assert result.matte is not None and result.normals.shape == (100, 120, 3)
    assert result.keypoints3d.xyz.shape == (2, 308, 3) and result.pointmap.shape == (100, 120, 3)
