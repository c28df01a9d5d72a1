"""CLI commands for the network side: ``subscribe``, ``keys`` and ``broker``.

``add_net_commands(subparsers)`` registers them on the main CLI's subparsers; every handler
is ``func(args) -> int`` and reports a failure as one ``error: ...`` line.
``python -m pipeline.net.commands ...`` runs them standalone.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import av
import zmq.auth

from pipeline.net.broker import Broker, BrokerError
from pipeline.sinks.recorder import RecorderError, VideoRecorder
from sapiens2_client import wire
from sapiens2_client.subscriber import (
    CurveClientKeys,
    FrameMessage,
    KeypointsMessage,
    Message,
    StatusMessage,
    Subscriber,
)
from stages.types import Frame, FrameResult, StreamInfo


def add_net_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register the subscribe, keys and broker subcommands."""
    p = subparsers.add_parser("subscribe", help="print, record or show a published stream")
    p.add_argument("--endpoint", default=wire.DEFAULT_ENDPOINT, help="publisher or broker endpoint")
    p.add_argument("--topic", action="append", help="topic prefix (repeatable; default keypoints)")
    p.add_argument("--source", action="append", help="keep only this source id (repeatable)")
    p.add_argument("--json", action="store_true", help="print JSON lines instead of text")
    p.add_argument("--record", type=Path, help="record received frames to this video file")
    p.add_argument("--show", action="store_true", help="display received frames (cv2.imshow)")
    p.add_argument("--latest-only", action="store_true", help="skip to the newest frame when behind")
    p.add_argument("--timeout", type=float, default=None, help="exit after this many idle seconds")
    p.add_argument("--count", type=int, default=None, help="exit after this many messages")
    p.add_argument("--max-message-mb", type=float, default=64.0, help="skip larger messages")
    p.add_argument("--keys", type=Path, help="CURVE keys directory (from `keys`)")
    p.add_argument("--client-name", default="client", help="client key name inside --keys")
    p.set_defaults(func=cmd_subscribe)

    k = subparsers.add_parser("keys", help="create CURVE key pairs for the publisher and clients")
    k.add_argument("dir", type=Path)
    k.add_argument("--client", action="append", help="client name (repeatable; default client)")
    k.set_defaults(func=cmd_keys)

    b = subparsers.add_parser("broker", help="XSUB/XPUB proxy: many publishers, many subscribers")
    b.add_argument("--xsub", default=wire.BROKER_XSUB, help="endpoint publishers connect to")
    b.add_argument("--xpub", default=wire.BROKER_XPUB, help="endpoint subscribers connect to")
    b.set_defaults(func=cmd_broker)


def make_keys(directory: Path, clients: Sequence[str] = ("client",)) -> list[Path]:
    """Create server and client CURVE key pairs; client public keys are copied to authorized/."""
    (directory / "clients").mkdir(parents=True, exist_ok=True)
    (directory / "authorized").mkdir(exist_ok=True)
    made = list(zmq.auth.create_certificates(directory, "server"))
    for name in clients:
        wire.check_source_id(name)  # same safe charset: the name becomes a file name
        public, secret = zmq.auth.create_certificates(directory / "clients", name)
        made += [Path(public), Path(secret), Path(shutil.copy(public, directory / "authorized"))]
    (directory / "server.key_secret").chmod(0o600)
    for c in clients:
        (directory / "clients" / f"{c}.key_secret").chmod(0o600)
    return [Path(m) for m in made]


def cmd_keys(args: argparse.Namespace) -> int:
    try:
        made = make_keys(args.dir, args.client or ["client"])
    except (OSError, ValueError) as e:
        print(f"error: cannot create keys in {args.dir}: {e}", file=sys.stderr)
        return 1
    print(f"created {len(made)} key files in {args.dir}: publisher uses server.key_secret and "
          f"authorized/, clients use clients/<name>.key_secret and server.key")
    return 0


def cmd_broker(args: argparse.Namespace) -> int:
    try:
        broker = Broker(args.xsub, args.xpub)
    except BrokerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    stop = threading.Event()
    _on_signals(lambda *_: stop.set())
    broker.start()
    print(f"broker: publishers -> {broker.xsub_endpoint}, subscribers -> {broker.xpub_endpoint}", flush=True)
    try:
        while not stop.wait(0.2):
            pass
    finally:
        broker.stop()
    return 0


