"""A world step as a wire message (docs/WIRE.md, "World keypoints"): topic ``world.rig``."""

from __future__ import annotations

from typing import Any

import numpy as np

from sapiens2_client import wire
from stages.mocap.fuse import WorldFrame

RIG_ID = "rig"  # the world topic's source id: world.rig


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
