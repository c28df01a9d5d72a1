"""Motion-capture commands: ``calibrate`` (pipeline.mocap.calibrate), ``calibrate board``
(pipeline.mocap.board), ``demo-rig`` (pipeline.mocap.demo_rig), ``triangulate`` (world
skeletons from the keypoint files of a recorded run, through the live run's world step) and
``export-world`` (a world JSONL as TRC, CSV or NumPy).

``triangulate`` reads one ``--save-keypoints`` file per camera (``NAME=FILE``, or one file whose
lines carry ``source``) and forms steps as the live run does: each step takes the next record of
every camera whose clock is within ``--window-ms`` of the earliest waiting one. The clock is the
media time (pts, from each file's first frame: recordings of files) or, with ``--clock capture``,
the capture time (the keypoint files of live cameras, whose pts have unrelated origins).
"""

from __future__ import annotations

import argparse
import logging
import math
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from stages.errors import ConfigError
from stages.types import Detections, Keypoints

from .options import MocapFields

log = logging.getLogger(__name__)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register calibrate, calibrate-board, demo-rig, triangulate and export-world."""
    from pipeline.mocap.board import add_board_parser
    from .calibrate import add_calibrate_parser
    from pipeline.mocap.demo_rig import add_demo_parser

    add_calibrate_parser(subparsers)
    add_board_parser(subparsers)
    add_demo_parser(subparsers)
    t = subparsers.add_parser("triangulate", help="world skeletons from the keypoint files of a recorded "
                                                  "multi-camera run (as the live --triangulate computes them)")
    t.add_argument("--keypoints", action="append", required=True, metavar="NAME=FILE",
                   help="a camera's keypoint JSONL (--save-keypoints), named as in the calibration; repeatable; or "
                        "one FILE whose lines carry their source")
    t.add_argument("--calibration", required=True, help="the rig's calibration file (TOML)")
    t.add_argument("--save-world", help="write the world steps here (.jsonl)")
    t.add_argument("--export-trc", help="write TRC here (one file per person: {person} in the name, or _P<id>)")
    t.add_argument("--csv", help="write a CSV here (one row per step and person)")
    t.add_argument("--npz", help="write the NumPy arrays here (.npz)")
    t.add_argument("--clock", choices=["media", "capture"], default="media",
                   help="which clock lines up the cameras: media (pts; recorded files) or capture (live cameras)")
    t.add_argument("--rescale-calibration", action="store_true",
                   help="scale a camera's calibration to its keypoint file's image size when that is a resize of "
                        "the calibrated size (the same aspect); without it, such a camera is refused")
    _add_world_flags(t)
    t.set_defaults(func=cmd_triangulate)

    e = subparsers.add_parser("export-world", help="a world JSONL (--save-world) as TRC, CSV or NumPy")
    e.add_argument("world", help="the world JSONL file")
    e.add_argument("--trc", help="TRC path (one file per person: {person} in the name, or _P<id>)")
    e.add_argument("--csv", help="CSV path")
    e.add_argument("--npz", help="NumPy .npz path")
    e.add_argument("--trc-up", choices=["y", "z"], default="y", help="TRC up axis (y: OpenSim's, Z-up turned Y-up)")
    e.add_argument("--rate", type=float, help="TRC data rate in Hz (default: from the steps' times)")
    e.set_defaults(func=cmd_export_world)


def expand_shorthand(argv: list[str]) -> list[str]:
    """``calibrate board ...`` is ``calibrate-board ...``."""
    return ["calibrate-board", *argv[2:]] if argv[:2] == ["calibrate", "board"] else argv


def _add_world_flags(p: argparse.ArgumentParser) -> None:
    """The live run's fusion settings, with its defaults (pipeline.mocap.options)."""
    defaults = MocapFields()
    p.add_argument("--kpt-threshold", type=float, default=0.3, help="keypoint score a view needs (default: 0.3)")
    p.add_argument("--window-ms", type=float, default=defaults.world_window_ms,
                   help=f"cameras' frames within this of each other are one step (default: {defaults.world_window_ms:g})")
    p.add_argument("--max-error-px", type=float, default=defaults.world_max_error_px,
                   help=f"reprojection error over which a view disagrees (default: {defaults.world_max_error_px:g})")
    p.add_argument("--max-epipolar-px", type=float, default=defaults.world_max_epipolar_px,
                   help=f"epipolar distance that refuses a pairing (default: {defaults.world_max_epipolar_px:g})")
    p.add_argument("--min-views", type=int, default=defaults.world_min_views, help="views a point needs (default: 2)")
    p.add_argument("--min-angle-deg", type=float, default=defaults.world_min_angle_deg,
                   help=f"two of a point's views must see it from directions this far apart (default: "
                        f"{defaults.world_min_angle_deg:g})")
    p.add_argument("--max-uncertainty-mm", type=float, default=defaults.world_max_uncertainty_mm,
                   help=f"a point is placed only when the keypoints' noise leaves it within this error (RMS, mm) "
                        f"through its views' geometry; 1e9: no bound (default: {defaults.world_max_uncertainty_mm:g})")
    p.add_argument("--trc-up", choices=["y", "z"], default="y", help="TRC up axis (y: OpenSim's, Z-up turned Y-up)")


