"""The live viewer: a web page that shows what a pipeline publishes, for any browser on the network.

``ViewServer`` subscribes to publishers (or a broker) and serves with aiohttp: ``/`` and ``/static/<file>``
(the page, its script and style and the JavaScript client's browser build, from package data only, no
listing), ``/metadata.json`` (skeleton, keypoint groups, segmentation palette) and ``/ws``, a WebSocket of
the wire messages as they came (header checked, never decoded), each framed by ``pack``.

Each browser gets only the newest message of each topic (what it skipped is counted): the pictures of the
source it picks (``{"source": "cam0"}``; all until then), the keypoints and status of every source and
every rig's world steps; a topic other than ``status`` is subscribed only while watched. Loopback by
default; with ``--view-token`` the page, its WebSocket and figures need the token (``?token=`` or
``X-View-Token``; the static script and tables are public); requests a page of another site makes a
browser send are refused (``net.http``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hmac
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import zmq
import zmq.asyncio
from aiohttp import WSMsgType, web

from sapiens2_client import wire
from sapiens2_client.keys import CurveClientKeys
from stages.errors import ConfigError

from ..net.http import HttpService, is_loopback_host

log = logging.getLogger(__name__)

STATIC = {"viewer.js": "text/javascript", "world3d.js": "text/javascript", "viewer.css": "text/css",
          "sapiens2-client.browser.js": "text/javascript"}
PAGE_TOPICS = tuple(kind for kind in wire.KINDS if kind != "status")  # shown while watched; status: always
PICTURE_KINDS = frozenset(wire.IMAGE_KINDS)  # sent to a browser for the source it shows only
CLOSE_TIMEOUT_S = 2.0
Watcher = Callable[[str, dict[str, Any]], None]  # (kind, validated header) of every accepted message


@dataclass
class ViewerStats:
    received: int = 0  # upstream messages
    refused: int = 0  # upstream messages whose header is not a valid sapiens2.stream header
    forwarded: int = 0
    superseded: int = 0  # newer message of the same topic came before a browser took the older one
    clients: int = 0
    sources: dict[str, float] = field(default_factory=dict)  # source id -> last message time (loop clock)


class _Client:
    """One browser: the newest message of each topic, waiting to be sent, and the source it shows."""

    def __init__(self, ws: web.WebSocketResponse) -> None:
        self.ws = ws
        self.slots: dict[bytes, bytes] = {}
        self.wake = asyncio.Event()
        self.source: str | None = None  # None: pictures of every source (until the page picks one)
        self.sender: asyncio.Task | None = None

    def wants(self, kind: str, source_id: str) -> bool:
        return kind not in PICTURE_KINDS or self.source is None or source_id == self.source

    def show(self, source_id: str) -> None:
        """From now on, pictures of ``source_id`` only; the other sources' pictures waiting go."""
        self.source = source_id
        for topic in [t for t in self.slots if not self.wants(*_split(t))]:
            del self.slots[topic]


def _split(topic: bytes) -> tuple[str, str]:
    kind, _, source_id = topic.decode("ascii").partition(".")
    return kind, source_id


def pack(frames: list[bytes]) -> bytes:
    """The WebSocket framing of one multipart message (unpackFrames in the JavaScript client)."""
    out = [len(frames).to_bytes(4, "little")]
    for frame in frames:
        out += [len(frame).to_bytes(4, "little"), bytes(frame)]
    return b"".join(out)


def static_file(name: str) -> bytes:
    return resources.files("pipeline.viewer").joinpath("static", name).read_bytes()


def page_metadata() -> dict[str, Any]:
    """What the page needs to draw: links with colours, keypoint colours, groups, the seg palette."""
    from stages.metadata import load_metadata

    meta = load_metadata()
    return {
        "num_keypoints": meta.num_keypoints,
        "links": meta.skeleton_links.tolist(),
        "link_colors": meta.link_colors.tolist(),
        "keypoint_colors": meta.keypoint_colors.tolist(),
        "groups": {name: idx.tolist() for name, idx in meta.groups.items()},
        "seg_classes": meta.seg_class_names.tolist(),
        "seg_palette": meta.seg_palette.tolist(),
        "background_id": meta.background_id,
    }


