"""The messages the pipeline publishes, as header fields and parts (docs/WIRE.md).

Pure functions of the pipeline's records, no sockets: a frame's keypoints, frame, seg and matte
messages (``frame_messages``), a source's status (``status_fields``) and a world step
(``world_message``, topic ``world.rig``). The publisher chooses which are wanted, encodes and sends them.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import numpy as np
from sapiens2_client import wire

from stages.mocap.fuse import WorldFrame
from stages.tasks import TASKS
from stages.types import FrameResult, Matte, StreamInfo

RIG_ID = "rig"  # the world topic's source id: world.rig

Message = tuple[str, dict[str, Any], list[wire.Part]]  # (kind, header fields, parts)


def frame_meta(result: FrameResult, source_id: str, drops: dict[str, int], random_weights: bool) -> wire.FrameMeta:
    """The header fields every message of one frame carries."""
    frame = result.frame
    return wire.FrameMeta(
        source_id=source_id, frame_index=frame.index, pts=frame.pts, time_base=frame.time_base,
        capture_ns=frame.capture_ns, latency_ms=dict(result.latency_ms), drops=drops, width=frame.width,
        height=frame.height, random_weights=random_weights, session=frame.session,
    )


def frame_messages(result: FrameResult, meta: wire.FrameMeta, kinds: Collection[str],
                   raw_frames: bool) -> list[Message]:
    """The messages of one frame of the kinds asked for, in the order they are sent; a task's
    (``TaskSpec.message``: seg, matte) only when the frame has its result. The frame message's picture
    is a ``jpeg`` part of the image as it is (the annotated one unless raw_frames): the publisher may
    encode it on the GPU instead."""
    fields = wire.meta_fields(meta)
    out: list[Message] = []
    if "keypoints" in kinds:
        parts = _keypoint_parts(result)
        n, k = parts[0].array.shape[:2]
        extra = {} if result.keypoints3d is None else {"keypoints3d_metric": bool(result.keypoints3d.metric)}
        out.append(("keypoints", {**fields, "num_persons": n, "num_keypoints": k, **extra}, parts))
    if "frame" in kinds:
        annotated = result.annotated is not None and not raw_frames
        image = result.annotated if annotated else result.frame.image
        out.append(("frame", {**fields, "annotated": annotated}, [wire.Part("image", image, "jpeg")]))
    for spec in TASKS.values():
        if spec.message not in kinds:
            continue
        value = result.maps.get(spec.name) if spec.result is None else getattr(result, spec.result)
        if value is not None:
            extra, parts = TASK_MESSAGES[spec.message](value)
            out.append((spec.message, {**fields, **extra}, parts))
    return out


def _classes(seg: np.ndarray) -> tuple[dict[str, Any], list[wire.Part]]:
    return {}, [wire.Part("classes", seg, "png")]  # (H, W) uint8 class ids


def _alpha(matte: Matte) -> tuple[dict[str, Any], list[wire.Part]]:
    alpha = np.clip(np.rint(matte.alpha * 255.0), 0, 255).astype(np.uint8)  # (H, W)
    return {"alpha_scale": 255}, [wire.Part("alpha", alpha, "png")]


# wire kind -> a task result's header fields (beside the frame's) and parts, for the tasks published as it
TASK_MESSAGES = {"seg": _classes, "matte": _alpha}


def _keypoint_parts(result: FrameResult) -> list[wire.Part]:
    det = result.detections
    n = len(det)
    kp = result.keypoints
    xy = kp.xy if kp is not None else np.zeros((n, 0, 2), np.float32)  # (N, K, 2); K=0: not computed
    scores = kp.scores if kp is not None else np.zeros((n, 0), np.float32)  # (N, K)
    parts = [
        wire.Part("keypoints", xy.astype("<f4")),
        wire.Part("keypoint_scores", scores.astype("<f4")),
        wire.Part("boxes", det.boxes.astype("<f4")),  # (N, 4) xyxy
        wire.Part("box_scores", det.scores.astype("<f4")),  # (N,)
        wire.Part("track_ids", det.track_ids.astype("<i8")),  # (N,)
    ]
    k3 = result.keypoints3d
    if k3 is not None and kp is not None:  # the optional 3D group (docs/WIRE.md): all four parts
        parts += [
            wire.Part("keypoints3d", k3.xyz.astype("<f4")),  # (N, K, 3), zeros where not valid
            wire.Part("keypoints3d_valid", k3.valid.astype(np.uint8)),  # (N, K) 1 valid, 0 not
            wire.Part("root3d", k3.root.astype("<f4")),  # (N, 3)
            wire.Part("root3d_valid", k3.root_valid.astype(np.uint8)),  # (N,)
        ]
    return parts


def status_fields(info: StreamInfo, *, fps: float, health: str, frames: int, last_frame_index: int,
                  drops: dict[str, int], sent: dict[str, int], uptime_s: float, detector: str | None = None,
                  event: dict[str, Any] | None = None) -> dict[str, Any]:
    """The header fields of a source's status message; event (a health change) without its source_id."""
    fields: dict[str, Any] = {
        "source_id": info.source_id,
        "fps": float(fps),
        "health": health,
        "frames": frames,
        "last_frame_index": last_frame_index,
        "drops": drops,
        "sent": sent,
        "uptime_s": uptime_s,
        "width": info.width,
        "height": info.height,
        "nominal_fps": info.fps,
        "live": info.live,
        "random_weights": info.random_weights,
    }
    if detector is not None:
        fields["detector"] = detector
    if event is not None:
        fields["event"] = {k: v for k, v in event.items() if k != "source_id"}
    return fields


def world_message(world: WorldFrame) -> tuple[dict[str, Any], list[wire.Part]]:
    """The header fields and parts of one world step."""
    meta = wire.FrameMeta(source_id=RIG_ID, frame_index=world.index, capture_ns=world.capture_ns,
                          latency_ms=dict(world.latency_ms), drops={"late_views": len(world.late)},
                          random_weights=world.random_weights)
    n, k = world.valid.shape
    fields = {**wire.meta_fields(meta), "num_persons": n, "num_keypoints": k, "units": "m",
              "cameras": list(world.cameras), "camera_frames": dict(world.camera_frames)}
    parts = [
        wire.Part("world_keypoints", world.xyz.astype("<f4")),  # (N, K, 3) metres, zeros where not valid
        wire.Part("world_valid", world.valid.astype(np.uint8)),  # (N, K)
        wire.Part("world_error", world.error.astype("<f4")),  # (N, K) RMS reprojection px
        wire.Part("world_views", world.views.astype(np.uint8)),  # (N, K)
        wire.Part("world_ids", world.ids.astype("<i8")),  # (N,)
        wire.Part("world_members", world.members.astype("<i4")),  # (N, C)
        wire.Part("single_view", world.single_view.astype("<i4")),  # (S, 2)
    ]
    return fields, parts
