"""stages.tasks is the one place a Sapiens2 task is declared: a made-up task, added with a registry entry,
an estimator and an annotator (all three here, nothing else touched), gets a checkpoint, loads, runs
through the engine of a real run and is drawn; and every published task's spec agrees with the code
that reads it."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from torch import Tensor

from pipeline.cli.config import ConfigError, RunConfig
from pipeline.run.app import assemble
from pipeline.run.build import build_stages
from pipeline.sources import open_source
from stages import tasks
from stages.annotate import BaseAnnotator
from stages.sapiens2 import load_model
from stages.sapiens2.config import variant
from stages.sapiens2.configjson import config_from_json, config_to_json
from stages.sapiens2.estimators import _DenseEstimator, estimator_for
from stages.sapiens2.postprocess import pointmaps
from stages.sapiens2.tiny import make_tiny
from stages.types import FrameResult

SIZE = (64, 48)

# -- the made-up task: its three parts ----------------------------------------------------------------
ALBEDO = tasks.TaskSpec("albedo", "Sapiens2ForAlbedoEstimation", 3, "pixel_shuffle", (512, 256, 128, 64),
                        f"{__name__}:AlbedoEstimator", "dense", None, layer="albedo",
                        annotator=f"{__name__}:AlbedoAnnotator", activation="sigmoid")


class AlbedoEstimator(_DenseEstimator):
    """Surface colour in [0, 1] per pixel: the head's sigmoid maps cropped back to the frame."""

    task = "albedo"

    def postprocess(self, raw: tuple[Tensor, Tensor | None], frame_hw: tuple[int, int]) -> dict[str, Tensor]:
        return {"albedo": pointmaps(raw[0], None, frame_hw, self.input_size)[0].permute(1, 2, 0).contiguous()}


class AlbedoAnnotator(BaseAnnotator):
    """The albedo itself as the picture."""

    layer = 1

    def annotate(self, image: np.ndarray, result: FrameResult) -> np.ndarray:
        return (result.maps["albedo"] * 255).round().astype(np.uint8)


@pytest.fixture
def albedo(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(tasks.TASKS, "albedo", ALBEDO)
    return ALBEDO


class Collect:
    uses_image = True

    def __init__(self) -> None:
        self.results: list[FrameResult] = []

    def open(self, info) -> None:
        pass

    def write(self, result: FrameResult) -> None:
        self.results.append(result)

    def close(self) -> None:
        pass


def test_a_made_up_task_runs_end_to_end_from_its_registry_entry(albedo, tmp_path) -> None:
    folder = make_tiny(tmp_path / "albedo", "albedo", image_size=SIZE)
    model = load_model(folder, device="cpu")
    assert model.cfg.task == "albedo" and model.cfg.num_labels == 3 and model.cfg.head.use_pixel_shuffle
    cfg = RunConfig(source=["demo"], tasks=["albedo"], checkpoints={"albedo": str(folder)}, annotate=["albedo"],
                    device="cpu", max_frames=2, progress=False, dense_input=list(SIZE)).validate()
    stages = build_stages(cfg, torch.device("cpu"))
    assert type(stages.estimators["albedo"]) is AlbedoEstimator
    sink = Collect()
    runner, display = assemble(cfg, [open_source("demo")], stages, [sink], threading.Event())
    stats = runner.run()
    display.close()
    assert stats.error is None and len(sink.results) == 2
    for result in sink.results:
        albedo_map = result.maps["albedo"]
        assert albedo_map.shape == (result.frame.height, result.frame.width, 3) and albedo_map.dtype == np.float32
        assert 0.0 <= albedo_map.min() and albedo_map.max() <= 1.0 and albedo_map.std() > 0  # the sigmoid's range
        np.testing.assert_array_equal(result.annotated, (albedo_map * 255).round().astype(np.uint8))
        assert result.seg is None and result.matte is None and "albedo" in result.latency_ms


def test_the_made_up_task_is_a_choice_of_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="tasks: unknown"):  # without its entry it is unknown
        RunConfig(tasks=["albedo"]).validate()
    monkeypatch.setitem(tasks.TASKS, "albedo", ALBEDO)
    cfg = RunConfig(tasks=["albedo"], annotate=["albedo"], checkpoints={"albedo": "x"}).validate()
    assert cfg.tasks == ["albedo"] and cfg.annotate == ["albedo"]
    assert ALBEDO.hub_id("0.4b") == "facebook/sapiens2-albedo-0.4b" and estimator_for("albedo") is AlbedoEstimator


@pytest.mark.parametrize("name", list(tasks.TASKS))
def test_each_published_task_is_what_its_spec_says(name: str, tmp_path) -> None:
    spec = tasks.TASKS[name]
    cfg = variant(name, "0.4b")
    assert cfg.num_labels == spec.num_labels and cfg.head.use_pixel_shuffle == (spec.head == "pixel_shuffle")
    assert cfg.head.upsample_out_channels == list(spec.upsample) and cfg.head.has_scale == spec.scale_head
    written = config_to_json(cfg)
    assert written["architectures"] == [spec.architecture] and config_from_json(written, "x").task == name
    model = load_model(make_tiny(tmp_path, name, image_size=SIZE), device="cpu")
    assert isinstance(estimator_for(name)(model), estimator_for(name)) and model.activation == spec.activation
    assert spec.stream in tasks.streams() and (spec.layer is None or spec.layer in tasks.layers())
