"""The ``fleet`` commands: ``up`` (start or re-apply a fleet file), ``add``, ``remove``, ``status``
and ``down``, each a few small calls to the fleet's controller actor (pipeline.cluster.fleet).
Everything that can be known wrong is one ``error:`` line before Ray starts."""

from __future__ import annotations

import argparse
import json
import logging
import os
import threading
import time
from typing import Any
from urllib.parse import urlparse

from .fleet import HEAD_RESOURCE, NAMESPACE, FleetController, controller_name
from .fleetspec import FleetError, camera_from, load_fleet
from .prerequisites import need, unanswered

ACTIONS = ("up", "add", "remove", "status", "down")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    f = subparsers.add_parser("fleet", help="live camera fleets on a Ray cluster (up, add, remove, status, down)")
    fsub = f.add_subparsers(dest="fleet_action", required=True)

    def common(p: argparse.ArgumentParser, fleet_file: bool = False) -> None:
        p.add_argument("--address", help="Ray cluster address (HOST:PORT of the head; default: $RAY_ADDRESS, "
                                         "else `up` starts a local cluster)")
        if not fleet_file:
            p.add_argument("--name", default="sapiens2", help="the fleet's name (as in its file)")
        p.add_argument("--json", action="store_true", help="print the reply as JSON")
        p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the fleet to answer")

    up = fsub.add_parser("up", help="start a fleet (or apply its file again: repeat-safe)")
    up.add_argument("fleet_file", metavar="FLEET.yaml")
    common(up, fleet_file=True)
    up.add_argument("--detach", action="store_true", help="return once the cameras are placed (needs --address)")
    up.set_defaults(func=cmd_up)
    add = fsub.add_parser("add", help="add a camera to a running fleet (repeat-safe)")
    add.add_argument("camera", metavar="ID=URI")
    add.add_argument("--realtime", action=argparse.BooleanOptionalAction, default=None)
    common(add)
    add.set_defaults(func=cmd_add)
    rm = fsub.add_parser("remove", help="remove a camera from a running fleet (repeat-safe)")
    rm.add_argument("camera_id", metavar="ID")
    common(rm)
    rm.set_defaults(func=cmd_remove)
    st = fsub.add_parser("status", help="placement, cameras, workers and outages of a running fleet")
    common(st)
    st.set_defaults(func=cmd_status)
    dn = fsub.add_parser("down", help="stop a fleet: its GPU actors, its controller and its Redis keys")
    common(dn)
    dn.set_defaults(func=cmd_down)


def fleet_argv(argv: list[str]) -> list[str]:
    """``fleet FLEET.yaml ...`` is ``fleet up FLEET.yaml ...``."""
    if len(argv) >= 2 and argv[0] == "fleet" and argv[1] not in ACTIONS and not argv[1].startswith("-"):
        return ["fleet", "up", *argv[1:]]
    return argv


def check_reachable(url_or_endpoint: str, what: str, speaks: str = "tcp", timeout_s: float = 3.0) -> None:
    """One line before anything starts when the service at HOST:PORT does not answer (support.unanswered)."""
    text = url_or_endpoint if "://" in url_or_endpoint else f"tcp://{url_or_endpoint}"
    parsed = urlparse(text)
    if parsed.scheme not in ("tcp", "redis", "rediss", "ray") or not parsed.hostname or not parsed.port:
        return  # ipc:// and unix sockets: nothing to probe here
    why = unanswered(parsed.hostname, parsed.port, speaks, timeout_s)
    if why is not None:
        raise FleetError(f"{what} {url_or_endpoint} is not reachable ({why}); start it or fix the address")