def _camera_files(specs: list[str]) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[str]]]:
    """Each camera's frame records, from NAME=FILE specs or one file with ``source`` on its lines,
    and the files each camera's records came from."""
    records: dict[str, list[dict[str, Any]]] = {}
    files: dict[str, list[str]] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            name, path = "", spec
        for line in _lines(Path(path)):
            if "frame" not in line:
                continue  # event lines (stalled, reconnecting, ...)
            camera = name or line.get("source")
            if not isinstance(camera, str):
                raise ConfigError(f"--keypoints {path}: its lines carry no source; name the camera: NAME={path}")
            records.setdefault(camera, []).append(line)
            if path not in files.setdefault(camera, []):
                files[camera].append(path)
    return records, files


def _image_sizes(records: dict[str, list[dict[str, Any]]]) -> dict[str, tuple[int, int]]:
    """Each camera's image size (width, height) from its records; ConfigError when they hold two."""
    sizes = {}
    for camera, lines in records.items():
        seen = {(line.get("width"), line.get("height")) for line in lines} - {(None, None)}
        if len(seen) > 1:
            listed = ", ".join(f"{w}x{h}" for w, h in sorted(seen, key=str))
            raise ConfigError(f"--keypoints {camera}: its records are of images of {len(seen)} sizes ({listed}); "
                              "one calibration fits one size: split the file where the size changes")
        for width, height in seen:
            if not (isinstance(width, int) and isinstance(height, int) and width > 0 and height > 0):
                raise ConfigError(f"--keypoints {camera}: its records give the image size {width!r}x{height!r}, "
                                  "not a width and height in pixels")
            sizes[camera] = (width, height)
    return sizes


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    from .world import read_lines

    if not path.is_file():
        raise ConfigError(f"--keypoints {path}: no such file")
    try:
        yield from read_lines(path, "a keypoint file (--save-keypoints)")
    except ValueError as exc:
        raise ConfigError(f"--keypoints {exc}") from None


def _clock(record: dict[str, Any], clock: str) -> float:
    if clock == "media" and record.get("pts") is not None and record.get("time_base"):
        return float(record["pts"] * Fraction(record["time_base"]))
    return int(record.get("capture_ns", 0)) / 1e9


def _view(record: dict[str, Any], clock_s: float, k: int):
    from stages.mocap.fuse import CameraView

    persons = record.get("persons") or []
    points = [p.get("keypoints") or [[0.0, 0.0, 0.0]] * k for p in persons]
    array = np.array([[[np.nan if v is None else v for v in point] for point in pts] for pts in points],
                     np.float64).reshape(len(persons), k, 3)
    xy, scores = array[..., :2], np.nan_to_num(array[..., 2], nan=0.0)
    boxes = np.array([p.get("box") or [0, 0, 0, 0] for p in persons], np.float32).reshape(-1, 4)
    det = Detections(np.nan_to_num(boxes), np.array([p.get("score") or 0.0 for p in persons], np.float32),
                     np.array([p.get("id", -1) for p in persons], np.int64))
    return CameraView(int(record["frame"]), clock_s, int(record.get("capture_ns", 0)), det,
                      Keypoints(np.nan_to_num(xy), np.where(np.isfinite(xy).all(axis=-1), scores, 0.0)))


def steps_of(records: dict[str, list[dict[str, Any]]], clock: str, window_s: float, k: int) -> Iterator[dict]:
    """Steps as the live run forms them: the next record of each camera within the window of the
    earliest waiting one (see the module docstring)."""
    heads = {name: 0 for name in records}
    starts = {name: _clock(lines[0], clock) for name, lines in records.items() if lines}
    while True:
        waiting = {name: records[name][i] for name, i in heads.items() if i < len(records[name])}
        if not waiting:
            return
        clocks = {name: _clock(r, clock) - (starts[name] if clock == "media" else 0.0) for name, r in waiting.items()}
        first = min(clocks.values())
        step = {name: _view(waiting[name], clocks[name], k) for name in waiting if clocks[name] - first <= window_s}
        for name in step:
            heads[name] += 1
        yield step


