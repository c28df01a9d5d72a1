"""Building the stages a run needs from its config: checkpoints (hub, local, or tiny fallback) and detector.

Every checkpoint is located first (hub cache or download, local path) and only then are models
loaded, so a missing checkpoint fails in seconds with one line instead of after the other models.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from pipeline.cli.config import RunConfig
from stages.detect import Detector, DetectorError, FullFrameDetector
from stages.detect.yolo import PersonDetector
from stages.device import DeviceError, resolve_device
from stages.metadata import load_metadata
from stages.sapiens2.estimators import estimator_for
from stages.sapiens2.fastpath import FastPath
from stages.sapiens2.tiny import make_tiny
from stages.sapiens2.weights import (
    CheckpointError,
    cache_root,
    is_hub_id,
    load_model,
    locate,
)
from stages.tasks import TASKS, person_task

log = logging.getLogger(__name__)


@dataclass
class Stages:
    device: torch.device
    detector: Detector
    estimators: dict = field(default_factory=dict)  # task -> estimator
    random_weights: bool = False
    notes: list[str] = field(default_factory=list)  # one-line facts the CLI shows
    fallback: str | None = None  # the one line that said what runs on random weights instead (logged already)
    background_id: int = 0  # the segmentation class that is not a person
    warmup_s: dict[str, float] = field(default_factory=dict)  # task -> start-up warm-up seconds

    def close(self) -> None:
        """Stop the estimators' background compiles (a run that ends does not wait for them)."""
        for est in self.estimators.values():
            est.close()


def tiny_dir(task: str) -> Path:
    return cache_root() / "tiny" / task


def pick_device(name: str) -> torch.device:
    """The run's device, indexed; a CUDA device also becomes the current one, so that every library
    that says just "cuda" (Ultralytics included) lands on it."""
    try:
        return resolve_device(name, make_current=True)
    except DeviceError as exc:
        raise CheckpointError(str(exc)) from None


def checkpoint_sources(cfg: RunConfig) -> dict[str, Path]:
    """Where each task's checkpoint is (hub ids resolved through the cache or downloaded); the tiny
    random checkpoint where the real one cannot be had and ``fallback_tiny`` allows it. Raises
    CheckpointError naming the first that cannot be found, before any model loads."""
    found: dict[str, Path] = {}
    for task in cfg.tasks:
        source = cfg.checkpoints.get(task, TASKS[task].hub_id(cfg.model_size))
        try:
            found[task] = locate(source)
        except CheckpointError as exc:
            if not cfg.fallback_tiny:
                if is_hub_id(source):
                    raise CheckpointError(f"{exc}; or pass --fallback-tiny to try the pipeline on tiny "
                                          "random-weight checkpoints") from None
                raise
            folder = tiny_dir(task)
            if not (folder / "model.safetensors").exists():
                make_tiny(folder, task)
            log.debug("%s: %s", task, exc)
            found[task] = folder
    return found


def _input_size(task: str, cfg: RunConfig, model, notes: list[str]) -> tuple[int, int]:
    wanted = tuple(cfg.pose_input if TASKS[task].per_person else cfg.dense_input)
    if getattr(model, "random_weights", False) and wanted == (1024, 768):
        return tuple(model.cfg.image_size)  # tiny checkpoints were built for their own small size
    if TASKS[task].scale_head and model.cfg.head.has_scale:
        fixed = tuple(model.cfg.image_size)
        if wanted != fixed and wanted != (1024, 768):  # the user asked for another size: say why not
            notes.append(f"{task}: --dense-input {wanted[0]}x{wanted[1]} does not apply: its scale branch fixes "
                         f"the input at {fixed[0]}x{fixed[1]}")
        return fixed
    return wanted


