"""What can be known wrong about a run before anything loads: values, output paths, files, keys.

``preflight`` raises ConfigError (one line) for the first problem it finds. It imports neither torch
nor the rest of the pipeline (the detector check and OpenCV only where a value needs them), so the
command line runs it first and refuses bad input in about a second instead of after the imports.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from sapiens2_client.display import no_display
from sapiens2_client.jsonl import JsonlError, LineWriter
from sapiens2_client.paths import unwritable
from sapiens2_client.video import RECORD_SUFFIXES

from pipeline.cli.config import ConfigError, RunConfig, flag_of
from pipeline.cli.sourcespecs import SourceSpec, missing_file
from stages.sapiens2.checkpoint_source import is_hub_id
from stages.tasks import TASKS, by_architecture, person_task

if TYPE_CHECKING:
    from stages.mocap.camera import Rig

# what Ultralytics loads as a detector (weights, its exports, or an architecture with random weights)
DETECTOR_SUFFIXES = (".pt", ".yaml", ".yml", ".onnx", ".torchscript", ".engine", ".mlpackage", ".tflite")


def _writable_target(path: Path) -> Path | None:
    """The existing file, or the nearest existing folder it would be created in."""
    if path.exists():
        return path
    return next((p for p in path.parents if p.exists()), None)


def check_output_path(path: str, what: str, suffixes: tuple[str, ...] | None = None) -> None:
    """ConfigError when ``path`` cannot be written (bad suffix, not a folder on the way, read-only), naming
    the flag of ``what`` (a config key: ``save_keypoints`` is ``--save-keypoints``)."""
    flag = flag_of(what)
    p = Path(path)
    if suffixes is not None and p.suffix.lower() not in suffixes:
        raise ConfigError(f"{flag}: {path!r} must end in one of {', '.join(suffixes)}")
    if p.is_dir():
        raise ConfigError(f"{flag}: {path!r} is a folder; name a file")
    target = _writable_target(p)
    if target is None or (target != p and not target.is_dir()):
        raise ConfigError(f"{flag}: cannot create {path!r} ({target} is not a folder)")
    if not os.access(target, os.W_OK) or _read_only_mount(target):
        raise ConfigError(f"{flag}: cannot create {path!r} ({target} is not writable); pick another path")
    why = unwritable(p)  # a probe file: finds what os.access says yes to (/proc, a folder refusing even root)
    if why is not None:
        raise ConfigError(f"{flag}: cannot create {path!r} ({why}); pick another path")


def _read_only_mount(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def expand(path: str, source_id: str) -> str:
    """An output path for one source: ``{source}`` becomes its id."""
    return path.replace("{source}", source_id)


@dataclass(frozen=True)
class Checked:
    """A run's input, checked once before anything heavy is imported: its sources and (--triangulate)
    its calibration, read and matched to the sources' names."""

    specs: list[SourceSpec]
    rig: Rig | None = None


def check_run(cfg: RunConfig) -> Checked:
    """The one validation pass of a run before models load (the config's values were checked when it was
    made, ``RunConfig.validate``): ConfigError, one line, on the first thing wrong."""
    specs = cfg.source_specs()
    preflight(cfg, specs)
    return Checked(specs, check_rig(cfg, specs))


