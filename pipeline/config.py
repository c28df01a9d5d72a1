"""Run configuration: one typed dataclass, filled from a YAML file and then from CLI flags.

Unknown keys and values of the wrong type fail with :class:`ConfigError` naming the key.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from stages.errors import ConfigError
from stages.sapiens2.config import TASKS
from stages.sapiens2.fastpath import ATTENTION_BACKENDS, COMPILE_MODES

RECORD_CODECS = ("libx264", "h264", "mpeg4", "h264_nvenc", "hevc_nvenc")  # as pipeline.sinks.recorder accepts them
AUTO_KEYS = ("channels_last",)  # bool-or-null keys where "auto" (or null) means: decided by the device


@dataclass
class RunConfig:
    # source
    source: str = "webcam"
    source_id: str | None = None
    realtime: bool = False
    stall_timeout_s: float = 5.0
    max_frames: int | None = None
    # models
    tasks: list[str] = field(default_factory=lambda: ["pose", "seg"])
    model_size: str = "0.4b"
    checkpoints: dict[str, str] = field(default_factory=dict)  # task -> folder, file or hub id
    fallback_tiny: bool = False  # weights unavailable -> tiny RANDOM checkpoints (labelled as such)
    device: str = "auto"
    dtype: str = "auto"
    pose_input: list[int] = field(default_factory=lambda: [1024, 768])
    dense_input: list[int] = field(default_factory=lambda: [1024, 768])
    flip_test: bool = False
    fuse_qkv: bool = True
    # GPU fast path (stages.sapiens2.fastpath): every option leaves the outputs unchanged
    attention: str = "auto"  # SDPA kernels: auto | flash | efficient | cudnn | math
    channels_last: bool | None = None  # decode heads in NHWC; None: on for CUDA, off for CPU
    compile: str = "off"  # torch.compile: off | default | reduce-overhead (CUDA graphs) | max-autotune
    pose_buckets: bool = True  # pad the person batch to 1/2/4/8/16 (few shapes to tune/compile)
    pinned_memory: bool = True  # page-locked host buffers: frame uploads and result downloads overlap
    # detector
    detector: str = "yolo"  # yolo | full-frame
    detector_model: str = "yolo11n.pt"
    det_conf: float = 0.25
    det_iou: float = 0.7
    max_persons: int = 8
    det_imgsz: int = 640
    track: bool = False
    detect_every: int = 1
    # keypoints
    kpt_threshold: float = 0.3
    smooth: bool = False
    smooth_min_cutoff: float = 1.0
    smooth_beta: float = 0.05
    # outputs
    record: str | None = None
    record_codec: str = "libx264"
    save_keypoints: str | None = None
    publish: str | None = None  # ZeroMQ endpoint, e.g. tcp://127.0.0.1:5555
    jpeg_quality: int = 80
    gpu_jpeg: bool = False  # encode published frames with nvJPEG when CUDA is present (CPU fallback)
    curve_dir: str | None = None  # CURVE keys folder (server.key_secret + authorized clients)
    show: bool = False
    annotate: list[str] = field(default_factory=lambda: ["matte", "seg", "boxes", "pose", "hud"])
    matte_mode: str = "composite"  # composite (predicted foreground) | replace (frame pixels)
    matte_background: str = "0,177,64"  # "R,G,B" or an image file to put behind the person
    progress: bool = True
    log_level: str = "info"

    def validate(self) -> RunConfig:
        bad = [t for t in self.tasks if t not in TASKS]
        if bad or not self.tasks:
            raise ConfigError(f"tasks: unknown {bad or 'empty list'}; choose from {', '.join(TASKS)}")
        if self.detector not in ("yolo", "full-frame"):
            raise ConfigError(f"detector: {self.detector!r} is not one of yolo, full-frame")
        for key in ("pose_input", "dense_input"):
            value = getattr(self, key)
            if len(value) != 2 or any(v <= 0 or v % 16 for v in value):
                raise ConfigError(f"{key}: expected [height, width], positive multiples of 16, got {value}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16", "fp32", "bf16", "fp16"):
            raise ConfigError(f"dtype: {self.dtype!r} is not one of auto, float32, bfloat16, float16")
        if self.detect_every < 1 or self.max_persons < 1:
            raise ConfigError("detect_every and max_persons must be at least 1")
        if self.attention not in ATTENTION_BACKENDS:
            raise ConfigError(f"attention: {self.attention!r} is not one of {', '.join(ATTENTION_BACKENDS)}")
        if self.compile not in COMPILE_MODES:
            raise ConfigError(f"compile: {self.compile!r} is not one of {', '.join(COMPILE_MODES)}")
        if self.record_codec not in RECORD_CODECS:
            raise ConfigError(f"record_codec: {self.record_codec!r} is not one of {', '.join(RECORD_CODECS)}")
        if not 1 <= self.jpeg_quality <= 100:
            raise ConfigError("jpeg_quality must be within 1..100")
        if self.matte_mode not in ("composite", "replace"):
            raise ConfigError(f"matte_mode: {self.matte_mode!r} is not one of composite, replace")
        unknown_ckpt = [t for t in self.checkpoints if t not in TASKS]
        if unknown_ckpt:
            raise ConfigError(f"checkpoints: unknown task {unknown_ckpt[0]!r}")
        return self


FIELDS = {f.name: f for f in dataclasses.fields(RunConfig)}


def _check_type(key: str, value: Any, annotation: Any) -> Any:
    """Value converted to the field's type, or ConfigError naming the key."""
    hint = typing.get_type_hints(RunConfig)[key]
    args = typing.get_args(hint)
    optional = type(None) in args
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{key}: may not be empty")
    base = next((a for a in args if a is not type(None)), hint) if isinstance(hint, types.UnionType) else hint
    origin = typing.get_origin(base) or base
    if origin is bool:
        ok = isinstance(value, bool)
    elif origin is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif origin is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif origin is str:
        ok = isinstance(value, str)
    elif origin is list:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        item = typing.get_args(base)[0]
        ok = isinstance(value, list) and all(isinstance(v, item) and not isinstance(v, bool) for v in value)
    elif origin is dict:
        ok = isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
    else:  # pragma: no cover - every field type is listed above
        ok = True
    if not ok:
        raise ConfigError(f"{key}: expected {getattr(base, '__name__', base)}, got {type(value).__name__} {value!r}")
    return value


def merge(cfg: RunConfig, values: dict[str, Any], where: str) -> RunConfig:
    """cfg with values applied; unknown keys and wrong types name the key and where it came from."""
    updates = {}
    for key, value in values.items():
        if key not in FIELDS:
            close = [k for k in FIELDS if k.startswith(key[:4])]
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{where}: unknown key {key!r}{hint}")
        if key in AUTO_KEYS and isinstance(value, str) and value.lower() == "auto":
            value = None
        try:
            updates[key] = _check_type(key, value, FIELDS[key].type)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return dataclasses.replace(cfg, **updates)


def load_config(path: str | Path | None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Defaults <- YAML file <- overrides (CLI flags), validated."""
    cfg = RunConfig()
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"{path}: config file not found")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a mapping of keys to values")
        cfg = merge(cfg, data, str(path))
    if overrides:
        cfg = merge(cfg, overrides, "command line")
    try:
        return cfg.validate()
    except ConfigError as exc:
        raise ConfigError(f"{path or 'config'}: {exc}") from None
