"""CLI commands for the network side: ``subscribe``, ``keys`` (the client package's, one implementation),
``broker``, ``view`` (the web viewer) and ``control`` (sources of a running pipeline).

``add_parser(subparsers)`` registers them on the main CLI's subparsers; every handler
is ``func(args) -> int`` and reports a failure as one ``error: ...`` line.
``python -m pipeline.net.commands ...`` runs them standalone.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

import zmq

from sapiens2_client import wire
from sapiens2_client.cli import OneLineParser, add_keys_command, add_subscribe_command, message_mb
from sapiens2_client.endpoints import check_endpoint
from sapiens2_client.keys import CurveClientKeys, CurveServerKeys, KeysError

from .broker import Broker, BrokerError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the subscribe, keys, broker, view and control subcommands."""
    add_subscribe_command(subparsers)
    add_keys_command(subparsers)
    b = subparsers.add_parser("broker", help="XSUB/XPUB proxy: many publishers, many subscribers")
    b.add_argument("--xsub", default=wire.BROKER_XSUB, help="endpoint publishers connect to")
    b.add_argument("--xpub", default=wire.BROKER_XPUB, help="endpoint subscribers connect to")
    b.add_argument("--curve-dir", help="CURVE keys folder: the broker is the CURVE server on both sides; "
                                       "pipelines and subscribers are clients listed in authorized/")
    b.set_defaults(func=cmd_broker)

    v = subparsers.add_parser("view", help="serve a live web view of one or more publishers (or a broker)")
    v.add_argument("--endpoint", action="append", help=f"publisher or broker endpoint (repeatable; default "
                                                       f"{wire.DEFAULT_ENDPOINT})")
    v.add_argument("--listen", default="127.0.0.1:8080", help="HOST:PORT of the page (loopback by default)")
    v.add_argument("--view-token", help="require this token (?token=...) for the page and its stream")
    v.add_argument("--metrics", help="HOST:PORT for Prometheus /metrics, /healthz and /readyz of the viewer")
    v.add_argument("--keys", help="CURVE keys directory (from `keys`) when the publisher uses CURVE")
    v.add_argument("--client-name", default="client", help="client key name inside --keys")
    v.add_argument("--max-message-mb", type=message_mb, default=64.0, help="refuse larger messages (MB)")
    v.set_defaults(func=cmd_view)

    c = subparsers.add_parser("control", help="add, remove or list the sources of a running pipeline (--control)")
    c.add_argument("--endpoint", default="tcp://127.0.0.1:5560", help="the pipeline's --control endpoint")
    c.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the reply")
    csub = c.add_subparsers(dest="action", required=True)
    csub.add_parser("list", help="the running sources")
    add = csub.add_parser("add", help="open a source and batch it in")
    add.add_argument("source", metavar="[NAME=]SPEC")
    add.add_argument("--realtime", action=argparse.BooleanOptionalAction, default=None,
                     help="pace a file at its frame rate (default: as the pipeline's other sources)")
    rm = csub.add_parser("remove", help="stop a source and finish its outputs")
    rm.add_argument("id")
    c.set_defaults(func=cmd_control)


def cmd_broker(args: argparse.Namespace) -> int:
    try:
        curve = CurveServerKeys.from_dir(args.curve_dir) if args.curve_dir else None
        broker = Broker(args.xsub, args.xpub, curve=curve)
    except (BrokerError, KeysError) as e:
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


def cmd_view(args: argparse.Namespace) -> int:
    from stages.errors import ConfigError

    from ..viewer.metrics import ViewerMetrics
    from ..viewer.server import ViewServer

    endpoints = args.endpoint or [wire.DEFAULT_ENDPOINT]
    try:
        for endpoint in endpoints:
            check_endpoint(endpoint, bind=False)
        curve = CurveClientKeys.from_dir(args.keys, args.client_name) if args.keys else None
        server = ViewServer(endpoints, args.listen, args.view_token, curve,
                            max_message_bytes=int(args.max_message_mb * 2**20)).start()
    except (ValueError, ConfigError, KeysError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    metrics = None
    if args.metrics:
        try:
            metrics = ViewerMetrics(server).serve(args.metrics)
        except ConfigError as e:
            server.close()
            print(f"error: {e}", file=sys.stderr)
            return 1
    stop = threading.Event()
    _on_signals(lambda *_: stop.set())
    print(f"viewer: open {server.url}/{'?token=...' if args.view_token else ''} (streams from "
          f"{', '.join(endpoints)})", flush=True)
    try:
        while not stop.wait(0.2):
            pass
    finally:
        if metrics is not None:
            metrics.stop()
        server.close()
    return 0


def cmd_control(args: argparse.Namespace) -> int:
    from .control import request

    message: dict[str, Any] = {"cmd": args.action}
    if args.action == "add":
        message["source"] = args.source
        if args.realtime is not None:
            message["realtime"] = args.realtime
    elif args.action == "remove":
        message["id"] = args.id
    try:
        reply = request(args.endpoint, message, args.timeout)
    except (TimeoutError, ValueError, zmq.ZMQError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if not reply.get("ok"):
        print(f"error: {reply.get('error', 'the pipeline refused the request')}", file=sys.stderr)
        return 1
    if args.action == "list":
        for source in reply["sources"]:
            print(json.dumps(source))
        if not reply["sources"]:
            print("no sources are running (add one with `control add [NAME=]SPEC`)", file=sys.stderr)
    else:
        print(json.dumps(reply))
    return 0


def _on_signals(handler: Any) -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry: ``python -m pipeline.net.commands {subscribe,keys,broker} ...``."""
    parser = OneLineParser(prog="sapiens2-stream")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