def preflight(cfg: RunConfig, specs: list[SourceSpec] | None = None, *, check_sources: bool = True) -> None:
    """Everything that can be known wrong before a model loads; ConfigError (one line) if so.
    ``check_sources=False``: the specs only name the outputs (batch checks its inputs itself)."""
    specs = specs if specs is not None else cfg.source_specs()
    several = len(specs) > 1 or cfg.control is not None
    ids = [s.id or "src" for s in specs]
    missing = missing_file(specs[0].uri) if check_sources and len(specs) == 1 else None  # several: the others go on
    if missing is not None:
        raise ConfigError(f"source {missing}")
    for key in ("record", "save_keypoints"):
        path = getattr(cfg, key)
        unknown = [p for p in re.findall(r"\{[^{}]*\}", path or "") if p != "{source}"]
        if unknown:
            raise ConfigError(f"{flag_of(key)}: {unknown[0]} in {path!r} is not a placeholder; the only one is "
                              "{source} (each source's id)")
    if cfg.record:
        if several and "{source}" not in cfg.record:
            record = Path(cfg.record)
            example = record.with_name(record.stem + "_{source}" + record.suffix)
            raise ConfigError(f"--record: with several sources each needs a file: put {{source}} in the path, e.g. "
                              f"{example}")
        for sid in ids:
            check_output_path(expand(cfg.record, sid), "record", RECORD_SUFFIXES)
    if cfg.save_keypoints:
        for sid in ids:
            check_output_path(expand(cfg.save_keypoints, sid), "save_keypoints")
            try:
                LineWriter(expand(cfg.save_keypoints, sid)).check()
            except JsonlError as exc:
                raise ConfigError(str(exc)) from None
    _check_outputs_collide(cfg, specs, ids)
    if cfg.show and no_display() is not None:
        raise ConfigError(f"show: {no_display()}; drop --show, or watch in a browser with --view 127.0.0.1:8080")
    matte_background(cfg.matte_background)  # checked even when unused: a typo is a typo
    listeners = _listeners(cfg)
    for (what, port), (other, other_port) in itertools.combinations(listeners.items(), 2):
        if port == other_port:
            raise ConfigError(f"{what} and {other} both listen on port {port}; give each its own port")
    for what, port in listeners.items():
        if what != "publish":  # the publisher binds before the models load, with its own error
            check_port_free(_host(getattr(cfg, what)), port, what)
    if cfg.detector == "yolo" and Path(cfg.detector_model).suffix.lower() not in DETECTOR_SUFFIXES:
        raise ConfigError(f"detector_model: {cfg.detector_model!r} is not a model Ultralytics loads; use a "
                          f"{', '.join(DETECTOR_SUFFIXES)} file")
    persons = person_task(cfg.tasks) is not None  # the detector runs for a task on the person crops
    if cfg.detector == "yolo" and persons and cfg.detector_model != RunConfig.detector_model:
        from stages.detect import DetectorError
        from stages.detect.checkpoint import (
            check_detector_model,  # torch: only for a model of one's own
        )

        try:
            check_detector_model(cfg.detector_model, cfg.trust_detector_model)
        except DetectorError as exc:
            raise ConfigError(f"detector_model: {exc}") from None
    for task, source in cfg.checkpoints.items():
        if not is_hub_id(source) and not Path(source).exists():
            raise ConfigError(f"checkpoints: {task}={source}: no such checkpoint file or folder, and not a hub id "
                              "(owner/name)")
        made_for = _checkpoint_task(Path(source))
        if made_for is not None and made_for != task:
            raise ConfigError(f"checkpoints: {task}={source} is a {made_for} checkpoint (its config.json says so), "
                              f"not {task}; name a {task} checkpoint")
    if cfg.curve_dir and not Path(cfg.curve_dir).is_dir():
        raise ConfigError(f"curve_dir: {cfg.curve_dir!r} is not a folder; create keys with "
                          f"`sapiens2-stream keys {cfg.curve_dir}`")


def _checkpoint_task(folder: Path) -> str | None:
    """The task a checkpoint folder's config.json names, when it has a readable one (else None: the
    loader says what is wrong with it)."""
    try:
        archs = json.loads((folder / "config.json").read_text()).get("architectures") or [None]
    except (OSError, ValueError, AttributeError):
        return None
    spec = by_architecture(archs[0]) if isinstance(archs, list) and isinstance(archs[0], str) else None
    return spec.name if spec else None


def _check_outputs_collide(cfg: RunConfig, specs: list[SourceSpec], ids: list[str]) -> None:
    """ConfigError when an output would be written over an input file, or the keypoints get a video's
    name (then they could also be the recording's)."""
    if cfg.save_keypoints and Path(cfg.save_keypoints).suffix.lower() in RECORD_SUFFIXES:
        raise ConfigError(f"--save-keypoints: {cfg.save_keypoints!r} is a video name; keypoints are JSON lines: "
                          "name a .jsonl file (--record takes the video)")
    outputs = [(key, Path(expand(getattr(cfg, key), sid))) for key in ("record", "save_keypoints")
               if getattr(cfg, key) for sid in ids]
    inputs = [Path(spec.uri.removeprefix("loop:")) for spec in specs]
    for key, path in outputs:
        source = next((p for p in inputs if p.is_file() and path.exists() and os.path.samefile(path, p)), None)
        if source is not None:
            raise ConfigError(f"{flag_of(key)}: {str(path)!r} is the source file {str(source)!r}; writing it would "
                              "destroy the input: choose another path")


def _host(address: str) -> str:
    return address.removeprefix("tcp://").rpartition(":")[0]


