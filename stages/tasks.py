"""The Sapiens2 tasks: one ``TaskSpec`` each, the one place a task is declared. Everything that differs
by task (checkpoint, head, estimator, CUDA stream, result, drawing, command-line choice) is read
from here. Torch-free: the command line checks a run's tasks before anything heavy is imported.

A new task is a ``TaskSpec`` in ``TASKS``, its estimator (a class with ``task``, ``run_batch`` and
``result``; see ``stages.sapiens2.estimators``) and, if it is drawn, its annotator (a
``stages.annotate.BaseAnnotator``)."""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TaskSpec:
    """One Sapiens2 task.

    name: the command line's choice (``--tasks``, ``--checkpoint NAME=DIR``) and the key of its outputs.
    default: run when ``--tasks`` is not given.
    architecture: the class name transformers writes into a checkpoint's config.json.
    num_labels: output channels of the published head.
    head: ``deconv`` (stride-2 transposed convs: pose, seg) or ``pixel_shuffle`` (conv + PixelShuffle(2)).
    upsample: output channels of the published head's upsampling blocks (one block doubles the size).
    estimator: ``module:Class`` of its estimator, imported when the task loads.
    stream: the CUDA stream the engine runs it on (tasks may share one).
    result: the ``FrameResult`` field its output fills; None: ``FrameResult.maps[name]``.
    layer: the annotation layer that draws it (``--annotate``); None: not drawn.
    annotator: ``module:Class`` of that layer's annotator: for a layer ``stages.annotate`` does not know, or one
        styled from the config.
    style: (annotator keyword, ``RunConfig`` key) pairs: the annotator's style comes from these settings.
    backdrop: its layer replaces the picture's background: first among ``--annotate``'s layers.
    per_person: run on the detector's person crops rather than the whole frame; its output is the persons'
        keypoints (``FrameResult.keypoints``, output keys ``<name>.xy`` ...), which the boxes carried between
        detector runs, the smoothing and the 3D step read. One such task per run (``person_task``).
    every: may run on every N-th frame of a source only (``pointmap_every``), the frames between reusing its
        last map. One such task.
    lift: what its map is to the 3D step (``stages.keypoints3d.lift``): ``points`` (sampled at the keypoints),
        ``classes`` or ``alpha`` (which pixels are the person); None: not read.
    message: the wire kind its result is published as (``sapiens2_client.wire.KINDS``); None: not published.
    settings: ``RunConfig`` keys warned about when given without this task (``unused_settings`` of the CLI).
    unused: the warning when it runs and nothing uses its output; None: something always does.
    used_by: the ``RunConfig`` switch that uses its output (with it on, no ``unused`` warning).
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
    default: bool = False
    layer: str | None = None
    annotator: str | None = None
    style: tuple[tuple[str, str], ...] = ()
    backdrop: bool = False
    per_person: bool = False
    every: bool = False
    lift: str | None = None
    message: str | None = None
    settings: tuple[str, ...] = ()
    unused: str | None = None
    used_by: str | None = None
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
_ANNOTATE = "stages.annotate"
_FOUR = (512, 256, 128, 64)

TASKS: dict[str, TaskSpec] = {spec.name: spec for spec in (
    TaskSpec("pose", "Sapiens2ForPoseEstimation", 308, "deconv", (768, 768), f"{_ESTIMATORS}:PoseEstimator",
             stream="pose", result="keypoints", default=True, layer="pose",
             annotator=f"{_ANNOTATE}:SkeletonAnnotator", style=(("threshold", "kpt_threshold"),), per_person=True),
    TaskSpec("seg", "Sapiens2ForSemanticSegmentation", 29, "deconv", _FOUR, f"{_ESTIMATORS}:Segmenter",
             stream="seg", result="seg", default=True, layer="seg", lift="classes", message="seg"),
    TaskSpec("matting", "Sapiens2ForImageMatting", 4, "pixel_shuffle", _FOUR, f"{_ESTIMATORS}:MattingEstimator",
             stream="matting", result="matte", layer="matte", annotator=f"{_ANNOTATE}:MatteAnnotator",
             style=(("background", "matte_background"), ("mode", "matte_mode")), backdrop=True,
             activation="sigmoid", published_size="1b", lift="alpha", message="matte",
             settings=("matte_background",)),
    TaskSpec("normal", "Sapiens2ForNormalEstimation", 3, "pixel_shuffle", _FOUR, f"{_ESTIMATORS}:NormalEstimator",
             stream="dense", result="normals",
             unused="the normal task runs, but no output of the pipeline carries surface normals yet (not the "
                    "stream, the files or the annotated frame); leave it out to save device time"),
    TaskSpec("pointmap", "Sapiens2ForPointmapEstimation", 3, "pixel_shuffle", _FOUR,
             f"{_ESTIMATORS}:PointmapEstimator", stream="dense", result="pointmap", scale_head=True, every=True,
             lift="points", unused="the pointmap task runs, but only --keypoints3d uses its maps; add --keypoints3d "
                                   "or leave it out", used_by="keypoints3d"),
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


def person_task(names: Iterable[str]) -> str | None:
    """The one of ``names`` that runs on the person crops (``per_person``); None: none does. ValueError
    when several do: a run has one set of keypoints."""
    people = [name for name in names if get_task(name).per_person]
    if len(people) > 1:
        raise ValueError(f"{', '.join(people)}: each runs on the person crops, and a run has one set of "
                         "keypoints; choose one")
    return people[0] if people else None


def every_task() -> str | None:
    """The registered task that may run on every N-th frame only (``every``)."""
    return next((spec.name for spec in TASKS.values() if spec.every), None)


def lift_task(role: str) -> str | None:
    """The registered task whose map is ``role`` to the 3D step (``lift``: points, classes, alpha)."""
    return next((spec.name for spec in TASKS.values() if spec.lift == role), None)
