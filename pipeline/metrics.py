"""Prometheus metrics and health endpoints of a running pipeline (``--metrics 127.0.0.1:9108``), and
the one declaration of the metric families it and the viewer (``pipeline/viewer/metrics.py``) expose.

``/metrics`` is prometheus_client's text format, from a registry of the pipeline's own.
``/healthz`` answers 200 while the process starts (weights download, model load, compile) and then
while the loop runs (a frame or an idle poll within ``HEARTBEAT_S``), else 503; ``/readyz`` 200 once
the models are loaded and a source delivers, else 503. ``MetricsSink`` keeps them current: every
series of a source exists (at 0) from the moment it opens; a source that could not open or failed
for good has ``sapiens2_source_up`` 0, and one that ended or was removed leaves it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from sapiens2_client import wire
from stages.types import FrameResult

from .net.http import HttpService

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0)
HEARTBEAT_S = 10.0

C = TypeVar("C", Counter, Gauge, Histogram, Info)


@dataclass(frozen=True)
class Family(Generic[C]):
    """One metric family as exposed: name (a counter's without the ``_total`` Prometheus adds), help
    text, type, label names and, for a histogram, buckets."""

    name: str
    help: str
    type: type[C]
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None

    def make(self, registry: CollectorRegistry) -> C:
        """Its collector, registered in registry."""
        extra = {} if self.buckets is None else {"buckets": self.buckets}
        return self.type(self.name, self.help, self.labels, registry=registry, **extra)

    def sample(self, value: float) -> CounterMetricFamily | GaugeMetricFamily:
        """The family with one value and no labels, as a custom collector yields it at scrape time."""
        assert not self.labels and self.type in (Counter, Gauge), self
        family = CounterMetricFamily if self.type is Counter else GaugeMetricFamily
        return family(self.name, self.help, value=value)


# The pipeline's, counted where the frames are processed.
FRAMES = Family("sapiens2_frames", "frames processed", Counter, ("source",))
FRAMES_DROPPED = Family("sapiens2_frames_dropped", "frames a live source replaced before they were processed",
                        Counter, ("source",))
SOURCE_REOPENS = Family("sapiens2_source_reopens", "reconnects of a camera or stream", Counter, ("source",))
DECODE_ERRORS = Family("sapiens2_decode_errors", "packets skipped because they did not decode", Counter, ("source",))
STAGE_LATENCY = Family("sapiens2_stage_latency_seconds", "time of each stage per frame", Histogram, ("stage",),
                       LATENCY_BUCKETS)
CAPTURE_TO_OUTPUT = Family("sapiens2_capture_to_output_seconds",
                           "capture (or decode) of a frame to its results written by every sink", Histogram,
                           ("source",), LATENCY_BUCKETS)
SOURCE_UP = Family("sapiens2_source_up", "1 while the source delivers frames (health ok)", Gauge, ("source",))
SUBSCRIBERS = Family("sapiens2_subscribers", "ZeroMQ connections to the publisher", Gauge)
PUBLISHER_DROPPED = Family("sapiens2_publisher_dropped", "messages some subscriber's full queue refused", Counter,
                           ("kind",))
GPU_MEMORY = Family("sapiens2_gpu_memory_bytes", "device memory allocated by torch", Gauge, ("device",))
MODEL = Family("sapiens2_model", "what runs: tasks, model size, precision, device", Info)

# The viewer's: the same figures under the same names, read from the pipelines' messages (their help
# says so where that changes what they count), then what only the viewer knows.
PUBLISHED_FRAMES = replace(FRAMES, help="frames published (the status messages' count)")
STATUS_UP = replace(SOURCE_UP, help="1 while the source's status says ok")
REPORTED_PUBLISHER_DROPPED = replace(
    PUBLISHER_DROPPED, help="messages some subscriber's full queue refused, as this source's status reports it",
    labels=("source", "kind"))
CAPTURE_TO_PUBLISH = Family("sapiens2_capture_to_publish_seconds",
                            "capture (or decode) of a frame to its keypoints message built", Histogram, ("source",),
                            LATENCY_BUCKETS)
SOURCE_FPS = Family("sapiens2_source_fps", "frames per second the source's status reports", Gauge, ("source",))
VIEWER_MISSED = Family("sapiens2_viewer_missed", "keypoints messages this viewer did not receive (frame_index gaps "
                       "the source's drops do not explain)", Counter, ("source",))
VIEWER_RECEIVED = Family("sapiens2_viewer_received", "messages received from the publishers", Counter)
VIEWER_REFUSED = Family("sapiens2_viewer_refused", "received messages whose header is not the wire format", Counter)
VIEWER_FORWARDED = Family("sapiens2_viewer_forwarded", "messages sent to browsers", Counter)
VIEWER_SUPERSEDED = Family("sapiens2_viewer_superseded",
                           "messages a newer one replaced before a slow browser took it", Counter)
VIEWER_CLIENTS = Family("sapiens2_viewer_clients", "browsers connected", Gauge)
VIEWER_SOURCES = Family("sapiens2_viewer_sources", "sources heard from", Gauge)


class PipelineMetrics:
    """The collectors, in a registry of their own (tests and several pipelines in one process stay apart)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.frames = FRAMES.make(r)
        self.dropped = FRAMES_DROPPED.make(r)
        self.reopens = SOURCE_REOPENS.make(r)
        self.decode_errors = DECODE_ERRORS.make(r)
        self.stage_latency = STAGE_LATENCY.make(r)
        self.capture_to_output = CAPTURE_TO_OUTPUT.make(r)
        self.source_up = SOURCE_UP.make(r)
        self.subscribers = SUBSCRIBERS.make(r)
        self.publisher_dropped = PUBLISHER_DROPPED.make(r)
        self.gpu_memory = GPU_MEMORY.make(r)
        self.model = MODEL.make(r)
        self.ready = False  # models loaded
        self.heartbeat = 0.0  # monotonic time the loop last said it runs
        self.running = False  # the pipeline loop started (before: starting up, alive)
        self._seen: dict[tuple[str, str], int] = {}  # (metric, source) -> last cumulative value
        self._publisher: Any = None
        self._device: Any = None

    def describe_run(self, tasks: list[str], model_size: str, dtype: str, device: Any, random_weights: bool) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            ours = version("sapiens2-stream")
        except PackageNotFoundError:  # running from a checkout without an install
            ours = "unknown"
        self.model.info({"tasks": ",".join(tasks), "model_size": model_size, "dtype": str(dtype),
                         "device": str(device), "random_weights": str(bool(random_weights)).lower(), "version": ours})
        self._device = device

    def watch_publisher(self, publisher: Any) -> None:
        self._publisher = publisher
        if publisher is not None:  # every kind has a sample (0) from the start: rate() and alerts see them
            for kind in wire.KINDS:
                self.publisher_dropped.labels(kind)

    def add_source(self, source: str) -> None:
        """Its series exist from now on, down and at 0 until something happens (not only after the first
        event); a source that could not open stays so (sources that end or are removed leave source_up)."""
        self.source_up.labels(source).set(0)
        for counter in (self.frames, self.dropped, self.reopens, self.decode_errors):
            counter.labels(source)

    def beat(self) -> None:
        self.heartbeat = time.monotonic()

    def loop_started(self) -> None:
        """From now on /healthz follows the loop's heartbeat."""
        self.beat()
        self.running = True

    def _advance(self, counter: Counter, name: str, source: str, value: int) -> None:
        """A cumulative count (from a source) as a counter: add what it grew since the last look."""
        last = self._seen.get((name, source), 0)
        if value > last:
            counter.labels(source).inc(value - last)
        self._seen[(name, source)] = max(value, last)

    def observe(self, result: FrameResult) -> None:
        source = result.frame.source_id
        self.frames.labels(source).inc()
        for stage, ms in result.latency_ms.items():
            self.stage_latency.labels(stage).observe(ms / 1000.0)
        self.capture_to_output.labels(source).observe(max(0.0, (time.time_ns() - result.frame.capture_ns) / 1e9))
        drops = result.drops
        self._advance(self.dropped, "dropped", source, int(drops.get("source", 0)))
        self._advance(self.reopens, "reopens", source, int(drops.get("reopens", 0)))
        self._advance(self.decode_errors, "decode_errors", source, int(drops.get("decode_errors", 0)))
        self.source_up.labels(source).set(1)
        self.beat()

    def collect_now(self) -> None:
        """Figures read at scrape time: the publisher's counters, device memory."""
        publisher = self._publisher
        if publisher is not None:
            self.subscribers.set(publisher.connections)
            for kind, value in dict(publisher.stats.dropped).items():
                self._advance(self.publisher_dropped, "publisher_dropped", kind, int(value))
        device = self._device
        if device is not None and getattr(device, "type", "") == "cuda":
            import torch

            self.gpu_memory.labels(str(device)).set(torch.cuda.memory_allocated(device))

    # -- HTTP -------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        return app

    async def _metrics(self, request: web.Request) -> web.Response:
        self.collect_now()
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, request: web.Request) -> web.Response:
        if not self.running:
            return web.Response(status=200, text="starting\n")
        alive = time.monotonic() - self.heartbeat < HEARTBEAT_S
        return web.Response(status=200 if alive else 503, text="ok\n" if alive else "the pipeline loop stopped\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        up = [labels for labels, value in _gauge_values(self.source_up) if value >= 1]
        if not self.ready:
            return web.Response(status=503, text="models are loading\n")
        if not up:
            return web.Response(status=503, text="no source delivers frames yet\n")
        return web.Response(status=200, text="ready\n")

    def serve(self, listen: str) -> HttpService:
        return HttpService(self.app, listen, "metrics").start()


def _gauge_values(gauge: Gauge) -> list[tuple[dict, float]]:
    out = []
    for family in gauge.collect():
        for sample in family.samples:
            out.append((sample.labels, sample.value))
    return out
