"""``sapiens2-stream demo-rig DIR``: a motion-capture take of four virtual cameras, made at run time,
to try ``calibrate`` -> ``triangulate`` -> TRC without cameras (pipeline.mocap.synthetic.demo).

It writes into DIR ``board/cam1.mp4`` ... ``cam4.mp4`` (each camera's views of a ChArUco board of 5x7
squares of 15 cm, markers 11 cm, DICT_4X4_50, first lying on the floor: the world's origin),
``keypoints/cam1.jsonl`` ... (two people walking for 3 s as ``--save-keypoints`` writes them: the 308
keypoints projected through the lens, 1 px of noise, 5% missed; no model runs), ``truth.toml`` and
``truth.jsonl`` (the cameras and the people as they are, the people in the ``--save-world`` format),
and prints the commands that calibrate and triangulate them. Every failure is one ``error: ...`` line.
"""

from __future__ import annotations

import argparse
import logging
from fractions import Fraction
from pathlib import Path

from stages.errors import ConfigError

log = logging.getLogger(__name__)
SECONDS = 3.0
CAPTURE_NS = 1_767_225_600_000_000_000  # the take's first frame, 2026-01-01


def add_demo_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``demo-rig``."""
    p = subparsers.add_parser("demo-rig", help="write a synthetic motion-capture take (board videos and keypoint "
                                               "files of four virtual cameras) to try calibrate and triangulate")
    p.add_argument("folder", help="where to write it (made if missing; must not hold a take already)")
    p.add_argument("--overwrite", action="store_true", help="replace a take already in the folder")
    p.set_defaults(func=cmd_demo_rig)


def cmd_demo_rig(args: argparse.Namespace) -> int:
    """Write the take and print what comes next."""
    import numpy as np

    from stages.mocap.camera import write_rig

    from pipeline.mocap.synthetic import demo

    folder = Path(args.folder)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"demo-rig: {folder} is a file; name a folder")
    taken = [name for name in ("board", "keypoints", "truth.toml", "truth.jsonl") if (folder / name).exists()]
    if taken and not args.overwrite:
        raise ConfigError(f"demo-rig: {folder} already holds a take ({', '.join(taken)}); pass --overwrite or name "
                          "another folder")
    rig = demo.cameras()
    for sub in ("board", "keypoints"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    _board_videos(folder / "board", rig, demo, rng)
    steps = _keypoint_files(folder, rig, demo, rng)
    write_rig(rig, folder / "truth.toml", overwrite=True)
    names = rig.names
    b = demo.BOARD
    print(f"wrote {folder / 'board'}/{{{','.join(names)}}}.mp4 (the board in {len(demo.board_poses())} poses), "
          f"{folder / 'keypoints'}/{{{','.join(names)}}}.jsonl (2 people, {steps} frames), "
          f"{folder / 'truth.toml'} and {folder / 'truth.jsonl'} (what is true)")
    print("next, calibrate the cameras from the board videos, then triangulate the keypoint files:")
    print(f"  sapiens2-stream calibrate {' '.join(f'--source {n}={folder}/board/{n}.mp4' for n in names)} "
          f"--board {b.squares_x}x{b.squares_y} --square {b.square_m:g} --marker {b.marker_m:g} "
          f"--out {folder}/calib.toml")
    print(f"  sapiens2-stream triangulate {' '.join(f'--keypoints {n}={folder}/keypoints/{n}.jsonl' for n in names)} "
          f"--calibration {folder}/calib.toml --save-world {folder}/world.jsonl --export-trc {folder}/walk.trc")
    return 0


def _board_videos(out: Path, rig, demo, rng) -> None:
    """One H.264 video per camera, a frame per board pose (near-lossless: the corners stay sharp)."""
    import av
    import numpy as np

    from pipeline.mocap.synthetic.board import Renderer

    renderer = Renderer(demo.BOARD, px_per_square=60)
    poses = demo.board_poses()
    for name, camera in rig.cameras.items():
        path = out / f"{name}.mp4"
        with av.open(str(path.with_name(path.name + ".part")), "w", format="mp4") as container:
            stream = container.add_stream("libx264", rate=5, options={"crf": "18"})
            stream.width, stream.height, stream.pix_fmt = camera.size[0], camera.size[1], "yuv420p"
            for pose in poses:
                grey = renderer.render(camera, pose, rng, noise=0.5)
                frame = av.VideoFrame.from_ndarray(np.repeat(grey[..., None], 3, axis=2), format="rgb24")
                container.mux(stream.encode(frame))
            container.mux(stream.encode(None))
        path.with_name(path.name + ".part").replace(path)


def _keypoint_files(folder: Path, rig, demo, rng) -> int:
    """Each camera's keypoint JSONL and the truth's world JSONL; returns the frames written."""
    import numpy as np
    from sapiens2_client.jsonl import LineWriter, keypoint_record

    from pipeline.sinks.world import WorldWriter
    from stages.mocap.fuse import WorldFrame

    from pipeline.mocap.synthetic.people import observe

    steps = round(SECONDS * demo.FPS)
    writers = {name: LineWriter(folder / "keypoints" / f"{name}.jsonl") for name in rig.names}
    truth = WorldWriter(folder / "truth.jsonl")
    time_base = Fraction(1, 15360)
    try:
        for i in range(steps):
            t = i / demo.FPS
            people = demo.people(t)
            capture_ns = CAPTURE_NS + round(t * 1e9)
            for name, (det, kp) in observe(rig, people, rng, noise_px=1.0, miss=0.05).items():
                writers[name].write(keypoint_record(
                    frame=i, pts=round(t / time_base), time_base=time_base, capture_ns=capture_ns,
                    width=rig[name].size[0], height=rig[name].size[1], random_weights=False, boxes=det.boxes,
                    box_scores=det.scores, track_ids=det.track_ids, keypoints=kp.xy, scores=kp.scores))
            n, k, c = len(people), people[0].shape[0], len(rig.names)
            truth.write_world(WorldFrame(
                i, capture_ns, t, rig.names, dict.fromkeys(rig.names, i), np.stack(people).astype(np.float32),
                np.ones((n, k), bool), np.zeros((n, k), np.float32), np.full((n, k), c, np.uint8),
                np.arange(n, dtype=np.int64), np.tile(np.arange(n, dtype=np.int32)[:, None], (1, c)),
                np.zeros((0, 2), np.int32)))
    finally:
        for writer in writers.values():
            writer.close()
        truth.close()
    return steps
