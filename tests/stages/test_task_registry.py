"""stages.tasks is the one place a Sapiens2 task is declared: a made-up task, added with a registry entry,
an estimator and an annotator (all three here, nothing else touched), gets a checkpoint, loads, runs
through the engine of a real run and is drawn; and every published task's spec agrees with the code
that reads it.

Two made-up tasks: ``albedo`` on the whole frame, ``hand`` (21 keypoints) on the person crops. A task on
the crops gives the persons' keypoints, which the carried boxes, the smoothing, the 3D step, the keypoint
message and the JSONL file read: ``hand`` runs in place of pose (a run has one such task; two are refused),
and its keypoints reach the JSONL file and the keypoint message with no other file touched. (The 3D step's
root and triangulation read the metadata's skeleton, the hips: they are pose's, not a second keypoint task's.) A whole-frame
task's result reaches every sink in ``FrameResult.maps`` and is drawn into the published picture; a wire
kind of its own (``TaskSpec.message``) is a change of the format (docs/WIRE.md, both clients), not of the
registry, and the JSONL file carries keypoints only."""

from __future__ import annotations

import dataclasses
import json
import threading
import typing

import numpy as np
import pytest
import torch
from torch import Tensor

from pipeline.cli.config import ConfigError, RunConfig, annotation_layers
from pipeline.run.app import assemble
from pipeline.run.build import build_stages
from pipeline.sinks.build import build_outputs
from pipeline.sinks.messages import TASK_MESSAGES, frame_messages, frame_meta
from pipeline.sources import open_source
from sapiens2_client import wire
from stages import tasks
from stages.annotate import BaseAnnotator
from stages.sapiens2 import load_model
from stages.sapiens2.config import variant
from stages.sapiens2.configjson import config_from_json, config_to_json
from stages.sapiens2.estimators import PoseEstimator, _DenseEstimator, estimator_for
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


# -- the made-up task on the person crops: its three parts ---------------------------------------------
HAND = tasks.TaskSpec("hand", "Sapiens2ForHandPoseEstimation", 21, "deconv", (768, 768), f"{__name__}:HandEstimator",
                      "hand", "keypoints", layer="hand", annotator=f"{__name__}:HandAnnotator", per_person=True)


class HandEstimator(PoseEstimator):
    """21 keypoints per person box: the pose estimator's crops, heatmaps and decoding (no mirrored pairs)."""

    task = "hand"

    def __init__(self, model, **kwargs) -> None:
        super().__init__(model, flip_pairs=np.zeros((0, 2), np.int64), **kwargs)


class HandAnnotator(BaseAnnotator):
    """A white dot at every keypoint."""

    layer = 4

    def annotate(self, image: np.ndarray, result: FrameResult) -> np.ndarray:
        x, y = result.keypoints.xy.reshape(-1, 2).round().astype(int).T
        image[y, x] = 255
        return image


@pytest.fixture
def hand(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(tasks.TASKS, "hand", HAND)
    return HAND


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
        # the publisher's messages: the albedo drawn is the published picture, and no kind of its own
        meta = frame_meta(result, result.frame.source_id, {}, True)
        sent = frame_messages(result, meta, wire.KINDS, raw_frames=False)
        assert [kind for kind, _, _ in sent] == ["keypoints", "frame"]
        assert sent[1][1]["annotated"] and sent[1][2][0].array is result.annotated


def test_a_made_up_task_on_the_person_crops_runs_in_place_of_pose(hand, tmp_path) -> None:
    folder = make_tiny(tmp_path / "hand", "hand", image_size=SIZE)
    keypoints_file = tmp_path / "keypoints.jsonl"
    cfg = RunConfig(source=["demo"], tasks=["hand"], checkpoints={"hand": str(folder)}, annotate=["hand"],
                    detector="full-frame", device="cpu", max_frames=2, progress=False,
                    save_keypoints=str(keypoints_file)).validate()
    assert "hand" in annotation_layers() and cfg.tasks == ["hand"]
    stages = build_stages(cfg, torch.device("cpu"))
    assert type(stages.estimators["hand"]) is HandEstimator
    stop = threading.Event()
    outputs = build_outputs(cfg, stop)
    sink = Collect()
    runner, display = assemble(cfg, [open_source("demo")], stages, [*outputs.sinks, sink], stop)
    stats = runner.run()
    display.close()
    outputs.close_sinks()
    assert stats.error is None and len(sink.results) == 2
    lines = [json.loads(line) for line in keypoints_file.read_text().splitlines()]
    assert [line["frame"] for line in lines] == [r.frame.index for r in sink.results]
    for result, line in zip(sink.results, lines):
        kp = result.keypoints
        assert len(result.detections) == 1 and kp.xy.shape == (1, 21, 2) and kp.scores.shape == (1, 21)
        assert np.isfinite(kp.xy).all() and "hand" in result.latency_ms
        (person,) = line["persons"]
        np.testing.assert_allclose(np.array(person["keypoints"])[:, :2], kp.xy[0], atol=0.01)
        x, y = kp.xy[0].round().astype(int).T
        assert (result.annotated[y, x] == 255).all()  # drawn by its annotator
        meta = frame_meta(result, result.frame.source_id, {}, True)
        (message,) = frame_messages(result, meta, ["keypoints"], raw_frames=False)
        assert message[1]["num_keypoints"] == 21 and message[2][0].array.shape == (1, 21, 2)


def test_a_run_has_one_task_on_the_person_crops(hand) -> None:
    with pytest.raises(ConfigError, match="tasks: pose, hand: each runs on the person crops"):
        RunConfig(tasks=["pose", "hand"], checkpoints={"hand": "x"}).validate()
    assert RunConfig(tasks=["hand", "seg"], checkpoints={"hand": "x"}).validate().tasks == ["hand", "seg"]


def test_the_made_up_task_is_a_choice_of_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="tasks: unknown"):  # without its entry it is unknown
        RunConfig(tasks=["albedo"]).validate()
    monkeypatch.setitem(tasks.TASKS, "albedo", ALBEDO)
    cfg = RunConfig(tasks=["albedo"], annotate=["albedo"], checkpoints={"albedo": "x"}).validate()
    assert cfg.tasks == ["albedo"] and cfg.annotate == ["albedo"]
    assert ALBEDO.hub_id("0.4b") == "facebook/sapiens2-albedo-0.4b" and estimator_for("albedo") is AlbedoEstimator


def test_what_the_specs_name_exists() -> None:
    """Each setting, wire kind and 3D role a spec names is one the code that reads it knows."""
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    hints = typing.get_type_hints(RunConfig)
    for spec in tasks.TASKS.values():
        assert {key for _, key in spec.style} | set(spec.settings) <= fields, spec.name
        assert spec.used_by is None or hints[spec.used_by] is bool
        assert spec.message is None or spec.message in TASK_MESSAGES and spec.message in wire.KINDS
        assert not spec.style or tasks.load(spec.annotator)
        assert (spec.result == "keypoints") == spec.per_person
    roles = [spec.lift for spec in tasks.TASKS.values() if spec.lift]
    assert sorted(roles) == ["alpha", "classes", "points"]  # each once: the 3D step reads them by role
    assert [spec.name for spec in tasks.TASKS.values() if spec.every] == [tasks.every_task()]


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
