"""``sapiens2-stream calibrate``: a rig's calibration file from views of a ChArUco board.

    sapiens2-stream calibrate --source cam0=left.mp4 --source cam1=right.mp4 \\
        --board 5x7 --square 0.04 --marker 0.03 --out calib.toml

The sources (video files, image folders or globs, cameras) are read in lockstep: frame i of every
source is one simultaneous view. Each view used (every ``--every``-th, at most ``--max-views``)
is searched for the board; the cameras' intrinsics and poses are fitted (stages.mocap.charuco)
and written as one TOML file in Pose2Sim's and aniposelib's layout; ``--fisheye`` fits OpenCV's
fisheye model instead of the pinhole one. Live cameras are read until ``--max-views`` or Ctrl-C,
a view taken where the board stood still in each of them (``LiveViews``).
Every failure is one ``error: ...`` line and a non-zero exit.
``python -m pipeline.mocap.calibrate calibrate ...`` runs it standalone.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sapiens2_client.cli import OneLineParser, positive

from pipeline.cli.args import raise_terminated
from pipeline.cli.sourcespecs import SourceSpec, missing_file, name_sources
from stages.errors import ConfigError
from stages.mocap import DEFAULT_MIN_VIEWS

if TYPE_CHECKING:  # the handler imports them: building the command line loads neither OpenCV nor PyAV
    from stages.mocap.charuco import Board, Detection
    from stages.types import Frame

    from ..sources import Source

log = logging.getLogger(__name__)
ALL = "\0all"  # --fisheye alone: every camera
FRAME_TIMEOUT_S = 60.0  # a source that gives no frame for this long has failed (a file decodes far faster)
# Live cameras run unsynchronised, each with its own latency (their newest frames can be a few frames
# apart in time): a view is taken only when the board has stood still for STILL_S in every camera
# that sees it (no corner moved more than STILL_PX from one frame to the next), so that all of them
# show the same pose; and once per pose (some corner moved MOVED_PX since the last view taken, or a
# camera came to see the board or lost it).
STILL_PX = 2.0
STILL_S = 0.5
MOVED_PX = 25.0


def add_calibrate_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``calibrate`` subcommand (handler ``cmd_calibrate``)."""
    p = subparsers.add_parser("calibrate", help="calibrate cameras from views of a ChArUco board (writes a rig TOML)")
    p.add_argument("--source", action="append", required=True, metavar="NAME=SPEC",
                   help="a camera's recording or live source (video file, image folder or glob, webcam:N); "
                        "repeatable, one per camera, read in lockstep; NAME is the camera's name in the file")
    add_board_flags(p)
    p.add_argument("--out", default="calib.toml", help="the calibration file to write (default calib.toml)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.add_argument("--every", type=positive(int), default=1, help="use every Nth frame (default 1)")
    p.add_argument("--max-views", type=positive(int), help="stop after this many views (needed to end a live source "
                                                          "other than with Ctrl-C)")
    p.add_argument("--min-views", type=positive(int), default=DEFAULT_MIN_VIEWS,
                   help=f"views of the board each camera needs for its intrinsics (default {DEFAULT_MIN_VIEWS})")
    p.add_argument("--refine-intrinsics", action="store_true",
                   help="refine the intrinsics in the joint refinement too (default: fixed)")
    p.add_argument("--fit-k3", action="store_true",
                   help="fit the k3 distortion term too (wide-angle lenses; pinhole cameras: a fisheye has k1..k4)")
    p.add_argument("--fisheye", nargs="?", const=ALL, metavar="NAME[,NAME...]",
                   help="fit OpenCV's fisheye model (k1..k4) for every camera, or for the cameras named (lenses "
                        "of 120 degrees and more; show them the board near the image's edges and corners too)")
    p.add_argument("--intrinsics", metavar="FILE.toml",
                   help="take each camera's intrinsics from this rig file (ours, Pose2Sim's or aniposelib's) "
                        "and find only the extrinsics")
    p.set_defaults(func=cmd_calibrate)


def add_board_flags(p: argparse.ArgumentParser) -> None:
    """The flags that say which ChArUco board (``calibrate`` and ``calibrate board``; ``board_of``)."""
    p.add_argument("--board", required=True, metavar="COLSxROWS", help="the board's squares, e.g. 5x7")
    p.add_argument("--square", type=positive(float), required=True, help="side of a square, metres (measured)")
    p.add_argument("--marker", type=positive(float), required=True, help="side of a marker, metres (measured)")
    p.add_argument("--dictionary", default="DICT_4X4_50", metavar="DICT",
                   help="the board's ArUco dictionary, an OpenCV name (default DICT_4X4_50)")
    p.add_argument("--legacy-board", action="store_true",
                   help="the board was made by OpenCV before 4.6 (boards with an even number of rows differ)")


def board_of(args: argparse.Namespace) -> Board:
    """The board of ``add_board_flags``; ConfigError (one line) when they do not make one."""
    from stages.mocap.charuco import DICTIONARIES, Board, parse_squares

    if args.dictionary not in DICTIONARIES:
        raise ConfigError(f"--dictionary: {args.dictionary!r} is not one of OpenCV's ArUco dictionaries; use one of "
                          f"{', '.join(DICTIONARIES)}")
    return Board(*parse_squares(args.board), args.square, args.marker, args.dictionary, args.legacy_board)


def _checked(args: argparse.Namespace) -> tuple[Board, list[SourceSpec], Path, list[str]]:
    """Board, named sources, output path and fisheye cameras from the flags, before anything is opened."""
    from stages.mocap.camera import CalibrationError

    board = board_of(args)
    specs = name_sources([], args.source, None)
    if len(specs) < 2:
        raise ConfigError("calibrate needs at least two sources, one per camera (--source NAME=SPEC each)")
    for spec in specs:
        problem = missing_file(spec.uri)
        if problem:
            raise ConfigError(f"{spec.where}: {problem}")
    fisheye = _fisheye_cameras(args, [spec.id for spec in specs])
    out = Path(args.out)
    if out.exists() and not args.overwrite:
        raise CalibrationError(f"--out {out} exists; pass --overwrite to replace it, or write elsewhere")
    if not out.parent.is_dir():
        raise ConfigError(f"--out {out}: the folder {out.parent} does not exist")
    return board, specs, out, fisheye


def _fisheye_cameras(args: argparse.Namespace, names: list[str]) -> list[str]:
    if args.fisheye is None:
        return []
    if args.intrinsics:
        raise ConfigError("--fisheye with --intrinsics: the intrinsics file gives each camera's lens model; "
                          "drop --fisheye, or fit the intrinsics here")
    if args.fisheye == ALL:
        return names
    chosen = [name.strip() for name in args.fisheye.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in names]
    if unknown or not chosen:
        raise ConfigError(f"--fisheye: {unknown[0] if unknown else args.fisheye!r} is not a camera of this rig; "
                          f"name some of {', '.join(names)} (comma-separated), or give --fisheye alone for all")
    return chosen


def _next_frame(source: Source, name: str) -> Frame:
    """The next frame of ``source``; SourceEnded at its end, SourceError when it stalls."""
    from ..sources import SourceError

    deadline = time.monotonic() + FRAME_TIMEOUT_S
    while time.monotonic() < deadline:
        frame = source.read(timeout=0.5)
        if frame is not None:
            return frame
    raise SourceError(f"source {name!r} gave no frame for {FRAME_TIMEOUT_S:g} s")


def _shift_px(a: Detection | None, b: Detection) -> float:
    """The largest move of a corner both detections saw (inf when they share none)."""
    import numpy as np

    if a is None or not len(a) or not len(b):
        return float("inf")
    _, ia, ib = np.intersect1d(a.ids, b.ids, return_indices=True)
    return float(np.abs(a.corners[ia] - b.corners[ib]).max()) if len(ia) else float("inf")


class LiveViews:
    """Which frames of unsynchronised live cameras make views (the rule at STILL_PX, above)."""

    def __init__(self) -> None:
        self.previous: dict[str, Detection] = {}
        self.still_since: dict[str, float] = {}  # camera -> since when its board stood still (monotonic s)
        self.taken: dict[str, Detection] | None = None

    def take(self, now: dict[str, Detection], at_s: float) -> bool:
        """Whether the detections ``now`` (camera -> this frame's, read at ``at_s``) make a view."""
        from stages.mocap.charuco import MIN_CORNERS

        for name, det in now.items():
            if _shift_px(self.previous.get(name), det) > STILL_PX:  # moved, appeared, or not seen at all
                self.still_since[name] = at_s
        self.previous = now
        seen = {name for name, det in now.items() if len(det) >= MIN_CORNERS}
        if not seen or any(at_s - self.still_since[name] < STILL_S for name in seen):
            return False
        taken = self.taken
        if taken is not None and seen == {n for n, d in taken.items() if len(d) >= MIN_CORNERS} and \
                all(_shift_px(taken[name], now[name]) <= MOVED_PX for name in seen):
            return False  # the same pose as the last view
        self.taken = now
        return True


def collect(board: Board, sources: dict[str, Source], every: int, max_views: int | None) -> \
        tuple[dict[str, list[Detection]], dict[str, tuple[int, int]], list[int]]:
    """Detections by camera and view, the image sizes, and each view's frame number: frame i of
    every source is one view (live sources: a frame where the board stands still at a new pose,
    ``LiveViews``); stops when a source ends, at ``max_views``, or at Ctrl-C for live ones."""
    from stages.mocap.charuco import MIN_CORNERS, detect

    from ..sources import SourceEnded, SourceError

    detections: dict[str, list[Detection]] = {name: [] for name in sources}
    sizes = {name: (s.info.width, s.info.height) for name, s in sources.items()}
    frames: list[int] = []
    live = any(s.live for s in sources.values())
    if live:
        print("reading the cameras: hold the board still at each pose until a view is taken; Ctrl-C stops "
              "collecting and calibrates", file=sys.stderr, flush=True)
    step = 0
    chooser = LiveViews()
    try:
        while max_views is None or len(frames) < max_views:
            images = {}
            try:
                for name, source in sources.items():
                    images[name] = _next_frame(source, name).image
            except SourceEnded:
                ended = [n for n in sources if n not in images]
                log.info("%s ended after %d frames: %d views", ended[0], step, len(frames))
                break
            if step % every == 0:
                now = {}
                for name, image in images.items():
                    if (image.shape[1], image.shape[0]) != sizes[name]:
                        raise SourceError(f"source {name!r} changed size at frame {step}: {image.shape[1]}x"
                                          f"{image.shape[0]}, was {sizes[name][0]}x{sizes[name][1]}")
                    now[name] = detect(board, image)
                if not live or chooser.take(now, time.monotonic()):
                    for name, det in now.items():
                        detections[name].append(det)
                    frames.append(step)
                    if live:
                        seen = ", ".join(name for name, det in now.items() if len(det) >= MIN_CORNERS)
                        print(f"view {len(frames)} (frame {step}): the board seen by {seen}", file=sys.stderr,
                              flush=True)
            step += 1
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (Terminated)
        if not live:
            raise
        how = "terminated" if getattr(exc, "exit_code", 130) == 143 else "interrupted"
        print(f"{how}: stopped collecting after {len(frames)} views", file=sys.stderr, flush=True)
    return detections, sizes, frames


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Run ``calibrate``: prints each camera's reprojection error and the file written."""
    from stages.mocap.camera import read_rig, write_rig
    from stages.mocap.charuco import calibrate_rig

    from ..sources import SourceError, open_source

    sources: dict[str, Source] = {}
    try:
        board, specs, out, fisheye = _checked(args)
        intrinsics = None
        if args.intrinsics:
            given = read_rig(args.intrinsics)
            given.check_sources([s.id for s in specs], args.intrinsics)
            intrinsics = {s.id: given[s.id] for s in specs}
        for spec in specs:
            sources[spec.id] = open_source(spec.uri, source_id=spec.id)
        # Ctrl-C and SIGTERM stop the collection (live) whatever this process inherited: a launcher
        # that ignores SIGINT (a script's background job, nohup, a test runner) would leave it deaf.
        previous = {sig: signal.signal(sig, handler) for sig, handler in
                    ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, raise_terminated))}
        try:
            detections, sizes, frames = collect(board, sources, args.every, args.max_views)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        for source in sources.values():
            source.stop()
        result = calibrate_rig(board, detections, sizes, intrinsics=intrinsics,
                               refine_intrinsics=args.refine_intrinsics, min_views=args.min_views,
                               fit_k3=args.fit_k3, fisheye=fisheye)
        reference = specs[0].id
        world = f"the board's first corner, z out of the board, in frame {frames[result.world_view]} of {reference}"
        rig = dataclasses.replace(result.rig, metadata={**result.rig.metadata, "world": world})
        write_rig(rig, out, result.error_px, overwrite=args.overwrite)
    except (ConfigError, SourceError, OSError) as exc:  # CalibrationError is a ConfigError
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        for source in sources.values():
            source.stop()
    for name in rig.names:
        fitted = result.intrinsic_error_px[name]
        model = "fisheye " if rig[name].fisheye else ""
        intr = (f"{model}intrinsics {fitted:.3f} px over {result.intrinsic_views[name]} views" if fitted is not None
                else f"intrinsics from {args.intrinsics}")
        print(f"{name}: reprojection error {result.error_px[name]:.3f} px RMS over {result.views[name]} views ({intr})")
    print(f"world: {world}")
    print(f"wrote {out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry: ``python -m pipeline.mocap.calibrate calibrate ...``."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    parser = OneLineParser(prog="sapiens2-stream")
    add_calibrate_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