def summary(msg: Message) -> dict[str, Any]:
    """A JSON-friendly summary of a message (arrays as lists for keypoints)."""
    if isinstance(msg, StatusMessage):
        return {"topic": msg.topic, **{k: v for k, v in msg.header.items() if k != "parts"}}
    out: dict[str, Any] = {"topic": msg.topic, "source_id": msg.meta.source_id, "frame_index": msg.meta.frame_index,
                           "capture_ns": msg.meta.capture_ns, "publish_ns": msg.header.get("publish_ns"),
                           "latency_ms": msg.meta.latency_ms, "drops": msg.meta.drops,
                           "random_weights": msg.meta.random_weights}
    if isinstance(msg, KeypointsMessage):
        out.update(persons=len(msg.boxes), boxes=msg.boxes.tolist(), box_scores=msg.box_scores.tolist(),
                   track_ids=msg.track_ids.tolist(), keypoints=msg.keypoints.tolist(),
                   keypoint_scores=msg.keypoint_scores.tolist())
    elif isinstance(msg, FrameMessage):
        out.update(shape=list(msg.image.shape))
    return out


def line(msg: Message) -> str:
    """A one-line human summary of a message."""
    if isinstance(msg, StatusMessage):
        return f"{msg.topic} health={msg.health} fps={msg.fps:.1f} frames={msg.frames} drops={msg.drops}"
    lat = sum(msg.meta.latency_ms.values())
    extra = f" persons={len(msg.boxes)}" if isinstance(msg, KeypointsMessage) else ""
    age_ms = (time.time_ns() - msg.meta.capture_ns) / 1e6 if msg.meta.capture_ns else float("nan")
    label = " [RANDOM WEIGHTS: meaningless]" if msg.meta.random_weights else ""
    return f"{msg.topic} #{msg.meta.frame_index}{extra} latency={lat:.1f}ms age={age_ms:.1f}ms{label}"


def _record(recorder: VideoRecorder, msg: FrameMessage) -> None:
    """Received frames through the pipeline's recorder, timed by their capture clock."""
    meta = msg.meta
    if recorder.frames_written == 0:
        recorder.open(StreamInfo(meta.source_id, meta.width, meta.height, None, None, live=True))
    frame = Frame(meta.frame_index, msg.image, None, None, meta.capture_ns, meta.source_id)
    recorder.write(FrameResult(frame))


def cmd_subscribe(args: argparse.Namespace) -> int:
    topics = list(args.topic or ["keypoints"])
    if (args.record or args.show) and not any(t.startswith("frame") or t == "" for t in topics):
        topics.append("frame")
    try:
        curve = CurveClientKeys.from_dir(args.keys, args.client_name) if args.keys else None
        sub = Subscriber(args.endpoint, topics, sources=args.source, latest_only=args.latest_only,
                         timeout_s=args.timeout, max_message_bytes=int(args.max_message_mb * 2**20), curve=curve)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    recorder = VideoRecorder(args.record) if args.record else None
    print_frames = any(t.startswith("frame") or t == "" for t in args.topic or [])
    stop = threading.Event()
    _on_signals(lambda *_: stop.set())
    seen, last_at = 0, time.monotonic()
    try:
        while not stop.is_set() and (args.count is None or seen < args.count):
            try:
                msg = sub.recv(timeout_s=0.2)  # short waits so signals and --timeout are noticed
            except TimeoutError:
                if args.timeout is not None and time.monotonic() - last_at > args.timeout:
                    break
                continue
            seen, last_at = seen + 1, time.monotonic()
            if isinstance(msg, FrameMessage):
                if recorder is not None:
                    _record(recorder, msg)
                if args.show:
                    _show(msg)
                if not print_frames:
                    continue
            print(json.dumps(summary(msg)) if args.json else line(msg), flush=True)
    except wire.SchemaVersionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (OSError, RecorderError, av.FFmpegError) as e:
        print(f"error: recording to {args.record} failed: {e}", file=sys.stderr)
        return 1
    finally:
        sub.close()
    if recorder is not None:
        try:
            recorder.close()
        except (OSError, RecorderError, av.FFmpegError) as e:
            print(f"error: finishing {args.record} failed: {e}", file=sys.stderr)
            return 1
    return 0


def _show(msg: FrameMessage) -> None:
    import cv2

    cv2.imshow(msg.meta.source_id, cv2.cvtColor(msg.image, cv2.COLOR_RGB2BGR))
    cv2.waitKey(1)


def _on_signals(handler: Any) -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry: ``python -m pipeline.net.commands {subscribe,keys,broker} ...``."""
    parser = argparse.ArgumentParser(prog="sapiens2-stream")
    add_net_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
