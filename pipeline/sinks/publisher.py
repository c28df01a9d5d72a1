"""ZmqPublisher: a pipeline sink that publishes results over ZeroMQ (see docs/WIRE.md).

It never blocks the pipeline: each send is non-blocking with ZMQ_XPUB_NODROP, so a full
subscriber queue raises ``Again`` and the drop is counted. With isolate_subscribers=True (the
default) the message is then sent again in lossy mode so every subscriber with room still
gets it; libzmq then skips the full subscriber silently until it reads again, so the
publisher's drop counters are a lower bound (one per stall) and subscribers see the rest as
frame_index gaps (Subscriber.stats.missed). With isolate_subscribers=False every drop is
counted exactly, but a stalled subscriber holds back its topics for all subscribers. Queues are bounded per subscriber by one high-water mark
(``sndhwm`` messages of any kind; libzmq stops enforcing it when SNDHWM is changed on live
connections, so kinds cannot get separate marks on one socket). Images are only encoded for topics that somebody subscribes to (the
XPUB socket reports subscriptions). A background thread publishes ``status`` messages every
``status_interval_s`` even when the pipeline stalls.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from sapiens2_client import wire
from sapiens2_client.timing import RateMeter
from stages.types import FrameResult, StreamInfo

log = logging.getLogger(__name__)


class PublishError(RuntimeError):
    """The publisher could not be set up (bad endpoint, port in use, missing keys)."""


@dataclass(frozen=True)
class CurveServerKeys:
    """The publisher's CURVE key pair and the directory of allowed client public keys."""

    public: bytes
    secret: bytes
    authorized_dir: Path

    @classmethod
    def from_dir(cls, keys_dir: str | Path) -> CurveServerKeys:
        """Load ``server.key_secret`` and ``authorized/`` made by ``sapiens2-stream keys DIR``."""
        keys_dir = Path(keys_dir)
        secret_file, authorized = keys_dir / "server.key_secret", keys_dir / "authorized"
        if not secret_file.is_file() or not authorized.is_dir():
            raise PublishError(
                f"{keys_dir} lacks server.key_secret or authorized/; create it with `sapiens2-stream keys {keys_dir}`"
            )
        public, secret = zmq.auth.load_certificate(secret_file)
        if secret is None:
            raise PublishError(f"{secret_file} holds no secret key")
        return cls(public=public, secret=secret, authorized_dir=authorized)


@dataclass
class PublisherStats:
    """Counters of one publisher, keyed by message kind."""

    frames: int = 0
    sent: dict[str, int] = field(default_factory=lambda: collections.Counter())
    dropped: dict[str, int] = field(default_factory=lambda: collections.Counter())
    encoded: dict[str, int] = field(default_factory=lambda: collections.Counter())


