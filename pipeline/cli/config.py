"""Run configuration: one typed dataclass, filled from a YAML file and then from CLI flags.

Every field carries its help text (and, where it needs one, its flag spelling, choices or value
parser) in its metadata; the CLI's run flags are generated from these fields, so a key and its
flag cannot drift apart. Unknown keys and values of the wrong type fail with
:class:`ConfigError` naming the key.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from sapiens2_client.endpoints import check_endpoint
from sapiens2_client.wire import check_source_id

from pipeline.cli.options import option, parse_auto_bool, parse_checkpoint, parse_size
from pipeline.cli.sourcespecs import SourceSpec, name_sources
from pipeline.mocap.options import MocapFields
from stages.errors import ConfigError
from stages.sapiens2.fastpath_options import ATTENTION_NAMES, COMPILE_MODES, CUDA_GRAPHS
from stages.tasks import TASKS, lift_task, person_task

__all__ = ["ConfigError", "RunConfig", "load_config", "merge", "option"]

RECORD_CODECS = ("libx264", "h264", "mpeg4", "h264_nvenc", "hevc_nvenc")  # as pipeline.sinks.recorder accepts them
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
AUTO_KEYS = ("channels_last", "gpu_jpeg")  # bool-or-null keys where "auto" (or null) means: decided by the device
MAX_DET_IMGSZ = 4096  # detector input side: 6.4x the default already
MAX_FRAGMENT_S = 60.0  # record_fragment_s: a keyframe at least every two minutes of media


def annotation_layers() -> tuple[str, ...]:
    """--annotate's choices, bottom-up: the layers of the whole-frame tasks (a backdrop first), the persons'
    boxes, the layers of the tasks on the person crops, the 3D inset and the text (stages.annotate's
    ``boxes``, ``side3d`` and ``hud``; the tasks' from stages.tasks)."""
    drawn = [spec for spec in TASKS.values() if spec.layer]
    frame = sorted((spec for spec in drawn if not spec.per_person), key=lambda spec: not spec.backdrop)
    return (*[spec.layer for spec in frame], "boxes", *[spec.layer for spec in drawn if spec.per_person],
            "side3d", "hud")


@dataclass
class RunConfig(MocapFields):  # the motion-capture keys: pipeline/mocap/options.py
    # sources
    source: list[str] = option(help="repeatable, each [NAME=]SPEC: webcam, webcam:N, /dev/videoN, a video file, "
                                    "loop:FILE (a file played over and over), rtsp/http/udp URL, image, folder, "
                                    "glob, demo (several: one batch through the same models; unnamed ones are "
                                    "cam0, cam1, ...)",
                               factory=list, metavar="[NAME=]SPEC", split=False)
    sources: list[dict] = option(help="YAML: a list of {id, uri, realtime, stall_timeout_s}, one per source",
                                 factory=list, cli=False)
    source_id: str | None = option(None, "name of the stream in topics and files (one source; default from the "
                                         "source)")
    realtime: bool = option(False, "pace a file at its own frame rate (live policy: newest frame wins)")
    stall_timeout_s: float = option(5.0, "seconds without frames before a live source is reopened",
                                    flag="stall-timeout")
    max_frames: int | None = option(None, "stop after this many frames (of each source)")
    batch_timeout_s: float = option(0.01, "with several sources: how long a step waits for the others after the "
                                          "first frame arrived (a late source's slot stays empty)",
                                    flag="batch-timeout")
    control: str | None = option(None, "serve add/remove/list of sources on this ZeroMQ endpoint while running, "
                                       "e.g. tcp://127.0.0.1:5560 (see `sapiens2-stream control`); the run then "
                                       "waits for new sources when all have ended, until SIGINT/SIGTERM")
    # models
    tasks: list[str] = option(help=f"comma list of {','.join(TASKS)}",
                              factory=lambda: [name for name, spec in TASKS.items() if spec.default])
    model_size: str = option("0.4b", "Sapiens2 size of the hub checkpoints", choices=["0.4b", "0.8b", "1b", "5b"])
    checkpoints: dict[str, str] = option(help="checkpoint folder, .safetensors file or hub id for a task "
                                              "(repeatable)", flag="checkpoint", parse=parse_checkpoint,
                                         metavar="TASK=SOURCE", factory=dict)
    fallback_tiny: bool = option(False, "when weights cannot be had, run tiny RANDOM-weight checkpoints "
                                        "(outputs meaningless)")
    device: str = option("auto", "auto, cpu, cuda, cuda:N")
    dtype: str = option("auto", "compute precision (auto: bfloat16 on CUDA, float32 on the CPU)",
                        choices=["auto", "float32", "bfloat16", "float16"])
    pose_input: list[int] = option(help="pose input HxW (multiple of 16)", parse=parse_size, metavar="HxW",
                                   factory=lambda: [1024, 768])
    dense_input: list[int] = option(help="seg/matting/normal/pointmap input HxW", parse=parse_size, metavar="HxW",
                                    factory=lambda: [1024, 768])
    flip_test: bool = option(False, "average with mirrored crops (2x pose cost)")
    # GPU fast paths (stages.sapiens2.fastpath): each checked against eager at warm-up, off if it disagrees
    attention: str = option("auto", "SDPA kernels for attention (CUDA-only choices fall back to auto elsewhere)",
                            choices=list(ATTENTION_NAMES))
    channels_last: bool | None = option(None, "decode heads in channels_last memory format (auto: off)",
                                        parse=parse_auto_bool, metavar="{auto,on,off}")
    compile: str = option("off", "torch.compile the models in the background (the run starts eager, each shape "
                                 "switches when compiled; kept across runs in the cache folder)",
                          choices=list(COMPILE_MODES))
    cuda_graphs: str = option("auto", "replay each stage's forward as a CUDA graph per input shape (auto: on for "
                                      "CUDA)", choices=list(CUDA_GRAPHS))
    pose_buckets: bool = option(True, "pad the person batch to 1/2/4/8/16 (--no-pose-buckets: exactly the "
                                      "person count)")
    pinned_memory: bool = option(True, "copy frames and results through page-locked buffers (--no-pinned-memory: "
                                       "pageable, blocking)")
    # detector
    detector: str = option("yolo", "person detector (full-frame: the whole frame is one person)",
                           choices=["yolo", "full-frame"])
    detector_model: str = option("yolo11n.pt", "YOLO weights (.pt) or architecture (.yaml, random weights)")
    trust_detector_model: bool = option(False, "load a .pt detector unchecked (a .pt is a pickle that can run "
                                               "code; without this only layers, tensors and plain values load)")
    det_conf: float = option(0.25, "detector confidence threshold, 0..1")
    det_iou: float = option(0.7, "detector NMS IoU threshold, 0..1")
    max_persons: int = option(8, "most persons per frame (highest scores)")
    det_imgsz: int = option(640, "detector input size in pixels (multiple of 32, at most 4096)")
    track: bool = option(False, "stable person ids (Ultralytics ByteTrack)")
    detect_every: int = option(1, "run the detector every N frames, carry boxes from the keypoints in between")
    # keypoints
    kpt_threshold: float = option(0.3, "keypoint score below which a joint is not drawn or used for boxes")
    smooth: bool = option(False, "One-Euro smoothing per track id")
    smooth_min_cutoff: float = option(1.0, "One-Euro minimum cutoff (Hz)")
    smooth_beta: float = option(0.05, "One-Euro speed coefficient of the 2D keypoints (Hz per pixel/s)")
    smooth_beta3d: float = option(15.0, "One-Euro speed coefficient of the 3D keypoints (Hz per unit/s of the map)")
    keypoints3d: bool = option(False, "3D keypoints: each person's keypoints sampled from the pointmap (adds the "
                                      "pointmap task; needs pose)")
    keypoints3d_window: int = option(1, "3D sample per keypoint: 1 = bilinear at the keypoint; an odd N = median "
                                        "of the valid pixels in the NxN window around it", metavar="N")
    pointmap_every: int = option(1, "run the pointmap every N frames; the frames between sample the last map",
                                 metavar="N")
    # outputs
    record: str | None = option(None, "write the annotated video here (.mp4, .mkv, .mov)")
    record_fragment_s: float = option(1.0, "a keyframe every 2x this many seconds of media (for seeking; at most "
                                           "60); a kill or a full disk loses at most the frame being written of an "
                                           ".mp4/.mov, 0.1 s of an .mkv (shorter values also shorten .mkv clusters)")
    record_codec: str = option("libx264", "recording encoder; *_nvenc use the GPU's encoder and fall back to "
                                          "libx264, then mpeg4", choices=list(RECORD_CODECS))
    save_keypoints: str | None = option(None, "write one JSON line per frame here (.jsonl)")
    publish: str | None = option(None, "ZeroMQ endpoint to bind and publish on, e.g. tcp://127.0.0.1:5555")
    publish_connect: str | None = option(None, "publish by connecting to a broker's XSUB endpoint instead, e.g. "
                                               "tcp://broker:5556")
    jpeg_quality: int = option(80, "JPEG quality of published frames, 1..100")
    gpu_jpeg: bool | None = option(None, "JPEG-encode published frames on the GPU (nvJPEG; auto: when the run "
                                         "uses CUDA)", parse=parse_auto_bool, metavar="{auto,on,off}")
    publish_raw_frames: bool = option(False, "publish frames as decoded, without the pipeline's overlays (the "
                                             "browser viewer then draws its layers itself, each one toggleable)")
    curve_dir: str | None = option(None, "CURVE keys folder from `sapiens2-stream keys` (encrypt + authenticate)")
    curve_client: str = option("pipeline", "with --publish-connect and --curve-dir: the client key name this "
                                           "pipeline uses towards the broker")
    show: bool = option(False, "preview window")
    view: str | None = option(None, "serve a live web view on HOST:PORT (e.g. 127.0.0.1:8080), no other process "
                                    "needed; it stays up after the sources end, until Ctrl-C")
    view_token: str | None = option(None, "require this token (?token=...) for the web view and its stream")
    metrics: str | None = option(None, "serve Prometheus /metrics, /healthz and /readyz on HOST:PORT "
                                       "(e.g. 127.0.0.1:9108)")
    annotate: list[str] = option(help="comma list of the layers drawn on recorded/published frames, bottom-up, "
                                      f"from {','.join(annotation_layers())} (side3d: the 3D inset)",
                                 factory=lambda: list(annotation_layers()))
    matte_mode: str = option("composite", "how the matte puts people on the background",
                             choices=["composite", "replace"])
    matte_background: str = option("0,177,64", "R,G,B colour or an image file behind the person (with matting; an "
                                   "image covers the frame, its aspect kept: cropped, never stretched)")
    progress: bool = option(True, "progress bar for files, status line for live sources")
    log_level: str = option("info", "log level", choices=["debug", "info", "warning", "error"])

    def validate(self) -> RunConfig:
        """Every value checked on its own and against the others; ConfigError names the key."""
        self.dtype = DTYPE_ALIASES.get(self.dtype, self.dtype)
        bad = [t for t in self.tasks if t not in TASKS]
        if bad or not self.tasks:
            raise ConfigError(f"tasks: unknown {bad or 'empty list'}; choose from {', '.join(TASKS)}")
        for key in ("pose_input", "dense_input"):
            value = getattr(self, key)
            if len(value) != 2 or any(v <= 0 or v % 16 for v in value):
                raise ConfigError(f"{key}: expected [height, width], positive multiples of 16, got {value}")
        for key, value in FIELDS.items():
            choices = value.metadata.get("choices")
            if choices and getattr(self, key) not in choices:
                raise ConfigError(f"{key}: {getattr(self, key)!r} is not one of {', '.join(choices)}")
        try:
            person = person_task(self.tasks)
        except ValueError as exc:
            raise ConfigError(f"tasks: {exc}") from None
        if self.keypoints3d:
            if person is None:
                people = " or ".join(name for name, spec in TASKS.items() if spec.per_person)
                raise ConfigError(f"keypoints3d: needs the {people} task (the 2D keypoints it lifts); add {people} "
                                  "to tasks")
            points = lift_task("points")
            if points not in self.tasks:
                self.tasks = [*self.tasks, points]
        if not (1 <= self.keypoints3d_window <= 31 and self.keypoints3d_window % 2):
            raise ConfigError(f"keypoints3d_window: must be an odd number within 1..31, got {self.keypoints3d_window}")
        for key, low in (("detect_every", 1), ("max_persons", 1), ("max_frames", 1), ("det_imgsz", 32),
                         ("pointmap_every", 1)):
            value = getattr(self, key)
            if value is not None and value < low:
                raise ConfigError(f"{key}: must be at least {low}, got {value}")
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            raise ConfigError(f"device: {self.device!r} is not a device; use auto, cpu, cuda or cuda:N")
        if self.det_imgsz % 32:
            raise ConfigError(f"det_imgsz: must be a multiple of 32, got {self.det_imgsz}")
        if self.det_imgsz > MAX_DET_IMGSZ:  # a typo's extra digit would ask the device for gigabytes
            raise ConfigError(f"det_imgsz: at most {MAX_DET_IMGSZ}, got {self.det_imgsz}")
        for key in ("det_conf", "det_iou", "kpt_threshold"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ConfigError(f"{key}: must be within 0..1, got {getattr(self, key)}")
        for f in dataclasses.fields(self):  # NaN passes every comparison below; Infinity is no setting
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{f.name}: must be a finite number, got {value}")
        for key in ("stall_timeout_s", "smooth_min_cutoff", "record_fragment_s", "batch_timeout_s"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"{key}: must be positive, got {getattr(self, key)}")
        if self.record_fragment_s > MAX_FRAGMENT_S:
            raise ConfigError(f"record_fragment_s: at most {MAX_FRAGMENT_S:g} (a keyframe every "
                              f"{2 * MAX_FRAGMENT_S:g} s), got {self.record_fragment_s:g}")
        for key in ("smooth_beta", "smooth_beta3d"):
            if getattr(self, key) < 0:
                raise ConfigError(f"{key}: must be at least 0, got {getattr(self, key)}")
        if not 1 <= self.jpeg_quality <= 100:
            raise ConfigError(f"jpeg_quality: must be within 1..100, got {self.jpeg_quality}")
        unknown_ckpt = [t for t in self.checkpoints if t not in TASKS]
        if unknown_ckpt:
            raise ConfigError(f"checkpoints: unknown task {unknown_ckpt[0]!r}; choose from {', '.join(TASKS)}")
        unknown_layers = [a for a in self.annotate if a not in annotation_layers()]
        if unknown_layers:
            raise ConfigError(f"annotate: unknown layer {unknown_layers[0]!r}; choose from "
                              f"{', '.join(annotation_layers())}")
        self.validate_mocap(self.tasks)
        self.source_specs()  # names, duplicates, unknown keys
        if self.source_id is not None:
            try:
                check_source_id(self.source_id)
            except ValueError as exc:
                raise ConfigError(f"source_id: {exc}") from None
        for key in ("view", "metrics"):
            value = getattr(self, key)
            if value is not None:
                host, sep, port = value.rpartition(":")
                if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
                    raise ConfigError(f"{key}: {value!r} is not HOST:PORT; e.g. 127.0.0.1:8080")
        if self.publish and self.publish_connect:
            raise ConfigError("publish and publish_connect: choose one (bind an endpoint, or connect to a broker)")
        for key, bind in (("publish", True), ("publish_connect", False), ("control", True)):
            if getattr(self, key):
                try:
                    check_endpoint(getattr(self, key), bind=bind)
                except ValueError as exc:
                    raise ConfigError(f"{key}: {exc}") from None
        return self


    def source_specs(self) -> list[SourceSpec]:
        """Every source of the run, named (pipeline.cli.sourcespecs.name_sources)."""
        return name_sources(self.sources, self.source, self.source_id)


# the run's own keys first, then the motion-capture ones (a dataclass lists its base's fields first)
FIELDS = {f.name: f for f in sorted(dataclasses.fields(RunConfig), key=lambda f: f.name in MocapFields.__annotations__)}
HINTS = typing.get_type_hints(RunConfig)


def flag_of(key: str) -> str:
    """The command-line flag of a config key (``save_keypoints`` -> ``--save-keypoints``)."""
    return "--" + (FIELDS[key].metadata.get("flag") or key.replace("_", "-"))


def _check_type(key: str, value: Any) -> Any:
    """Value converted to the field's type, or ConfigError naming the key."""
    hint = HINTS[key]
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
        parse = FIELDS[key].metadata.get("parse")
        if isinstance(value, str) and parse is not None and typing.get_args(base)[0] is int:  # 1024x768, as the flag
            try:
                value = parse(value)
            except ValueError as exc:
                raise ConfigError(f"{key}: {exc}") from None
        if isinstance(value, str):
            split = FIELDS[key].metadata.get("split", True)
            value = [v.strip() for v in value.split(",") if v.strip()] if split else [value]
        item = typing.get_origin(typing.get_args(base)[0]) or typing.get_args(base)[0]
        if item is dict:  # the YAML sources: its entries are checked one by one, by name (sourcespecs)
            if isinstance(value, list) and not value:
                raise ConfigError(f"{key}: the list is empty; give at least one {{id, uri}} entry or leave the key out")
            ok = isinstance(value, list)
        else:
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
            updates[key] = _check_type(key, value)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return dataclasses.replace(cfg, **updates)


def load_config(path: str | Path | None, overrides: dict[str, Any] | None = None, *,
                overrides_from: str = "command line") -> RunConfig:
    """Defaults <- YAML file <- overrides (CLI flags), validated.

    An error names where the offending value came from: the file, the flag (``--max-frames``), or,
    for overrides that are not flags (a fleet file's ``pipeline:``), ``overrides_from``."""
    cfg = RunConfig()
    origins: dict[str, str] = {}
    if path is not None:
        path = Path(path)
        if path.is_dir():
            raise ConfigError(f"{path}: is a folder; --config takes a YAML file (e.g. configs/demo.yaml)")
        if not path.is_file():
            raise ConfigError(f"{path}: config file not found")
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: not a UTF-8 text file (byte {exc.start}); save the YAML as UTF-8") from None
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read it ({exc.strerror or exc})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a mapping of keys to values")
        cfg = merge(cfg, data, str(path))
        origins.update(dict.fromkeys(data, str(path)))
    if overrides:
        cfg = merge(cfg, overrides, overrides_from)
        origins.update(dict.fromkeys(overrides, overrides_from))
    try:
        return cfg.validate()
    except ConfigError as exc:
        raise ConfigError(_blame(str(exc), origins, path, overrides_from)) from None


def blame_flags(message: str, flags: dict[str, Any], path: str | Path | None = None) -> str:
    """A check's ``KEY: problem`` as ``--flag: problem`` when KEY was given as a flag, else prefixed
    by the config file ``path`` that set it (its keys keep their names: that is what the file says)."""
    return _blame(message, dict.fromkeys(flags, "command line"), None if path is None else Path(path),
                  "command line")


def _blame(message: str, origins: dict[str, str], path: Path | None, overrides_from: str) -> str:
    """``KEY: problem`` with where KEY was set: its flag, its file, or (a default, or several keys)
    the file if there is one. Messages that already name their origin (``--source 'x'``,
    ``sources[1]``) are left as they are, prefixed by the file for a ``sources:`` entry."""
    key = message.split(":", 1)[0]
    if message.startswith("--"):
        return message
    if key.startswith("sources[") and path is not None:
        return f"{path}: {message}"
    origin = origins.get(key)
    if origin == "command line":
        return f"{flag_of(key)}:{message.split(':', 1)[1]}"
    if origin is not None:
        return f"{origin}: {message}"
    return f"{path}: {message}" if path is not None else message