class ViewServer:
    """See the module docstring. ``start()`` binds (ConfigError when it cannot), ``close()`` stops."""

    def __init__(self, endpoints: list[str], listen: str = "127.0.0.1:8080", token: str | None = None,
                 curve: CurveClientKeys | None = None, max_message_bytes: int = wire.DEFAULT_MAX_MESSAGE_BYTES,
                 kpt_threshold: float = 0.3) -> None:
        self.endpoints, self.token, self.curve = list(endpoints), token, curve
        self.limits = wire.Limits(max_message_bytes=max_message_bytes)
        self.kpt_threshold = kpt_threshold
        self.stats = ViewerStats()
        self._clients: set[_Client] = set()
        self._metadata = json.dumps(page_metadata()).encode()
        self._service = HttpService(self._app, listen, "viewer")
        if not is_loopback_host(self._service.host) and not token:
            log.warning("the viewer on %s has no --view-token: anyone who reaches it sees the streams",
                        self._service.host)
        self._sock: zmq.asyncio.Socket | None = None
        self._ctx: zmq.asyncio.Context | None = None
        self._reader: asyncio.Task | None = None
        self._subscribed: set[str] = set()
        self._watchers: list[Watcher] = []

    @property
    def url(self) -> str:
        return self._service.url

    def start(self) -> ViewServer:
        try:
            self._service.start()
        except ConfigError:  # it could not listen: the upstream socket its app opened goes too
            if self._sock is not None:
                self._sock.close(linger=0)
            if self._ctx is not None:
                self._ctx.term()
            raise
        return self

    def watch(self, watcher: Watcher) -> None:
        """Call ``watcher(kind, header)`` (on the server's loop) for every accepted message, and
        receive keypoints from now on even with no browser (their headers carry the stage latencies)."""
        def add() -> None:
            self._watchers.append(watcher)
            self._update_subscriptions()

        loop = self._service.loop
        if loop.is_running():
            loop.call_soon_threadsafe(add)
        else:
            add()

    def close(self) -> None:
        loop = self._service.loop
        if loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=10)
            except (concurrent.futures.CancelledError, concurrent.futures.TimeoutError) as exc:
                log.warning("viewer: closing the browsers' connections did not finish (%s); stopping anyway",
                            type(exc).__name__)
        self._service.stop()

    # -- the app ----------------------------------------------------------------------------
    async def _app(self) -> web.Application:
        self._ctx = zmq.asyncio.Context()
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 64)
        sock.setsockopt(zmq.MAXMSGSIZE, self.limits.max_message_bytes)
        if self.curve is not None:
            self.curve.apply(sock)
        sock.setsockopt(zmq.SUBSCRIBE, b"status.")
        for endpoint in self.endpoints:
            sock.connect(endpoint)
        self._sock = sock
        self._reader = asyncio.get_running_loop().create_task(self._read_upstream())
        app = web.Application(middlewares=[self._guard])
        app.router.add_get("/", self._page)
        app.router.add_get("/static/{name}", self._static)
        app.router.add_get("/metadata.json", self._meta)
        app.router.add_get("/ws", self._websocket)
        app.router.add_get("/stats.json", self._stats)
        return app

    @web.middleware
    async def _guard(self, request: web.Request, handler):
        """The token guards the streams and figures; the page's own code and tables are public."""
        if self.token and not request.path.startswith("/static/") and request.path != "/metadata.json":
            given = request.query.get("token") or request.headers.get("X-View-Token") or ""
            if not hmac.compare_digest(given.encode(), self.token.encode()):
                return web.Response(status=401, text="this viewer needs its token: open it with ?token=...\n")
        response = await handler(request)
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response

    async def _page(self, request: web.Request) -> web.Response:
        page = static_file("index.html").decode().replace("{{KPT_THRESHOLD}}", str(self.kpt_threshold))
        return web.Response(text=page, content_type="text/html")

    async def _static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in STATIC:
            raise web.HTTPNotFound()
        return web.Response(body=static_file(name), content_type=STATIC[name])

    async def _meta(self, request: web.Request) -> web.Response:
        return web.Response(body=self._metadata, content_type="application/json")

    async def _stats(self, request: web.Request) -> web.Response:
        s = self.stats
        return web.json_response({"received": s.received, "refused": s.refused, "forwarded": s.forwarded,
                                  "superseded": s.superseded, "clients": s.clients, "sources": sorted(s.sources)})

    async def _websocket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(heartbeat=20, max_msg_size=4096, compress=False)  # JPEG: compressed already
        await ws.prepare(request)
        client = _Client(ws)
        self._clients.add(client)
        self.stats.clients = len(self._clients)
        self._update_subscriptions()
        client.sender = asyncio.get_running_loop().create_task(self._send_to(client))
        try:
            async for msg in ws:  # the page says which source it shows; this also waits for it to go
                if msg.type == WSMsgType.ERROR:
                    break
                if msg.type == WSMsgType.TEXT:
                    self._on_page_message(client, msg.data)
        finally:
            await _stop_task(client.sender)
            self._clients.discard(client)
            self.stats.clients = len(self._clients)
            self._update_subscriptions()
        return ws

    @staticmethod
    def _on_page_message(client: _Client, text: str) -> None:
        try:
            message = json.loads(text)
        except ValueError:
            return
        source = message.get("source") if isinstance(message, dict) else None
        if isinstance(source, str):
            client.show(source)

    async def _send_to(self, client: _Client) -> None:
        try:
            while not client.ws.closed:
                await client.wake.wait()
                client.wake.clear()
                slots, client.slots = client.slots, {}
                for data in slots.values():
                    await client.ws.send_bytes(data)  # while this waits on a slow browser, slots refill
                    self.stats.forwarded += 1
        except (ConnectionResetError, RuntimeError, asyncio.CancelledError):
            return

    # -- upstream ---------------------------------------------------------------------------
    def _update_subscriptions(self) -> None:
        if self._sock is None:
            return
        want = set(PAGE_TOPICS) if self._clients else set()
        if self._watchers:
            want.add("keypoints")
        for topic in want - self._subscribed:
            self._sock.setsockopt(zmq.SUBSCRIBE, f"{topic}.".encode())
        for topic in self._subscribed - want:
            self._sock.setsockopt(zmq.UNSUBSCRIBE, f"{topic}.".encode())
        self._subscribed = want

    async def _read_upstream(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                frames = await self._sock.recv_multipart()
            except (zmq.ZMQError, asyncio.CancelledError):
                return
            self.stats.received += 1
            header = self._header(frames)
            if header is None:
                self.stats.refused += 1
                continue
            topic = bytes(frames[0])
            kind, source_id = header["kind"], header["source_id"]
            self.stats.sources[source_id] = loop.time()
            for watcher in self._watchers:
                watcher(kind, header)
            if kind not in PAGE_TOPICS and kind != "status" or not self._clients:
                continue  # keypoints for a watcher only, after the last browser went
            data = pack(frames)
            for client in list(self._clients):
                if not client.wants(kind, source_id):
                    continue
                if topic in client.slots:
                    self.stats.superseded += 1
                client.slots[topic] = data
                client.wake.set()

    def _header(self, frames: list[bytes]) -> dict[str, Any] | None:
        """The header of a message whose size and header follow the wire format, else None (images
        are the page's to decode)."""
        if len(frames) < 2 or sum(len(f) for f in frames) > self.limits.max_message_bytes:
            return None
        try:
            header = wire.load_header(bytes(frames[1]), self.limits)
            topic = bytes(frames[0]).decode("ascii")
        except (wire.WireError, UnicodeDecodeError):
            return None
        kind = header.get("kind")
        if (header.get("schema") != wire.SCHEMA or header.get("version") != wire.SCHEMA_VERSION
                or kind not in wire.KINDS or topic != f"{kind}.{header.get('source_id')}"):
            return None
        try:  # the fields the watchers read have their documented types
            wire.check_source_id(header["source_id"])
            (wire.check_status_fields if kind == "status" else wire.check_frame_fields)(header)
        except (ValueError, wire.WireError):
            return None
        return header

    async def _shutdown(self) -> None:
        """Stop every send, close every WebSocket (bounded), then the upstream socket."""
        clients = list(self._clients)
        for client in clients:
            await _stop_task(client.sender)
        for client in clients:
            try:
                await asyncio.wait_for(client.ws.close(), CLOSE_TIMEOUT_S)
            except (asyncio.TimeoutError, ConnectionError, RuntimeError):
                pass
            except asyncio.CancelledError:  # aiohttp's close raises it when the page's handler ends first
                if asyncio.current_task().cancelling():
                    raise  # this shutdown itself was cancelled
        await _stop_task(self._reader)
        if self._sock is not None:
            self._sock.close(linger=0)
        if self._ctx is not None:
            self._ctx.term()


async def _stop_task(task: asyncio.Task | None) -> None:
    """Cancel ``task`` and wait until it has ended (a task left pending is destroyed with the loop)."""
    if task is None or task.done():
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
