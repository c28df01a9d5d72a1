"""Prometheus metrics and health of the viewer (``view --metrics``): the pipelines' figures, as their
messages tell them, and the viewer's own counts (the families: ``pipeline/metrics.py``).

The pipelines' figures carry the names of the pipeline's own ``--metrics``, read from the messages
the viewer receives (so ``--metrics`` makes it subscribe to ``keypoints`` too, small messages
without images): from each status message its ``frames``, ``fps``, health and ``drops`` (``source``,
``reopens``, ``decode_errors``, ``publish_<kind>``: one publisher's count shows under each of its
sources, so do not sum ``sapiens2_publisher_dropped_total`` over sources); from each keypoints
message its ``latency_ms``, capture to publish time, and the ``frame_index`` gaps its drops do not
explain (``sapiens2_viewer_missed_total``). A count that goes back (a pipeline restarted under the
same source id) starts over. No message carries the subscriber count, GPU memory or model info:
scrape the pipeline for those.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..metrics import (
    CAPTURE_TO_PUBLISH,
    DECODE_ERRORS,
    FRAMES_DROPPED,
    PUBLISHED_FRAMES,
    REPORTED_PUBLISHER_DROPPED,
    SOURCE_FPS,
    SOURCE_REOPENS,
    STAGE_LATENCY,
    STATUS_UP,
    VIEWER_CLIENTS,
    VIEWER_FORWARDED,
    VIEWER_MISSED,
    VIEWER_RECEIVED,
    VIEWER_REFUSED,
    VIEWER_SOURCES,
    VIEWER_SUPERSEDED,
)
from ..net.http import HttpService


class _ViewerCollector:
    """Reads the server's own counts at scrape time."""

    def __init__(self, server) -> None:
        self.server = server

    def collect(self):
        s = self.server.stats
        for family, value in ((VIEWER_RECEIVED, s.received), (VIEWER_REFUSED, s.refused),
                              (VIEWER_FORWARDED, s.forwarded), (VIEWER_SUPERSEDED, s.superseded),
                              (VIEWER_CLIENTS, s.clients), (VIEWER_SOURCES, len(s.sources))):
            yield family.sample(value)


class StreamFigures:
    """The pipelines' figures from their message headers (see the module docstring).
    ``observe(kind, header)`` takes headers the server validated (wire.check_*_fields)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.frames = PUBLISHED_FRAMES.make(r)
        self.dropped = FRAMES_DROPPED.make(r)
        self.reopens = SOURCE_REOPENS.make(r)
        self.decode_errors = DECODE_ERRORS.make(r)
        self.stage_latency = STAGE_LATENCY.make(r)
        self.capture_to_publish = CAPTURE_TO_PUBLISH.make(r)
        self.source_up = STATUS_UP.make(r)
        self.fps = SOURCE_FPS.make(r)
        self.publisher_dropped = REPORTED_PUBLISHER_DROPPED.make(r)
        self.missed = VIEWER_MISSED.make(r)
        self._seen: dict[tuple[str, ...], int] = {}  # (metric, labels...) -> last cumulative value
        self._last_keypoints: dict[str, tuple[int, int]] = {}  # source -> (frame_index, drops.source)

    def _advance(self, counter: Counter, name: str, labels: tuple[str, ...], value: int) -> None:
        """A cumulative count as a counter: add what it grew; a count that went back started over.
        The series exists (at 0) from the first look, so a scrape shows that nothing was lost."""
        last = self._seen.get((name, *labels))
        grown = value if last is None or value < last else value - last
        child = counter.labels(*labels)
        if grown:
            child.inc(grown)
        self._seen[(name, *labels)] = value

    def observe(self, kind: str, header: dict[str, Any]) -> None:
        source = header["source_id"]
        if kind == "status":
            self._status(source, header)
        elif kind == "keypoints":
            self._keypoints(source, header)

    def _status(self, source: str, h: dict[str, Any]) -> None:
        drops = h.get("drops", {})
        self._advance(self.frames, "frames", (source,), h["frames"])
        self._advance(self.dropped, "dropped", (source,), drops.get("source", 0))
        self._advance(self.reopens, "reopens", (source,), drops.get("reopens", 0))
        self._advance(self.decode_errors, "decode_errors", (source,), drops.get("decode_errors", 0))
        for key, value in drops.items():
            if key.startswith("publish_"):
                self._advance(self.publisher_dropped, "publisher_dropped", (source, key[len("publish_"):]), value)
        self.source_up.labels(source).set(1 if h["health"] == "ok" else 0)
        self.fps.labels(source).set(float(h["fps"]))

    def _keypoints(self, source: str, h: dict[str, Any]) -> None:
        for stage, ms in h.get("latency_ms", {}).items():
            self.stage_latency.labels(stage).observe(float(ms) / 1000.0)
        capture, publish = h.get("capture_ns"), h.get("publish_ns")
        if isinstance(capture, int) and isinstance(publish, int) and capture > 0:
            self.capture_to_publish.labels(source).observe(max(0.0, (publish - capture) / 1e9))
        index, dropped = h["frame_index"], h.get("drops", {}).get("source", 0)
        last = self._last_keypoints.get(source)
        missed = self.missed.labels(source)
        if last is not None and index > last[0] + 1:
            gap, explained = index - last[0] - 1, max(0, dropped - last[1])
            if gap > explained:
                missed.inc(gap - explained)
        self._last_keypoints[source] = (index, dropped)


class ViewerMetrics:
    """/metrics (the figures above), /healthz (the server runs), /readyz (a publisher was heard)."""

    def __init__(self, server) -> None:
        self.server = server
        self.registry = CollectorRegistry()
        self.registry.register(_ViewerCollector(server))
        self.figures = StreamFigures(self.registry)
        server.watch(self.figures.observe)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        return app

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        ready = bool(self.server.stats.sources)
        return web.Response(status=200 if ready else 503, text="ready\n" if ready else "no publisher heard yet\n")

    def serve(self, listen: str) -> HttpService:
        return HttpService(self.app, listen, "viewer metrics").start()