def _connect(address: str | None, start_local: bool = False) -> bool:
    """Connect to the Ray cluster; True when a local one was started here (it ends with this process)."""
    ray = need("ray", "fleet")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    address = address or os.environ.get("RAY_ADDRESS")
    if address and address != "auto":
        check_reachable(address.removeprefix("ray://"), "Ray address", "grpc")
    elif not start_local:
        address = "auto"
    kwargs: dict[str, Any] = {"namespace": NAMESPACE, "logging_level": logging.WARNING, "log_to_driver": False}
    try:
        if address:
            ray.init(address=address, **kwargs)
            return False
        ray.init(address="local", include_dashboard=False, **kwargs)  # a new one, never a stray running one
        return True
    except ConnectionError as exc:
        raise FleetError(f"no Ray cluster at {address}: {str(exc).splitlines()[0]}; pass --address HOST:PORT "
                         "of a running head (`ray start --head`)") from None


def _controller(name: str):
    import ray

    try:
        return ray.get_actor(controller_name(name), namespace=NAMESPACE)
    except ValueError:
        raise FleetError(f"no fleet named {name!r} runs on this Ray cluster; start it with "
                         "`sapiens2-stream fleet up FLEET.yaml`") from None


def _call(method, *args, timeout_s: float) -> Any:
    import ray

    try:
        return ray.get(method.remote(*args), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise FleetError(f"the fleet controller did not answer within {timeout_s:.0f} s") from None
    except ray.exceptions.RayTaskError as exc:  # its first line is Ray's task banner: say what failed instead
        cause = exc.cause if isinstance(exc.cause, BaseException) else exc
        first = (str(cause).splitlines() or [""])[0]
        raise FleetError(f"the fleet controller failed: {type(cause).__name__}: {first}") from None
    except ray.exceptions.RayActorError as exc:
        raise FleetError(f"the fleet controller is not running ({type(exc).__name__}); Ray restarts it: try again "
                         "in a few seconds") from None


def _print(reply: dict[str, Any], as_json: bool) -> None:
    """The reply (as JSON with --json); a refusal is a FleetError either way (one line, exit 1)."""
    if as_json:
        print(json.dumps(reply, sort_keys=True), flush=True)
    if not reply.get("ok", True):
        raise FleetError(reply.get("error", "refused"))


def format_status(status: dict[str, Any], figures: bool = True) -> str:
    """The status as lines of text; ``figures=False`` leaves out what changes every frame."""
    lines = [f"fleet {status['fleet']}: {len(status['cameras'])} cameras, capacity {status['capacity']} per GPU "
             f"actor, controller start {status['controller_starts']}"
             + ("" if status.get("redis_ok", True) else " (Redis unreachable: the placement is not mirrored)")]
    for w in status["workers"]:
        lines.append(f"  gpu-{w['index']}: {w['state']} node {(w['node'] or '?')[:12]} "
                     f"cameras {', '.join(w['cameras']) or '-'}")
    for c in status["cameras"]:
        where = "-" if c["worker"] is None else f"gpu-{c['worker']}"
        extra = f" error: {c['error']}" if c["error"] else ""
        outage = f" last outage {c['last_outage_s']:.1f} s" if c["last_outage_s"] is not None else ""
        frames = f", {c['frames']} frames" if figures else ""
        lines.append(f"  {c['id']}: {c['status']} on {where}{frames}{outage}{extra}")
    return "\n".join(lines)


def cmd_up(args: argparse.Namespace) -> int:
    import ray

    spec = load_fleet(args.fleet_file)
    check_reachable(spec.broker, "broker", "zmtp")
    check_reachable(spec.redis, "Redis")
    redis = need("redis", "fleet")
    try:
        redis.Redis.from_url(spec.redis, socket_connect_timeout=3, socket_timeout=3).ping()
    except redis.RedisError as exc:
        raise FleetError(f"Redis {spec.redis} does not answer ({exc}); start it or fix the URL") from None
    if args.detach and not (args.address or os.environ.get("RAY_ADDRESS")):
        raise FleetError("--detach needs a Ray cluster that outlives this command: pass --address")
    local = _connect(args.address, start_local=True)
    stop = threading.Event()  # Ctrl-C from here on: finish cleanly (a local fleet is taken down)
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    gpus = int(ray.cluster_resources().get("GPU", 0))
    if spec.gpus_per_actor and gpus < 1:
        raise FleetError("this Ray cluster has no GPUs; start its nodes with `ray start --num-gpus N`, or set "
                         "gpus_per_actor: 0 for a CPU-only trial fleet")
    # The controller lives on the head node: a GPU node lost with the controller on it would cost its
    # cameras the controller's restart plus the liveness wait; the head's loss ends the cluster anyway.
    actor = ray.remote(FleetController).options(
        name=controller_name(spec.name), namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
        max_restarts=-1, max_task_retries=-1, num_cpus=0, resources={HEAD_RESOURCE: 0.001}, max_concurrency=8)
    controller = actor.remote(spec.redis, spec.name)
    reply = _call(controller.configure, spec.to_dict(), timeout_s=args.timeout)
    _print(reply, args.json)
    status = _wait_placed(controller, args.timeout, stop)
    if not args.json:
        print(format_status(status), flush=True)
    if args.detach:
        return 0
    last, printed = "", time.monotonic()
    while not stop.wait(2.0):  # a change of placement or state at once, the figures every 30 s
        try:
            status = _call(controller.status, timeout_s=args.timeout)
            text, shape = format_status(status), format_status(status, figures=False)
        except FleetError as exc:
            text = shape = f"fleet {spec.name}: {exc}"
        if not args.json and (shape != last or time.monotonic() - printed > 30):
            print(text, flush=True)
            printed = time.monotonic()
        last = shape
    if local:  # the local cluster ends with this process: take the fleet down cleanly first
        _call(controller.down, timeout_s=args.timeout)
        ray.kill(controller, no_restart=True)
        print(f"fleet {spec.name}: stopped (local Ray cluster)")
    return 0


def _wait_placed(controller, timeout_s: float, stop: threading.Event) -> dict[str, Any]:
    """Wait until every camera is running, retrying or waiting for capacity (not pending/starting)."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = _call(controller.status, timeout_s=timeout_s)
        settled = all(c["status"] in ("running", "retrying", "waiting") for c in status["cameras"])
        if settled or stop.is_set() or time.monotonic() > deadline:
            return status
        stop.wait(0.5)


def cmd_add(args: argparse.Namespace) -> int:
    cid, sep, uri = args.camera.partition("=")
    if not sep:
        raise FleetError(f"camera {args.camera!r}: write it as ID=URI, e.g. lobby=rtsp://cam-1/stream")
    camera = camera_from({"id": cid, "uri": uri, **({} if args.realtime is None else {"realtime": args.realtime})},
                         "fleet add")
    _connect(args.address)
    reply = _call(_controller(args.name).add, camera.to_dict(), timeout_s=args.timeout)
    _print(reply, args.json)
    if not args.json:
        print(f"camera {cid}: {'already in the fleet' if reply.get('already') else 'added'}")
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    _connect(args.address)
    reply = _call(_controller(args.name).remove, args.camera_id, timeout_s=args.timeout)
    _print(reply, args.json)
    if not args.json:
        print(f"camera {args.camera_id}: {'not in the fleet' if reply.get('absent') else 'removed'}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    _connect(args.address)
    status = _call(_controller(args.name).status, timeout_s=args.timeout)
    print(json.dumps(status, sort_keys=True) if args.json else format_status(status))
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    import ray

    _connect(args.address)
    try:
        controller = _controller(args.name)
    except FleetError:  # down already, or never up: what was asked for holds (as remove of an absent camera)
        print(f"fleet {args.name}: not running")
        return 0
    reply = _call(controller.down, timeout_s=args.timeout)
    if not reply.get("ok"):
        raise FleetError(f"fleet {args.name}: {reply['error']}")  # the controller stays, for the next try
    ray.kill(controller, no_restart=True)
    print(f"fleet {args.name}: stopped")
    return 0