def _listeners(cfg: RunConfig) -> dict[str, int]:
    """The TCP ports this run will listen on, by setting (port 0 and non-TCP endpoints: none)."""
    ports = {}
    for what in ("publish", "control", "view", "metrics"):
        address = getattr(cfg, what)
        if not address or (what in ("publish", "control") and not address.startswith("tcp://")):
            continue
        port = address.rpartition(":")[2]
        if port.isdigit() and int(port) != 0:
            ports[what] = int(port)
    return ports


def unused_settings(cfg: RunConfig) -> list[str]:
    """One line for each setting given that this run will not use (warnings, not errors)."""
    notes = []
    if cfg.detector_model != RunConfig.detector_model and cfg.detector != "yolo":
        notes.append(f"--detector-model is not used with --detector {cfg.detector}")
    for name, spec in TASKS.items():
        for key in spec.settings:
            if getattr(cfg, key) != getattr(RunConfig, key) and name not in cfg.tasks:
                notes.append(f"{flag_of(key)} is not used without the {name} task (--tasks ... {name})")
    for key, flag in (("pointmap_every", "--pointmap-every"), ("keypoints3d_window", "--keypoints3d-window")):
        if getattr(cfg, key) != getattr(RunConfig, key) and not cfg.keypoints3d:
            notes.append(f"{flag} is used only with --keypoints3d")
    if cfg.smooth and cfg.detector == "yolo" and not cfg.track:
        notes.append("--smooth follows track ids: with the yolo detector add --track (untracked persons pass "
                     "through unsmoothed)")
    if cfg.smooth_beta3d != RunConfig.smooth_beta3d and not (cfg.smooth and cfg.keypoints3d):
        notes.append("--smooth-beta3d is used only with --smooth and --keypoints3d")
    for name, spec in TASKS.items():
        if spec.unused and name in cfg.tasks and not (spec.used_by and getattr(cfg, spec.used_by)):
            notes.append(spec.unused)
    if cfg.curve_client != RunConfig.curve_client and not (cfg.publish_connect and cfg.curve_dir):
        notes.append("--curve-client is used only with --publish-connect and --curve-dir")
    return notes


def check_port_free(host: str, port: int, what: str) -> None:
    """ConfigError when HOST:PORT cannot be bound now (taken, or not an address of this machine), so
    a server that starts after the models loaded does not fail then. Port 0 (any free one) passes."""
    if port == 0:
        return
    host = host.strip("[]")
    if host in ("*", ""):
        host = "0.0.0.0"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: TIME_WAIT is no conflict
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ConfigError(f"{what}: cannot bind {host}:{port} ({exc.strerror or exc}); choose another port") \
                from None


def matte_background(spec: str) -> tuple[int, int, int] | np.ndarray:
    """"R,G,B" -> a colour; anything else is an image file (read once, RGB)."""
    parts = spec.split(",")
    if len(parts) == 3 and all(p.strip().isdigit() for p in parts):
        r, g, b = (int(p) for p in parts)
        if max(r, g, b) > 255:
            raise ConfigError(f"matte_background: colour values must be 0..255, got {spec!r}")
        return r, g, b
    image = None
    if Path(spec).is_file():
        import cv2

        image = cv2.imread(spec, cv2.IMREAD_COLOR)
    if image is None:
        raise ConfigError(f"matte_background: {spec!r} is neither R,G,B nor a readable image file")
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


def check_rig(cfg: RunConfig, specs: list[SourceSpec]) -> Rig | None:
    """The rig of a --triangulate run, read and matched to the sources; ConfigError (one line) when the
    file is missing or bad, or a source has no camera of its name. None without --triangulate."""
    if not cfg.triangulate or not cfg.calibration:
        return None
    from stages.mocap.camera import CalibrationError, read_rig  # (numpy and OpenCV: only for --triangulate)

    if cfg.save_world:
        check_output_path(cfg.save_world, "save_world")
    if cfg.export_trc:
        check_output_path(cfg.export_trc.replace("{person}", "0"), "export_trc", (".trc",))
    try:
        rig = read_rig(cfg.calibration)
        rig.check_sources([spec.id or "src" for spec in specs], cfg.calibration)
    except CalibrationError as exc:
        raise ConfigError(f"calibration: {exc}") from None
    if len(specs) < 2:
        raise ConfigError("triangulate: needs at least two sources, one per calibrated camera (--source "
                          f"NAME=SPEC with the names {', '.join(rig.names)})")
    return rig
