"""``sapiens2-client``: print, save or record a sapiens2-stream, and make CURVE keys; no torch.

    sapiens2-client subscribe --endpoint tcp://127.0.0.1:5555 --topic keypoints
    sapiens2-client subscribe --save-keypoints out.jsonl --timeout 10
    sapiens2-client subscribe --record out.mp4          # needs: pip install 'sapiens2-stream-client[video]'
    sapiens2-client keys KEYS --client alice            # adds alice; never replaces an existing key

The pipeline's ``sapiens2-stream subscribe`` and ``sapiens2-stream keys`` are these same commands.
A failure prints one ``error: ...`` line and exits non-zero; flags are checked before anything is
opened. ``subscribe --timeout`` with nothing usable received exits 3: it says what arrived and why
it was skipped (by reason), or, when nothing arrived at all, names the likely causes.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import math
import signal
import sys
import threading
import time
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from . import wire
from .display import no_display
from .endpoints import check_endpoint
from .jsonl import JsonlError, LineWriter, keypoint_record
from .keys import CurveClientKeys, KeysError, existing_clients, make_keys
from .messages import FrameMessage, KeypointsMessage, Message, StatusMessage, WorldMessage
from .subscriber import ReceiveTimeout, Subscriber, SubscriberStats

log = logging.getLogger("sapiens2_client")
NOTHING_RECEIVED = 3
# What the figures of a printed line mean, said once when the subscription starts.
LEGEND = ("; per message: latency = the frame's time in the pipeline (its stages, the source's queue included), "
          "age = since its capture (a file: its read) when it arrived here")


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line (what is wrong, where the help is) instead of the
    whole usage text above it."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message}; see `{self.prog} --help`\n")


def add_subscribe_command(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("subscribe", help="print, save or record a published stream",
                              description="Print, save or record a published stream. A printed line is TOPIC "
                                          "#FRAME_INDEX [persons=N] latency=MS age=MS" + LEGEND.replace(";", ":", 1))
    p.add_argument("--endpoint", default=wire.DEFAULT_ENDPOINT,
                   help=f"publisher or broker endpoint (pipeline default {wire.DEFAULT_ENDPOINT}, broker "
                        f"{wire.BROKER_XPUB})")
    p.add_argument("--topic", action="append", help="topic prefix (repeatable; default keypoints)")
    p.add_argument("--source", action="append", help="keep only this source id (repeatable)")
    p.add_argument("--json", action="store_true", help="print JSON lines instead of text")
    p.add_argument("--quiet", action="store_true", help="print nothing per message")
    p.add_argument("--save-keypoints", type=Path, help="append keypoint messages to this JSONL file")
    p.add_argument("--record", type=Path, help="record received frames to this video file (needs PyAV)")
    p.add_argument("--show", action="store_true", help="display received frames (needs OpenCV with a GUI)")
    p.add_argument("--latest-only", action="store_true", help="skip to the newest frame when behind")
    p.add_argument("--timeout", type=positive(float), default=None,
                   help="exit after this many idle seconds (exit 3 when nothing usable arrived)")
    p.add_argument("--count", type=positive(int), default=None, help="exit after this many messages")
    p.add_argument("--max-message-mb", type=message_mb, default=64.0,
                   help=f"refuse larger messages ({MIN_MESSAGE_MB:g}..{MAX_MESSAGE_MB:g})")
    p.add_argument("--keys", type=Path, help="CURVE keys directory (from `keys`)")
    p.add_argument("--client-name", default="client", help="client key name inside --keys")
    p.set_defaults(func=cmd_subscribe)


def positive(kind: type) -> Any:
    """An argparse type: a number of ``kind`` above 0 (a zero or negative limit would never be met)."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}") from None
        if not value > 0 or (kind is float and not math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
        return value
    return parse


MIN_MESSAGE_MB, MAX_MESSAGE_MB = 0.01, 4096.0  # 10 KiB holds any status message; ZMQ_MAXMSGSIZE is an int64


def message_mb(text: str) -> float:
    """An argparse type: a message size limit in MiB, MIN_MESSAGE_MB..MAX_MESSAGE_MB (below that it
    rounds towards 0 bytes and refuses everything; above, it overflows the socket option)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not MIN_MESSAGE_MB <= value <= MAX_MESSAGE_MB:
        raise argparse.ArgumentTypeError(f"must be {MIN_MESSAGE_MB:g}..{MAX_MESSAGE_MB:g} (MB), got {text}")
    return value


def add_keys_command(subparsers: argparse._SubParsersAction) -> None:
    k = subparsers.add_parser("keys", help="create CURVE keys (server once, then one pair per client)")
    k.add_argument("dir", type=Path)
    k.add_argument("--client", action="append", help="client name (repeatable; default client on a new folder)")
    k.set_defaults(func=cmd_keys)


def cmd_keys(args: argparse.Namespace) -> int:
    new_folder = not (args.dir / "server.key").exists()
    clients = args.client or (["client"] if new_folder else [])
    if not clients and not new_folder:
        print(f"error: {args.dir} has keys already; add clients with --client NAME", file=sys.stderr)
        return 1
    try:
        kept = existing_clients(args.dir, clients)
        made = make_keys(args.dir, clients)
    except (OSError, KeysError) as e:
        print(f"error: cannot create keys in {args.dir}: {e}", file=sys.stderr)
        return 1
    added = [c for c in clients if c not in kept]
    what = "publisher uses server.key_secret and authorized/, " if new_folder else "kept the server key; "
    if kept:
        what += f"kept the existing keys of {', '.join(kept)} (keys are never replaced); "
    print(f"created {len(made)} key files in {args.dir} ({', '.join(added) or 'no new client'}): {what}clients use "
          f"clients/<name>.key_secret and server.key")
    return 0


def _finite(value: Any) -> Any:
    """JSON-safe copy: non-finite floats become None, arrays become lists, and anything JSON cannot
    hold (bytes: a header may carry them in keys this client does not know) becomes None."""
    if isinstance(value, np.ndarray):
        return _finite(value.tolist())
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    if value is None or isinstance(value, str | int):
        return value
    return None


def summary(msg: Message) -> dict[str, Any]:
    """A JSON-friendly summary of a message (arrays as lists for keypoints); never NaN."""
    if isinstance(msg, StatusMessage):
        keys = ("fps", "health", "frames", "last_frame_index", "drops", "sent", "uptime_s", "width", "height",
                "nominal_fps", "live", "random_weights", "event")
        return _finite({"topic": msg.topic, "source_id": msg.source_id, "publish_ns": msg.publish_ns,
                        **{k: msg.header[k] for k in keys if k in msg.header}})
    out: dict[str, Any] = {"topic": msg.topic, "source_id": msg.meta.source_id, "frame_index": msg.meta.frame_index,
                           "capture_ns": msg.meta.capture_ns, "publish_ns": msg.header.get("publish_ns"),
                           "latency_ms": msg.meta.latency_ms, "drops": msg.meta.drops,
                           "random_weights": msg.meta.random_weights}
    if isinstance(msg, KeypointsMessage):
        out.update(persons=len(msg.boxes), boxes=msg.boxes, box_scores=msg.box_scores, track_ids=msg.track_ids,
                   keypoints=msg.keypoints, keypoint_scores=msg.keypoint_scores)
        if msg.keypoints3d is not None:
            k3 = msg.keypoints3d  # invalid points as None, as in the JSONL
            out.update(keypoints3d=[[p if ok else None for p, ok in zip(person, valid)]
                                    for person, valid in zip(k3.xyz.tolist(), k3.valid.tolist())],
                       root3d=[r if ok else None for r, ok in zip(k3.root.tolist(), k3.root_valid.tolist())],
                       keypoints3d_metric=k3.metric)
    elif isinstance(msg, WorldMessage):  # invalid points as None, as for keypoints3d
        out.update(persons=len(msg.world_ids), units=msg.units, cameras=msg.cameras, camera_frames=msg.camera_frames,
                   world_ids=msg.world_ids,
                   world_keypoints=[[p if ok else None for p, ok in zip(person, valid)]
                                    for person, valid in zip(msg.world_keypoints.tolist(), msg.world_valid.tolist())],
                   world_error=msg.world_error, world_views=msg.world_views, world_members=msg.world_members,
                   single_view=msg.single_view)
    elif isinstance(msg, FrameMessage):
        out.update(shape=list(msg.image.shape))
    return _finite(out)


def line(msg: Message) -> str:
    """A one-line human summary of a message (the figures: LEGEND)."""
    if isinstance(msg, StatusMessage):
        event = msg.header.get("event")
        extra = f" event={event.get('event')}" if isinstance(event, dict) else ""
        return f"{msg.topic} health={msg.health} fps={msg.fps:.1f} frames={msg.frames} drops={msg.drops}{extra}"
    lat = sum(msg.meta.latency_ms.values())
    extra = f" persons={len(msg.boxes)}" if isinstance(msg, KeypointsMessage) else ""
    if isinstance(msg, WorldMessage):
        extra = (f" persons={len(msg.world_ids)} points={int(msg.world_valid.sum())}/{msg.world_valid.size} "
                 f"cameras={len(msg.camera_frames)}/{len(msg.cameras)} single_view={len(msg.single_view)}")
    age = f" age={(time.time_ns() - msg.meta.capture_ns) / 1e6:.1f}ms" if msg.meta.capture_ns else ""
    label = " [RANDOM WEIGHTS: meaningless]" if msg.meta.random_weights else ""
    return f"{msg.topic} #{msg.meta.frame_index}{extra} latency={lat:.1f}ms{age}{label}"


def jsonl_record(msg: Message) -> dict[str, Any] | None:
    """The ``--save-keypoints`` line of a message (a keypoints frame or a status event), else None."""
    if isinstance(msg, KeypointsMessage):
        m = msg.meta
        return keypoint_record(
            frame=m.frame_index, pts=m.pts, time_base=m.time_base, capture_ns=m.capture_ns, width=m.width,
            height=m.height, random_weights=m.random_weights, boxes=msg.boxes, box_scores=msg.box_scores,
            track_ids=msg.track_ids, keypoints=msg.keypoints if msg.keypoints.shape[1] else None,
            scores=msg.keypoint_scores if msg.keypoints.shape[1] else None, keypoints3d=msg.keypoints3d,
            source=m.source_id)
    if isinstance(msg, StatusMessage) and isinstance(msg.header.get("event"), dict):
        return _finite({**msg.header["event"], "source": msg.source_id})
    return None


class _Outputs:
    """Where received messages go besides stdout: a keypoint file and a recording. Both are checked
    when made (suffix, folder writable) and created only by their first write."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.lines = LineWriter(args.save_keypoints) if args.save_keypoints else None
        self.video = None
        if args.record:
            from .video import VideoWriter

            self.video = VideoWriter(args.record)
            self.video.check()
        if self.lines is not None:
            self.lines.check()
        self.show = args.show

    def handle(self, msg: Message) -> None:
        record = jsonl_record(msg) if self.lines is not None else None
        if record is not None:
            self.lines.write(record)
        elif isinstance(msg, FrameMessage):
            if self.video is not None:
                self.video.write(msg.image, Fraction(msg.meta.capture_ns, 1_000_000_000))
            if self.show:
                import cv2

                cv2.imshow(msg.meta.source_id, cv2.cvtColor(msg.image, cv2.COLOR_RGB2BGR))
                cv2.waitKey(1)

    def close(self) -> None:
        if self.lines is not None:
            self.lines.close()
        if self.video is not None:
            self.video.close()


# What a skip reason (wire.REASONS) most likely means, for the one line after --timeout.
_SKIP_CAUSES = {
    "version": "a publisher of another schema version",
    "schema": "not sapiens2-stream messages",
    "too_large": "over --max-message-mb",
}


def _hint(args: argparse.Namespace, timeout: float, stats: SubscriberStats) -> str:
    """Why nothing usable arrived: what did arrive and was refused, or the likely causes of silence."""
    arrived = sum(stats.skipped.values()) + stats.filtered
    if arrived:
        why = [f"{reason} {n} ({_SKIP_CAUSES.get(reason, 'malformed')})" for reason, n in stats.skipped.most_common()]
        if stats.filtered:
            why.append(f"other sources {stats.filtered} (--source keeps only {', '.join(args.source)})")
        return (f"{arrived} message{'s' * (arrived != 1)} arrived from {args.endpoint} but none could be used: "
                + ", ".join(why))
    curve = ("the publisher uses CURVE and these keys are not authorised there" if args.keys
             else "the publisher uses CURVE (then pass --keys DIR)")
    if stats.handshakes_failed and args.keys and not stats.handshakes_refused:  # no answer to these keys at all
        curve = (f"the server.key in {args.keys} is not this publisher's (it comes from another `keys` folder), "
                 "or the publisher does not use CURVE")
    if stats.handshakes_failed:
        return (f"nothing received from {args.endpoint} within {timeout:g} s: it refused the connection "
                f"{stats.handshakes_failed} time{'s' * (stats.handshakes_failed != 1)}; {curve}")
    causes = ["no pipeline publishes there (start one with --publish " + args.endpoint + ")", curve,
              "the topic or source filter matches nothing"]
    if stats.disconnects:
        causes.insert(0, f"messages over --max-message-mb {args.max_message_mb:g} (the connection was dropped "
                         f"{stats.disconnects} time{'s' * (stats.disconnects != 1)})")
    return f"nothing received from {args.endpoint} within {timeout:g} s; likely: " + "; or ".join(causes)


def cmd_subscribe(args: argparse.Namespace) -> int:
    topics = list(args.topic or ["keypoints"])
    useless = [t for t in topics if not any(k.startswith(t) or t.startswith(f"{k}.") for k in wire.KINDS)]
    if useless:  # a prefix no topic starts with: it would wait in silence
        print(f"error: --topic {useless[0]!r} matches no message; topics are KIND or KIND.SOURCE with KIND one "
              f"of {', '.join(wire.KINDS)} ('' for all)", file=sys.stderr)
        return 1
    if (args.record or args.show) and not any(t.startswith("frame") or t == "" for t in topics):
        topics.append("frame")
    if args.save_keypoints and not any(t.startswith(("keypoints", "status")) or t == "" for t in topics):
        topics.append("keypoints")
    try:  # everything that can be checked is, before a socket or a file is opened
        check_endpoint(args.endpoint, bind=False)
    except ValueError as e:
        print(f"error: cannot connect: {e}", file=sys.stderr)
        return 1
    if args.show and no_display() is not None:
        print(f"error: --show: {no_display()}; drop --show (--record FILE keeps the frames)", file=sys.stderr)
        return 1
    try:
        outputs = _Outputs(args)
        curve = CurveClientKeys.from_dir(args.keys, args.client_name) if args.keys else None
        sub = Subscriber(args.endpoint, topics, sources=args.source, latest_only=args.latest_only,
                         max_message_bytes=int(args.max_message_mb * 2**20), curve=curve)
    except (OSError, ValueError, ImportError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if isinstance(sys.stdout, io.TextIOWrapper):  # a line is never worth a crash (e.g. a terminal without UTF-8)
        sys.stdout.reconfigure(errors="backslashreplace")
    print_frames = any(t.startswith("frame") or t == "" for t in args.topic or [])
    stop = threading.Event()
    _on_signals(lambda *_: stop.set())
    legend = "" if args.json or args.quiet else LEGEND
    print(f"subscribing to {args.endpoint} (topics: {', '.join(t or '<all>' for t in topics)}"
          f"{', CURVE' if curve else ''}); waiting for messages{legend}", file=sys.stderr, flush=True)
    seen, last_at = 0, time.monotonic()
    rc = 0
    try:
        while not stop.is_set() and (args.count is None or seen < args.count):
            try:
                msg = sub.recv(timeout_s=0.2)  # short waits so signals and --timeout are noticed
            except ReceiveTimeout:
                if args.timeout is not None and time.monotonic() - last_at > args.timeout:
                    if seen == 0:
                        print(f"error: {_hint(args, args.timeout, sub.stats)}", file=sys.stderr)
                        rc = NOTHING_RECEIVED
                    break
                continue
            seen, last_at = seen + 1, time.monotonic()
            outputs.handle(msg)
            if args.quiet or (isinstance(msg, FrameMessage) and not print_frames):
                continue
            print(json.dumps(summary(msg), allow_nan=False) if args.json else line(msg), flush=True)
    except wire.SchemaVersionError as e:
        print(f"error: {e}", file=sys.stderr)
        rc = 2
    except (OSError, RuntimeError, JsonlError) as e:
        print(f"error: {e}", file=sys.stderr)
        rc = 1
    finally:
        sub.close()
    try:
        outputs.close()
    except (OSError, RuntimeError) as e:
        print(f"error: finishing the outputs failed: {e}", file=sys.stderr)
        return 1
    s = sub.stats
    if (s.skipped or s.missed or s.restarts or s.disconnects) and rc != NOTHING_RECEIVED:  # else the error said it
        print(stats_line(s, args.max_message_mb), file=sys.stderr)
    return rc


def stats_line(stats: SubscriberStats, max_message_mb: float) -> str:
    """The summary a subscription ends with: received, refused by reason, missed, restarts, dropped connections."""
    reasons = ", ".join(f"{reason} {n}" for reason, n in stats.skipped.most_common())
    out = f"received {stats.received}, skipped {sum(stats.skipped.values())}{f' ({reasons})' if reasons else ''}, " \
          f"missed {stats.missed}"
    if stats.restarts:
        out += f", restarts {stats.restarts}"
    if stats.disconnects:
        oversized = (f" ({stats.reconnects} after a message over --max-message-mb {max_message_mb:g})"
                     if stats.reconnects else "")
        out += f", disconnects {stats.disconnects}{oversized}"
    return out


def _on_signals(handler: Any) -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="sapiens2-client", description="Subscribe to a sapiens2-stream pipeline")
    sub = parser.add_subparsers(dest="command", required=True)
    add_subscribe_command(sub)
    add_keys_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
