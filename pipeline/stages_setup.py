"""Building the stages a run needs from its config: checkpoints (hub, local, or tiny fallback) and detector."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from stages.detector import Detector, DetectorError, FullFrameDetector, PersonDetector
from stages.sapiens2.estimators import ESTIMATORS
from stages.sapiens2.fastpath import FastPath
from stages.sapiens2.tiny import make_tiny
from stages.sapiens2.weights import CheckpointError, load_model

from .config import RunConfig

log = logging.getLogger(__name__)


@dataclass
class Stages:
    device: torch.device
    detector: Detector
    estimators: dict = field(default_factory=dict)  # task -> estimator
    random_weights: bool = False
    notes: list[str] = field(default_factory=list)  # one-line facts the CLI shows (fallbacks)
    warmup_s: dict[str, float] = field(default_factory=dict)  # task -> start-up warm-up (compile) seconds


def hub_id(task: str, size: str) -> str:
    """Published checkpoint of a task; matting exists only at 1B."""
    return f"facebook/sapiens2-{task}-{'1b' if task == 'matting' else size}"


def tiny_dir(task: str) -> Path:
    root = Path(os.environ.get("SAPIENS2_STREAM_CACHE", Path.home() / ".cache" / "sapiens2-stream"))
    return root / "tiny" / task


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CheckpointError(f"device {name!r} requested but CUDA is not available; use --device cpu")
    return device


def _load(task: str, cfg: RunConfig, device: torch.device, notes: list[str]):
    source = cfg.checkpoints.get(task, hub_id(task, cfg.model_size))
    try:
        return load_model(source, device=device, dtype=cfg.dtype, fuse_qkv=cfg.fuse_qkv)
    except CheckpointError as exc:
        if not cfg.fallback_tiny:
            raise
        folder = tiny_dir(task)
        if not (folder / "model.safetensors").exists():
            make_tiny(folder, task)
        notes.append(f"{task}: {source} unavailable ({str(exc).split(';')[0].split(': ', 1)[-1]}); "
                     f"running on a tiny RANDOM-WEIGHT checkpoint, outputs are meaningless")
        return load_model(folder, device=device, dtype=cfg.dtype, fuse_qkv=cfg.fuse_qkv)


def _input_size(task: str, cfg: RunConfig, model) -> tuple[int, int]:
    wanted = tuple(cfg.pose_input if task == "pose" else cfg.dense_input)
    if getattr(model, "random_weights", False) and wanted == (1024, 768):
        return tuple(model.cfg.image_size)  # tiny checkpoints were built for their own small size
    if task == "pointmap" and model.cfg.head.has_scale:
        return tuple(model.cfg.image_size)
    return wanted


def build_stages(cfg: RunConfig) -> Stages:
    """Load every model the run needs; fall back to tiny random checkpoints only when allowed."""
    device = pick_device(cfg.device)
    notes: list[str] = []
    estimators = {}
    fastpath = fastpath_from(cfg)
    for task in cfg.tasks:
        model = _load(task, cfg, device, notes)
        kwargs = {"flip_test": cfg.flip_test, "buckets": cfg.pose_buckets} if task == "pose" else {}
        estimators[task] = ESTIMATORS[task](model, input_size=_input_size(task, cfg, model), fastpath=fastpath,
                                            **kwargs)
    warmup_s = warm_up(estimators, cfg, device)
    detector = build_detector(cfg, device, notes)
    random = any(e.random_weights for e in estimators.values()) or detector.random_weights
    return Stages(device, detector, estimators, random, notes, warmup_s)


def fastpath_from(cfg: RunConfig) -> FastPath:
    """The estimators' fast-path options of a run (validated by RunConfig.validate)."""
    return FastPath(attention=cfg.attention, channels_last=cfg.channels_last, compile=cfg.compile)


def warm_up(estimators: dict, cfg: RunConfig, device: torch.device) -> dict[str, float]:
    """Run every input shape once before the first frame: compiles (when on) and cuDNN autotuning
    happen here instead of stalling the stream. Skipped on CPU without compile (nothing to gain)."""
    if cfg.compile == "off" and device.type != "cuda":
        return {}
    seconds = {task: est.warmup(cfg.max_persons) for task, est in estimators.items()}
    what = "compile warm-up" if cfg.compile != "off" else "warm-up"
    log.info("%s %.1f s (%s)", what, sum(seconds.values()), ", ".join(f"{t} {s:.1f} s" for t, s in seconds.items()))
    return seconds


def build_detector(cfg: RunConfig, device: torch.device, notes: list[str]) -> Detector:
    if cfg.detector == "full-frame" or "pose" not in cfg.tasks:
        return FullFrameDetector()
    try:
        return PersonDetector(cfg.detector_model, conf=cfg.det_conf, iou=cfg.det_iou, max_persons=cfg.max_persons,
                              imgsz=cfg.det_imgsz, device=str(device), track=cfg.track, every_n=cfg.detect_every)
    except DetectorError as exc:
        if not cfg.fallback_tiny:
            raise
        notes.append(f"detector: {str(exc).splitlines()[0]} -> using the full frame as one person instead")
        return FullFrameDetector()
