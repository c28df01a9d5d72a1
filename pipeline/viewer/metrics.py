"""Prometheus metrics and health of the viewer (``view --metrics``): the pipelines' figures, as their
messages tell them, and the viewer's own counts.

The figures of the pipelines it watches, under the names of the pipeline's own ``--metrics``
(``pipeline/metrics.py``), read from the messages the viewer receives (so ``--metrics`` makes the
viewer subscribe to ``keypoints`` too, small messages without images):

    sapiens2_frames_total{source}                   frames published (the status messages' ``frames``)
    sapiens2_frames_dropped_total{source}           frames a live source replaced (status ``drops.source``)
    sapiens2_source_reopens_total{source}           reconnects of a camera or stream (status ``drops.reopens``)
    sapiens2_decode_errors_total{source}            packets that did not decode (status ``drops.decode_errors``)
    sapiens2_stage_latency_seconds{stage}           histogram per stage, from each keypoints header's latency_ms
    sapiens2_capture_to_publish_seconds{source}     histogram: capture_ns to publish_ns of each keypoints message
    sapiens2_source_up{source}                      1 while the source's status says ok, else 0
    sapiens2_source_fps{source}                     frames per second, as the status says
    sapiens2_publisher_dropped_total{source, kind}  the publisher's ``drops.publish_<kind>``, as that source's
                                                    status reports it (one publisher's count shows under each
                                                    of its sources: do not sum over sources)
    sapiens2_viewer_missed_total{source}            keypoints messages this viewer did not receive: gaps in
                                                    frame_index that the source's drops do not explain

A count that goes back (a pipeline restarted under the same source id) starts over: what it
counts then is added. Not here, because no message carries them: the pipeline's subscriber
count, GPU memory and model info (scrape the pipeline's own ``--metrics`` for those).

The viewer's own: ``sapiens2_viewer_received/refused/forwarded/superseded_total``,
``sapiens2_viewer_clients`` (browsers connected), ``sapiens2_viewer_sources``.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..metrics import LATENCY_BUCKETS
from ..net.http import HttpService


class _ViewerCollector:
    """Reads the server's own counts at scrape time."""

    def __init__(self, server) -> None:
        self.server = server

    def collect(self):
        s = self.server.stats
        for name, doc, value in (
            ("sapiens2_viewer_received", "messages received from the publishers", s.received),
            ("sapiens2_viewer_refused", "received messages whose header is not the wire format", s.refused),
            ("sapiens2_viewer_forwarded", "messages sent to browsers", s.forwarded),
            ("sapiens2_viewer_superseded", "messages a newer one replaced before a slow browser took it",
             s.superseded),
        ):
            yield CounterMetricFamily(name, doc, value=value)
        yield GaugeMetricFamily("sapiens2_viewer_clients", "browsers connected", value=s.clients)
        yield GaugeMetricFamily("sapiens2_viewer_sources", "sources heard from", value=len(s.sources))


class StreamFigures:
    """The pipelines' figures from their message headers (see the module docstring).
    ``observe(kind, header)`` takes headers the server validated (wire.check_*_fields)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.frames = Counter("sapiens2_frames", "frames published (the status messages' count)", ["source"],
                              registry=r)
        self.dropped = Counter("sapiens2_frames_dropped", "frames a live source replaced before they were processed",
                               ["source"], registry=r)
        self.reopens = Counter("sapiens2_source_reopens", "reconnects of a camera or stream", ["source"], registry=r)
        self.decode_errors = Counter("sapiens2_decode_errors", "packets skipped because they did not decode",
                                     ["source"], registry=r)
        self.stage_latency = Histogram("sapiens2_stage_latency_seconds", "time of each stage per frame", ["stage"],
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.capture_to_publish = Histogram("sapiens2_capture_to_publish_seconds",
                                            "capture (or decode) of a frame to its keypoints message built",
                                            ["source"], buckets=LATENCY_BUCKETS, registry=r)
        self.source_up = Gauge("sapiens2_source_up", "1 while the source's status says ok", ["source"], registry=r)
        self.fps = Gauge("sapiens2_source_fps", "frames per second the source's status reports", ["source"],
                         registry=r)
        self.publisher_dropped = Counter("sapiens2_publisher_dropped", "messages some subscriber's full queue "
                                         "refused, as this source's status reports it", ["source", "kind"],
                                         registry=r)
        self.missed = Counter("sapiens2_viewer_missed", "keypoints messages this viewer did not receive (frame_index "
                              "gaps the source's drops do not explain)", ["source"], registry=r)
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
