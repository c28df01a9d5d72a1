"""The Sapiens2 tasks: one ``TaskSpec`` each, the one place a task is declared. Everything that differs
by task (checkpoint, head, estimator, CUDA stream, result, drawing, command-line choice) is read
from here. Torch-free: the command line checks a run's tasks before anything heavy is imported.

A new task is a ``TaskSpec`` in ``TASKS``, its estimator (a class with ``task``, ``run_batch`` and
``result``; see ``stages.sapiens2.estimators``) and, if it is drawn, its annotator (a
``stages.annotate.BaseAnnotator``)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TaskSpec:
    """One Sapiens2 task.

    name: the command line's choice (``--tasks``, ``--checkpoint NAME=DIR``) and the key of its outputs.
    architecture: the class name transformers writes into a checkpoint's config.json.
    num_labels: output channels of the published head.
    head: ``deconv`` (stride-2 transposed convs: pose, seg) or ``pixel_shuffle`` (conv + PixelShuffle(2)).
    upsample: output channels of the published head's upsampling blocks (one block doubles the size).
    estimator: ``module:Class`` of its estimator, imported when the task loads.
    stream: the CUDA stream the engine runs it on (tasks may share one).
    result: the ``FrameResult`` field its output fills; None: ``FrameResult.maps[name]``.
    layer: the annotation layer that draws it (``--annotate``); None: not drawn.
    annotator: ``module:Class`` of that layer's annotator, for a layer ``stages.annotate`` does not know.
    per_person: run on the detector's person crops (pose) rather than the whole frame.
    scale_head: the head also predicts a scale (pointmap: metric depth).
    activation: applied to the head's maps in the model (``sigmoid``: matting's alpha and foreground).
    published_size: the one model size it is published in (matting: 1b); None: every size.
    """

    name: str
    architecture: str
    num_labels: int
    head: str
    upsample: tuple[int, ...]
    estimator: str
    stream: str
    result: str | None
    layer: str | None = None
    annotator: str | None = None
    per_person: bool = False
    scale_head: bool = False
    activation: str | None = None
    published_size: str | None = None

    @property
    def predictor(self) -> str:
        """The predictor layer's name in Meta's original checkpoints."""
        return f"conv_{self.name}"

    def hub_id(self, size: str) -> str:
        """The published checkpoint of this task at ``size`` (e.g. ``facebook/sapiens2-pose-0.4b``)."""
        return f"facebook/sapiens2-{self.name}-{self.published_size or size}"

    def estimator_class(self) -> type:
        return load(self.estimator)


def load(target: str) -> Any:
    """The object a ``module:name`` string names (imported now)."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


_ESTIMATORS = "stages.sapiens2.estimators"
_FOUR = (512, 256, 128, 64)

TASKS: dict[str, TaskSpec] = {spec.name: spec for spec in (
    TaskSpec("pose", "Sapiens2ForPoseEstimation", 308, "deconv", (768, 768), f"{_ESTIMATORS}:PoseEstimator",
             stream="pose", result="keypoints", layer="pose", per_person=True),
    TaskSpec("seg", "Sapiens2ForSemanticSegmentation", 29, "deconv", _FOUR, f"{_ESTIMATORS}:Segmenter",
             stream="seg", result="seg", layer="seg"),
    TaskSpec("matting", "Sapiens2ForImageMatting", 4, "pixel_shuffle", _FOUR, f"{_ESTIMATORS}:MattingEstimator",
             stream="matting", result="matte", layer="matte", activation="sigmoid", published_size="1b"),
    TaskSpec("normal", "Sapiens2ForNormalEstimation", 3, "pixel_shuffle", _FOUR, f"{_ESTIMATORS}:NormalEstimator",
             stream="dense", result="normals"),
    TaskSpec("pointmap", "Sapiens2ForPointmapEstimation", 3, "pixel_shuffle", _FOUR,
             f"{_ESTIMATORS}:PointmapEstimator", stream="dense", result="pointmap", scale_head=True),
)}


def get_task(name: str) -> TaskSpec:
    """The spec of ``name``; ValueError naming the choices for an unknown one."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; choose from {', '.join(TASKS)}") from None


def by_architecture(architecture: str) -> TaskSpec | None:
    return next((spec for spec in TASKS.values() if spec.architecture == architecture), None)


def streams() -> tuple[str, ...]:
    """The tasks' CUDA streams, in the order of the registry."""
    return tuple(dict.fromkeys(spec.stream for spec in TASKS.values()))


def layers() -> dict[str, str]:
    """Annotation layer -> the task that draws it."""
    return {spec.layer: spec.name for spec in TASKS.values() if spec.layer}
