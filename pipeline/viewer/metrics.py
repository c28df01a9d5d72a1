"""Prometheus metrics and health of the viewer itself (``view --metrics``)."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

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


class ViewerMetrics:
    """/metrics (the counts above), /healthz (the server runs), /readyz (a publisher was heard)."""

    def __init__(self, server) -> None:
        self.server = server
        self.registry = CollectorRegistry()
        self.registry.register(_ViewerCollector(server))

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