def build_stages(cfg: RunConfig, device: torch.device | None = None) -> Stages:
    """Load every model the run needs; fall back to tiny random checkpoints only when allowed."""
    device = device or pick_device(cfg.device)
    notes: list[str] = []
    sources = checkpoint_sources(cfg)
    tiny = tiny_fallbacks(cfg, sources)
    no_detector: list[str] = []
    detector = build_detector(cfg, device, no_detector)  # before the models: a bad detector fails fast
    for why in no_detector:
        log.debug(why)
    fallback = fallback_line(tiny, cfg.detector_model if no_detector else None)
    if fallback:  # before the models load: their lines say RANDOM WEIGHTS, this one why
        log.warning(fallback)
    estimators = {}
    fastpath = fastpath_from(cfg)
    for task, path in sources.items():
        model = load_model(path, device=device, dtype=cfg.dtype)
        kwargs = {"flip_test": cfg.flip_test, "buckets": cfg.pose_buckets} if TASKS[task].per_person else {}
        size = _input_size(task, cfg, model, notes)
        estimators[task] = estimator_for(task)(model, input_size=size, fastpath=fastpath, **kwargs)
    random = any(e.random_weights for e in estimators.values()) or detector.random_weights
    background = list(load_metadata().seg_class_names).index("Background")
    return Stages(device, detector, estimators, random, notes, fallback, background_id=background)


def tiny_fallbacks(cfg: RunConfig, sources: dict[str, Path]) -> dict[str, str]:
    """The tasks ``checkpoint_sources`` gave a tiny random checkpoint instead: task -> the one wanted."""
    wanted = {task: str(cfg.checkpoints.get(task, TASKS[task].hub_id(cfg.model_size))) for task in sources}
    return {task: want for task, want in wanted.items()
            if sources[task] == tiny_dir(task) and want != str(sources[task])}


def fallback_line(tiny: dict[str, str], detector: str | None) -> str | None:
    """One line for what --fallback-tiny put in place of the real weights: ``tiny`` (task -> the checkpoint
    wanted), ``detector`` (the detector model that could not be had: the whole frame is the person)."""
    if not tiny and detector is None:
        return None
    what = [f"tiny random {', '.join(tiny)} model{'s' * (len(tiny) > 1)}"] if tiny else []
    what += ["the whole frame as the person"] if detector else []
    missing = [*tiny.values(), *([detector] if detector else [])]
    names = ", ".join(missing[:-1]) + (" and " if len(missing) > 1 else "") + missing[-1]
    real = " ".join([*(["--checkpoint TASK=DIR"] if tiny else []), *(["--detector-model FILE.pt"] if detector else [])])
    head = "RANDOM WEIGHTS (outputs meaningless): " if tiny else "no person detector: "
    return (f"{head}{' and '.join(what)}, since {names} {'are' if len(missing) > 1 else 'is'} not here (offline?); "
            f"for real ones go online once or pass {real}")


def fastpath_from(cfg: RunConfig) -> FastPath:
    """The estimators' fast-path options of a run (validated by RunConfig.validate)."""
    return FastPath(attention=cfg.attention, channels_last=cfg.channels_last, compile=cfg.compile,
                    cuda_graphs=cfg.cuda_graphs)


def build_detector(cfg: RunConfig, device: torch.device, notes: list[str]) -> Detector:
    """YOLO restricted to people (or the whole frame). Only the default model name, when it cannot be
    downloaded and ``fallback_tiny`` is on, falls back to the full frame; a model the user named
    that cannot be had is an error."""
    if cfg.detector == "full-frame" or person_task(cfg.tasks) is None:  # no task runs on person crops
        return FullFrameDetector()
    try:
        return PersonDetector(cfg.detector_model, conf=cfg.det_conf, iou=cfg.det_iou, max_persons=cfg.max_persons,
                              imgsz=cfg.det_imgsz, device=device, trust=cfg.trust_detector_model)
    except DetectorError as exc:
        default = cfg.detector_model == RunConfig.detector_model
        if not (cfg.fallback_tiny and default):
            raise
        notes.append(f"detector: {str(exc).splitlines()[0]} -> using the full frame as one person instead")
        return FullFrameDetector()
