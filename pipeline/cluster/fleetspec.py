"""The fleet file (``sapiens2-stream fleet up FLEET.yaml``): cameras, the broker, per-GPU capacity.

    name: lobby-fleet                # names the controller, the GPU actors and the Redis keys (default sapiens2)
    broker: tcp://10.0.0.5:5556      # the broker's XSUB side
    redis: redis://10.0.0.5:6380/0   # the placement mirror
    capacity: 4                      # cameras per GPU actor
    pipeline: {tasks: [pose]}        # a run's YAML keys, for every GPU actor
    cameras:
      - {id: lobby, uri: "rtsp://cam-1/stream"}

Every key (``gpus``, ``curve_dir``, ...): docs/DEPLOYMENT.md, "The fleet file". Everything here is
checked before Ray starts (``FleetError``, one line). Pure Python: no Ray.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from pipeline.cli.config import ConfigError, load_config
from sapiens2_client.endpoints import check_endpoint

KEYS = {"name", "broker", "redis", "capacity", "gpus", "gpus_per_actor", "pipeline", "curve_dir", "curve_client",
        "cameras", "liveness_s", "retry_max_s"}
CAMERA_KEYS = {"id", "uri", "realtime", "stall_timeout_s"}
# Run settings a fleet sets itself (sources, where results go) or that need a terminal or one host.
NOT_IN_PIPELINE = {"source", "sources", "source_id", "control", "publish", "publish_connect", "curve_dir",
                   "curve_client", "record", "save_keypoints", "show", "view", "view_token", "metrics",
                   "max_frames", "progress"}
_ID = re.compile(r"[A-Za-z0-9_\-:]{1,64}")
_NAME = re.compile(r"[A-Za-z0-9_\-]{1,40}")


class FleetError(ConfigError):
    """The fleet file or a fleet command is wrong; the message says what to change."""


@dataclass(frozen=True)
class Camera:
    id: str
    uri: str
    realtime: bool | None = None
    stall_timeout_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class FleetSpec:
    broker: str
    redis: str
    capacity: int
    name: str = "sapiens2"
    gpus: int | None = None  # None: every GPU of the cluster
    gpus_per_actor: float = 1.0  # 1 on GPU hosts (Ray's rule: whole GPUs); 0 runs a CPU-only trial fleet
    pipeline: dict[str, Any] = field(default_factory=dict)
    curve_dir: str | None = None
    curve_client: str = "pipeline"
    cameras: list[Camera] = field(default_factory=list)
    liveness_s: float = 20.0  # a GPU actor that does not answer for this long is treated as lost
    retry_max_s: float = 60.0  # the longest wait between two attempts to open a camera

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["cameras"] = [c.to_dict() for c in self.cameras]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FleetSpec:
        return cls(**{**data, "cameras": [Camera(**c) for c in data.get("cameras", [])]})


def camera_from(entry: Any, where: str) -> Camera:
    """One camera entry (a mapping with id and uri) -> Camera, or FleetError."""
    if not isinstance(entry, dict):
        raise FleetError(f"{where}: a camera is a mapping with id and uri, e.g. {{id: lobby, uri: rtsp://...}}")
    unknown = sorted(set(entry) - CAMERA_KEYS)
    if unknown:
        raise FleetError(f"{where}: unknown key {unknown[0]!r}; a camera has {', '.join(sorted(CAMERA_KEYS))}")
    cid, uri = entry.get("id"), entry.get("uri")
    if not isinstance(cid, str) or not _ID.fullmatch(cid):
        raise FleetError(f"{where}: id {cid!r} must be 1-64 characters of letters, digits, '_', '-' or ':'")
    if not isinstance(uri, str) or not uri.strip():
        raise FleetError(f"{where} ({cid}): uri is missing; give a camera URL, a video file or loop:FILE")
    realtime, stall = entry.get("realtime"), entry.get("stall_timeout_s")
    if realtime is not None and not isinstance(realtime, bool):
        raise FleetError(f"{where} ({cid}): realtime must be true or false")
    if stall is not None and not _seconds(stall):
        raise FleetError(f"{where} ({cid}): stall_timeout_s must be a positive number of seconds")
    return Camera(cid, uri.strip(), realtime, None if stall is None else float(stall))


def _seconds(value: Any) -> bool:
    """A positive, finite number of seconds (NaN and infinity are none: a retry would never come)."""
    return not isinstance(value, bool) and isinstance(value, int | float) and 0 < value < math.inf


def check_redis_url(url: Any, where: str = "redis") -> str:
    parsed = urlparse(url) if isinstance(url, str) else None
    if parsed is None or parsed.scheme not in ("redis", "rediss", "unix") or not (parsed.hostname or parsed.path):
        raise FleetError(f"{where}: {url!r} is not a Redis URL; use redis://HOST:PORT/DB")
    return url


def parse_fleet(data: Any, where: str = "fleet") -> FleetSpec:
    """A loaded fleet mapping -> FleetSpec; FleetError (one line) for anything wrong."""
    if not isinstance(data, dict):
        raise FleetError(f"{where}: expected a mapping with broker, redis, capacity and cameras")
    unknown = sorted(set(data) - KEYS)
    if unknown:
        raise FleetError(f"{where}: unknown key {unknown[0]!r}; the keys are {', '.join(sorted(KEYS))}")
    for key in ("broker", "redis", "capacity"):
        if data.get(key) is None:
            raise FleetError(f"{where}: {key} is missing")
    try:
        broker = check_endpoint(data["broker"], bind=False)
    except ValueError as exc:
        raise FleetError(f"{where}: broker: {exc}") from None
    capacity = data["capacity"]
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise FleetError(f"{where}: capacity must be a whole number of cameras per GPU, at least 1 (got {capacity!r})")
    gpus = data.get("gpus")
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1):
        raise FleetError(f"{where}: gpus must be a whole number of GPU actors, at least 1 (got {gpus!r})")
    per_actor = data.get("gpus_per_actor", 1.0)
    if isinstance(per_actor, bool) or not isinstance(per_actor, int | float) or per_actor not in (0, 1):
        raise FleetError(f"{where}: gpus_per_actor is 1 (one whole GPU per actor) or 0 (a CPU-only trial fleet)")
    name = data.get("name", "sapiens2")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise FleetError(f"{where}: name {name!r} must be 1-40 letters, digits, '_' or '-'")
    pipeline = data.get("pipeline") or {}
    if not isinstance(pipeline, dict):
        raise FleetError(f"{where}: pipeline is a mapping of run settings, e.g. {{tasks: [pose]}}")
    refused = sorted(set(pipeline) & NOT_IN_PIPELINE)
    if refused:
        raise FleetError(f"{where}: pipeline.{refused[0]} is set by the fleet itself (cameras, broker, curve_dir) "
                         "or needs one host; remove it")
    try:
        load_config(None, pipeline, overrides_from="pipeline")
    except ConfigError as exc:
        raise FleetError(f"{where}: {exc}") from None
    curve_dir = data.get("curve_dir")
    if curve_dir is not None and not Path(curve_dir).is_dir():
        raise FleetError(f"{where}: curve_dir {curve_dir!r} is not a folder; make keys with `sapiens2-stream keys`")
    cameras_in = data.get("cameras") or []
    if not isinstance(cameras_in, list):
        raise FleetError(f"{where}: cameras is a list of {{id, uri}} mappings")
    cameras: list[Camera] = []
    for i, entry in enumerate(cameras_in):
        camera = camera_from(entry, f"{where}: cameras[{i}]")
        if any(c.id == camera.id for c in cameras):
            raise FleetError(f"{where}: cameras[{i}]: the id {camera.id!r} is used twice; give each camera its own id")
        cameras.append(camera)
    numbers = {}
    for key, default in (("liveness_s", 20.0), ("retry_max_s", 60.0)):
        value = data.get(key, default)
        if not _seconds(value):
            raise FleetError(f"{where}: {key} must be a positive number of seconds")
        numbers[key] = float(value)
    client = data.get("curve_client", "pipeline")
    if not isinstance(client, str) or not client:
        raise FleetError(f"{where}: curve_client is the name of a client key in curve_dir")
    return FleetSpec(broker=broker, redis=check_redis_url(data["redis"], f"{where}: redis"), capacity=capacity,
                     name=name, gpus=gpus, gpus_per_actor=float(per_actor), pipeline=dict(pipeline),
                     curve_dir=curve_dir, curve_client=client, cameras=cameras, **numbers)


def load_fleet(path: str | Path) -> FleetSpec:
    path = Path(path)
    if not path.is_file():
        raise FleetError(f"{path}: fleet file not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise FleetError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    return parse_fleet(data, str(path))


def place(loads: dict[int, int], capacity: int) -> int | None:
    """The GPU actor a camera goes to: the one with the most spare capacity (ties: the lowest index),
    so cameras spread and every actor keeps room for the cameras of a failed one. None when all are full."""
    spare = {index: capacity - n for index, n in loads.items() if n < capacity}
    if not spare:
        return None
    return max(sorted(spare), key=lambda index: spare[index])