class ZmqPublisher:
    """Publishes keypoints, frames (JPEG), seg (PNG), matte (PNG) and status over an XPUB socket.

    endpoint is bound (or connected to a broker's XSUB side when connect=True); a port of ``*``
    picks a free one, read back from ``.endpoint`` after open(). sndhwm counts queued messages
    of every kind per subscriber (32 = about 8 frames when all four kinds are subscribed).
    """

    def __init__(
        self,
        endpoint: str = wire.DEFAULT_ENDPOINT,
        *,
        connect: bool = False,
        header_format: str = "msgpack",
        jpeg_quality: int = 90,
        sndhwm: int = 32,
        isolate_subscribers: bool = True,
        status_interval_s: float = 1.0,
        linger_ms: int = 500,
        curve: CurveServerKeys | None = None,
        gpu_jpeg: bool = False,
    ) -> None:
        if header_format not in wire.HEADER_FORMATS:
            raise ValueError(f"header_format must be msgpack or json, got {header_format!r}")
        if not 1 <= jpeg_quality <= 100:
            raise ValueError(f"jpeg_quality must be in 1..100, got {jpeg_quality}")
        self.requested_endpoint = endpoint
        self.connect = connect
        self.header_format = header_format
        self.jpeg_quality = jpeg_quality
        self.sndhwm = sndhwm
        self.isolate_subscribers = isolate_subscribers
        self.status_interval_s = status_interval_s
        self.linger_ms = linger_ms
        self.curve = curve
        self.jpeg = JpegEncoder(jpeg_quality, "auto" if gpu_jpeg else None)
        self.stats = PublisherStats()
        self.endpoint = endpoint
        self._health = "starting"
        self._info: StreamInfo | None = None
        self._ctx: zmq.Context | None = None
        self._sock: zmq.Socket | None = None
        self._auth: ThreadAuthenticator | None = None
        self._lock = threading.Lock()  # guards the socket: write() and the status thread share it
        self._subscriptions: set[bytes] = set()
        self._pipeline_drops: dict[str, int] = {}
        self._last_index = -1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._rate = RateMeter(max(status_interval_s, 0.5))  # published frames per second

    # -- Sink protocol ------------------------------------------------------------------------
    def open(self, info: StreamInfo) -> None:
        """Create the socket (and CURVE authenticator), bind or connect, start the status thread."""
        wire.check_source_id(info.source_id)
        self._info = info
        self._ctx = zmq.Context()
        try:
            if self.curve is not None:
                self._auth = ThreadAuthenticator(self._ctx)
                self._auth.start()
                self._auth.configure_curve(domain="*", location=str(self.curve.authorized_dir))
            sock = self._ctx.socket(zmq.XPUB)
            sock.setsockopt(zmq.XPUB_VERBOSE, 1)
            sock.setsockopt(zmq.XPUB_NODROP, 1)  # a full queue makes send raise Again: drops are counted
            sock.setsockopt(zmq.SNDHWM, self.sndhwm)
            sock.setsockopt(zmq.LINGER, self.linger_ms)
            if self.curve is not None:
                sock.curve_secretkey = self.curve.secret
                sock.curve_publickey = self.curve.public
                sock.curve_server = True
            self._sock = sock
            if self.connect:
                sock.connect(self.requested_endpoint)
            else:
                sock.bind(self.requested_endpoint)
                self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        except zmq.ZMQError as e:
            self.close()
            verb = "connect to" if self.connect else "bind"
            raise PublishError(
                f"cannot {verb} {self.requested_endpoint}: {e}; choose another endpoint (e.g. tcp://127.0.0.1:*)"
            ) from e
        self._health = "ok"
        self._rate = RateMeter(max(self.status_interval_s, 0.5))
        self._thread = threading.Thread(target=self._status_loop, name="zmq-status", daemon=True)
        self._thread.start()
        log.info("publishing %s on %s", info.source_id, self.endpoint)

    def write(self, result: FrameResult) -> None:
        """Publish one frame's messages; never blocks (full queues drop and count)."""
        assert self._info is not None and self._sock is not None, "open() first"
        frame = result.frame
        src = self._info.source_id
        with self._lock:
            self._poll_subscriptions()
            self.stats.frames += 1
            self._last_index = frame.index
            self._pipeline_drops = dict(result.drops)
            wanted = {k: self._is_subscribed(wire.topic_for(k, src)) for k in ("keypoints", *wire.IMAGE_KINDS)}
            drops = self._all_drops()
        meta = wire.FrameMeta(
            source_id=src,
            frame_index=frame.index,
            pts=frame.pts,
            time_base=frame.time_base,
            capture_ns=frame.capture_ns,
            latency_ms=dict(result.latency_ms),
            drops=drops,
            width=frame.width,
            height=frame.height,
            random_weights=result.random_weights or self._info.random_weights,
        )
        fields = wire.meta_fields(meta)
        messages: list[tuple[str, list[wire.Part], dict]] = []
        if wanted["keypoints"]:
            kp_parts = _keypoint_parts(result)
            n, k = kp_parts[0].array.shape[:2]
            messages.append(("keypoints", kp_parts, {"num_persons": n, "num_keypoints": k}))
        if wanted["frame"]:
            image = result.annotated if result.annotated is not None else frame.image
            messages.append(("frame", [wire.Part("image", image, "jpeg")], {"annotated": result.annotated is not None}))
        if wanted["seg"] and result.seg is not None:
            messages.append(("seg", [wire.Part("classes", result.seg, "png")], {}))
        if wanted["matte"] and result.matte is not None:
            alpha = np.clip(np.rint(result.matte.alpha * 255.0), 0, 255).astype(np.uint8)  # (H, W)
            messages.append(("matte", [wire.Part("alpha", alpha, "png")], {"alpha_scale": 255}))
        encoded = []
        for kind, parts, extra in messages:
            if kind == "frame":
                encoded.append((kind, self._encode_frame({**fields, **extra}, parts[0].array)))
            else:
                encoded.append((kind, self._encode(kind, {**fields, **extra}, parts)))
        with self._lock:
            for kind, frames in encoded:
                self._send(kind, frames)
            self._rate.tick()

    def close(self) -> None:
        """Stop the status thread, send a last status, close sockets with bounded linger."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(2.0, 2 * self.status_interval_s))
            self._thread = None
        if self._sock is not None:
            with self._lock:
                self._health = "closed"
                self._publish_status()
                self._sock.close(linger=self.linger_ms)
                self._sock = None
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    # -- public helpers -----------------------------------------------------------------------
    def set_health(self, health: str) -> None:
        """Set the source health reported in status ("ok", "stalled", "reconnecting", ...)."""
        self._health = str(health)

    def subscribed(self, topic: str) -> bool:
        """Whether some subscriber's prefix matches topic (reads pending subscription messages)."""
        with self._lock:
            self._poll_subscriptions()
            return self._is_subscribed(topic)

    def wait_for_subscriber(self, topic: str, timeout_s: float) -> bool:
        """Wait up to timeout_s until some subscriber's prefix matches topic."""
        deadline = time.monotonic() + timeout_s
        while not self.subscribed(topic):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    # -- internals (callers hold self._lock where a socket is touched) --------------------------
    def _encode(self, kind: str, fields: dict, parts: list[wire.Part]) -> list[bytes]:
        self.stats.encoded[kind] += 1
        return wire.encode(
            kind,
            fields["source_id"],
            fields,
            parts,
            publish_ns=time.time_ns(),
            header_format=self.header_format,
            jpeg_quality=self.jpeg_quality,
        )

    def _encode_frame(self, fields: dict, image: np.ndarray) -> list[bytes]:
        """The frame message; JPEG from the GPU encoder when it is on and works, else wire's CPU path."""
        data = self.jpeg.encode(image)
        if data is None:
            return self._encode("frame", fields, [wire.Part("image", image, "jpeg")])
        frames = self._encode("frame", fields, [])
        header = wire.load_header(frames[1])
        # The descriptor wire writes for a CPU-encoded JPEG part: subscribers cannot tell the two apart.
        header["parts"] = [{"name": "image", "encoding": "jpeg", "dtype": "|u1", "shape": list(image.shape),
                            "color": "rgb"}]
        return [frames[0], wire.dump_header(header, self.header_format), data]

    def _poll_subscriptions(self) -> None:
        sock = self._sock
        while sock is not None:
            try:
                msg = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if msg[:1] == b"\x01":
                self._subscriptions.add(msg[1:])
            elif msg[:1] == b"\x00":
                # XPUB reports an unsubscribe only when the last subscriber of a prefix leaves.
                self._subscriptions.discard(msg[1:])

    def _is_subscribed(self, topic: str) -> bool:
        t = topic.encode()
        return any(t.startswith(p) for p in self._subscriptions)

    def _send(self, kind: str, frames: list[bytes]) -> bool:
        """Send without blocking; False (and a counted drop) when some subscriber's queue is full."""
        sock = self._sock
        if sock is None:
            return False
        try:
            sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self.stats.dropped[kind] += 1
            if not self.isolate_subscribers:
                return False
            sock.setsockopt(zmq.XPUB_NODROP, 0)  # lossy: still reach the subscribers with room
            try:
                sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:  # pragma: no cover - lossy XPUB sends do not raise Again
                pass
            finally:
                sock.setsockopt(zmq.XPUB_NODROP, 1)
            return False
        self.stats.sent[kind] += 1
        return True

    def _all_drops(self) -> dict[str, int]:
        own = {f"publish_{k}": int(v) for k, v in self.stats.dropped.items()}
        return {**{str(k): int(v) for k, v in self._pipeline_drops.items()}, **own}

    def _publish_status(self) -> None:
        info = self._info
        if self._sock is None or info is None:
            return
        self._poll_subscriptions()
        topic = wire.topic_for("status", info.source_id)
        if not self._is_subscribed(topic):
            return
        fields = {
            "fps": float(self._rate.rate),
            "health": self._health,
            "frames": self.stats.frames,
            "last_frame_index": self._last_index,
            "drops": self._all_drops(),
            "sent": dict(self.stats.sent),
            "uptime_s": time.monotonic() - self._rate.started,
            "width": info.width,
            "height": info.height,
            "nominal_fps": info.fps,
            "live": info.live,
            "random_weights": info.random_weights,
        }
        self._send("status", self._encode("status", {"source_id": info.source_id, **fields}, []))

    def _status_loop(self) -> None:
        while not self._stop.wait(self.status_interval_s):
            with self._lock:
                self._publish_status()