def cmd_triangulate(args: argparse.Namespace) -> int:
    from pipeline.sinks.world import WorldWriter  # the live run's --save-world writer: one format
    from stages.mocap.camera import CalibrationError, read_rig
    from stages.mocap.fuse import WorldFuser

    from .export import write_csv, write_npz, write_trc
    from .setup import fusion_of, rig_for_frames

    if not (args.save_world or args.export_trc or args.csv or args.npz):
        raise ConfigError("triangulate: name an output: --save-world, --export-trc, --csv or --npz")
    try:
        rig = read_rig(args.calibration)
    except CalibrationError as exc:
        raise ConfigError(f"--calibration: {exc}") from None
    records, files = _camera_files(args.keypoints)
    try:
        rig.check_sources(records, args.calibration)
    except CalibrationError as exc:
        raise ConfigError(str(exc)) from None
    sizes = _image_sizes(records)
    for camera in [c for c in records if c not in sizes]:  # files of another tool, or of before it wrote sizes
        w, h = rig[camera].size
        log.warning("--keypoints %s: its records give no image size (width, height), so camera %r's calibration, "
                    "made at %dx%d, is used without checking that its keypoints are of images of that size",
                    ", ".join(files[camera]), camera, w, h)
    rig = rig_for_frames(rig, sizes, args.rescale_calibration, "its keypoint file's images", args.calibration)
    options = MocapFields(world_window_ms=args.window_ms, world_max_error_px=args.max_error_px,
                          world_max_epipolar_px=args.max_epipolar_px, world_min_views=args.min_views,
                          world_min_angle_deg=args.min_angle_deg, world_max_uncertainty_mm=args.max_uncertainty_mm)
    options.validate_mocap(["pose"])
    fuser = WorldFuser(rig, fusion_of(options, args.kpt_threshold, 1.0))
    k = next((len(p["keypoints"]) for lines in records.values() for r in lines for p in r.get("persons") or []
              if p.get("keypoints")), 308)
    world_path = Path(args.save_world) if args.save_world else Path(
        (args.export_trc or args.csv or args.npz) + ".world.jsonl.part")
    writer = WorldWriter(world_path)
    steps = persons = 0
    valid_share: list[float] = []
    try:
        for views in steps_of(records, args.clock, args.window_ms / 1000.0, k):
            world = fuser.step(views)
            writer.write_world(world)
            steps += 1
            persons += len(world)
            valid_share += world.valid.mean(axis=1).tolist()
    finally:
        writer.close()
    exports = []
    try:
        if steps:  # the world file exists from its first step
            if args.export_trc:
                exports.append(write_trc(world_path, args.export_trc, args.trc_up))
            if args.csv:
                exports.append(write_csv(world_path, args.csv))
            if args.npz:
                exports.append(write_npz(world_path, args.npz))
    finally:
        if not args.save_world:
            world_path.unlink(missing_ok=True)
    print(f"{steps} steps from {len(records)} cameras, {persons} world persons in all, "
          f"{percent(float(np.mean(valid_share)) if valid_share else 0.0)} of their keypoints triangulated")
    if args.save_world and steps:
        print(f"wrote {world_path} (world JSON Lines: {steps} steps)")
    if not steps:
        log.warning("no world step: the keypoint files hold no frame; nothing written")
    _report(exports)
    return 0


def percent(share: float) -> str:
    """``share`` (0..1) as a percentage that never rounds a shortfall up to 100% (99.75% is
    "99.7%") nor a few down to 0%."""
    text = f"{100 * share:.0f}%"
    if text == "100%" and share < 1:
        return f"{math.floor(1000 * share) / 10:.1f}%"
    if text == "0%" and share > 0:
        return f"{max(math.ceil(1000 * share) / 10, 0.1):.1f}%"
    return text


def _report(exports: list) -> None:
    """Each export's ``wrote`` lines (stdout), or its one warning when it holds no person."""
    for export in exports:
        warning = export.warning()
        if warning:
            log.warning("%s", warning)
        if export.paths:
            for line in export.wrote():
                print(line)


def cmd_export_world(args: argparse.Namespace) -> int:
    from .export import write_csv, write_npz, write_trc

    if not (args.trc or args.csv or args.npz):
        raise ConfigError("export-world: name an output: --trc, --csv or --npz")
    if not Path(args.world).is_file():
        raise ConfigError(f"export-world: {args.world}: no such file (a run's --save-world)")
    try:
        exports = []
        if args.trc:
            exports.append(write_trc(args.world, args.trc, args.trc_up, args.rate))
        if args.csv:
            exports.append(write_csv(args.world, args.csv))
        if args.npz:
            exports.append(write_npz(args.world, args.npz))
    except ValueError as exc:
        raise ConfigError(f"export-world: {exc}") from None
    _report(exports)
    return 0