class JpegEncoder:
    """JPEG of published frames on a torch device (nvJPEG through torchvision on CUDA).

    device: "auto" (CUDA when present), a device name, or None (off). ``encode`` returns None when
    the caller should use the CPU encoder instead: no device, or after the first failure, which is
    logged once and turns this encoder off for the rest of the run.
    """

    def __init__(self, quality: int = 90, device: str | None = "auto") -> None:
        self.quality = quality
        self.device: Any = None
        if device is None:
            return
        import torch

        if device == "auto":
            if not torch.cuda.is_available():
                log.info("gpu_jpeg: no CUDA device; frames are JPEG-encoded on the CPU")
                return
            device = "cuda"
        self.device = torch.device(device)
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._staging: Any = None  # pinned (H, W, 3) uint8 host buffer, reused while the size holds

    @property
    def active(self) -> bool:
        return self.device is not None

    def encode(self, image: np.ndarray) -> bytes | None:
        """(H, W, 3) RGB uint8 -> JPEG bytes, or None: use the CPU path."""
        if self.device is None:
            return None
        try:
            return self._encode(image)
        except (ImportError, RuntimeError, ValueError, TypeError, OSError) as exc:
            # ImportError: torchvision 0.29 deprecates its image codecs (TorchCodec replaces them);
            # a release without encode_jpeg must leave the CPU encoder working.
            log.warning("GPU JPEG encoding failed (%s); encoding frames on the CPU from now on",
                        str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
            self.device = None
            return None

    def _encode(self, image: np.ndarray) -> bytes:
        import torch
        from torchvision.io import encode_jpeg

        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            raise ValueError(f"expected (H, W, 3) uint8 RGB, got {image.shape} {image.dtype}")
        host = torch.from_numpy(np.ascontiguousarray(image))
        if self.device.type == "cuda":
            if self._staging is None or self._staging.shape != host.shape:
                self._staging = torch.empty(host.shape, dtype=torch.uint8, pin_memory=True)
            self._staging.copy_(host)
            with torch.cuda.stream(self._stream):  # off the model streams
                chw = self._staging.to(self.device, non_blocking=True).permute(2, 0, 1).contiguous()  # (3, H, W)
                # torchvision's nvJPEG encoder works on a stream of its own: the input must be ready.
                self._stream.synchronize()
                encoded = encode_jpeg(chw, quality=self.quality)
            # It writes the bitstream on the legacy default stream; copy it out on that stream too.
            data = encoded.cpu()
        else:
            data = encode_jpeg(host.permute(2, 0, 1).contiguous(), quality=self.quality)
        return data.numpy().tobytes()


def _keypoint_parts(result: FrameResult) -> list[wire.Part]:
    det = result.detections
    n = len(det)
    kp = result.keypoints
    xy = kp.xy if kp is not None else np.zeros((n, 0, 2), np.float32)  # (N, K, 2); K=0: not computed
    scores = kp.scores if kp is not None else np.zeros((n, 0), np.float32)  # (N, K)
    return [
        wire.Part("keypoints", xy.astype("<f4")),
        wire.Part("keypoint_scores", scores.astype("<f4")),
        wire.Part("boxes", det.boxes.astype("<f4")),  # (N, 4) xyxy
        wire.Part("box_scores", det.scores.astype("<f4")),  # (N,)
        wire.Part("track_ids", det.track_ids.astype("<i8")),  # (N,)
    ]
