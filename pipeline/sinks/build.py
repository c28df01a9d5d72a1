"""A run's outputs from its config, built in one place: every sink, and the servers beside them."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from pipeline.cli.config import RunConfig
from pipeline.cli.preflight import expand
from pipeline.sinks import PerSource, Sink
from pipeline.sinks.curve import curve_for
from pipeline.sinks.jsonl import KeypointWriter
from pipeline.sinks.preview import PreviewWindow
from pipeline.sinks.publisher import ZmqPublisher
from pipeline.sinks.recorder import VideoRecorder
from pipeline.sinks.trc import TrcExport
from pipeline.sinks.world import WorldWriter

log = logging.getLogger("sapiens2_stream")

VIEW_FEED = "the web view's own feed (raw frames for the page, apart from any --publish) is"


@dataclass
class Outputs:
    """Where a run's results go: ``sinks`` in the order each frame reaches them, the servers started for
    them (``services``: metrics, web view; closed by ``close``), the metrics they keep (``--metrics``)."""

    sinks: list[Sink] = field(default_factory=list)
    services: list[Any] = field(default_factory=list)
    metrics: Any = None  # a pipeline.metrics.PipelineMetrics (imported only with --metrics)

    def each(self) -> list[Sink]:
        """Every sink, a PerSource's own ones included."""
        out: list[Sink] = []
        for sink in self.sinks:
            out.extend([*sink.finished, *sink.sinks.values()] if isinstance(sink, PerSource) else [sink])
        return out

    def wrote(self) -> list[str]:
        """A line for each file a sink wrote (what the run's summary says)."""
        lines = []
        for sink in self.each():
            frames, written = getattr(sink, "frames_written", 0), getattr(sink, "lines_written", 0)
            if frames:
                lines.append(f"wrote {sink.path} ({frames} frames)")
            elif written:
                lines.append(f"wrote {sink.path} ({written} lines)")
        return lines

    def close_sinks(self) -> None:
        for sink in self.sinks:
            sink.close()

    def close_services(self) -> None:
        for service in reversed(self.services):
            closer = getattr(service, "close", None) or getattr(service, "stop")
            try:
                closer()
            except Exception as exc:  # a server that fails to stop must not hide the run's outcome
                log.debug("stopping %s failed: %s", type(service).__name__, exc)
        self.services.clear()


def build_outputs(cfg: RunConfig, stop: threading.Event, several: bool = False) -> Outputs:
    """Every output of a run: the metrics server first (an orchestrator sees the models load), the
    publisher bound (a taken port fails here, before models load), the web view, then the file sinks,
    which create their files with their first frame (a run that fails to start truncates nothing).
    With ``{source}`` in a path each source gets a file of its own; one keypoint file for several
    sources tags each line with its source. On an error what was built is closed again."""
    out = Outputs()
    try:
        _metrics(cfg, out)
        endpoint = cfg.publish or cfg.publish_connect
        if endpoint:
            connect = cfg.publish_connect is not None
            publisher = ZmqPublisher(endpoint, connect=connect, jpeg_quality=cfg.jpeg_quality,
                                     curve=curve_for(cfg.curve_dir, connect, cfg.curve_client),
                                     gpu_jpeg=_gpu_jpeg(cfg),
                                     raw_frames=cfg.publish_raw_frames)
            publisher.bind()
            out.sinks.append(publisher)
            if out.metrics is not None:
                out.metrics.watch_publisher(publisher)
        if cfg.record:
            record, codec, fragment = cfg.record, cfg.record_codec, cfg.record_fragment_s
            out.sinks.append(PerSource(lambda info: VideoRecorder(expand(record, info.source_id), codec=codec,
                                                                  fragment_s=fragment), uses_image=True))
        if cfg.save_keypoints:
            if "{source}" in cfg.save_keypoints:
                path = cfg.save_keypoints
                out.sinks.append(PerSource(lambda info: KeypointWriter(expand(path, info.source_id))))
            else:
                out.sinks.append(KeypointWriter(cfg.save_keypoints, tag_source=several))
        if cfg.show:
            out.sinks.append(PerSource(lambda info: PreviewWindow(stop), uses_image=True))
        _view(cfg, out)
        if out.metrics is not None:
            from pipeline.sinks.metrics import MetricsSink

            out.sinks.append(MetricsSink(out.metrics))
        if cfg.triangulate and cfg.save_world:
            out.sinks.append(WorldWriter(cfg.save_world))
        if cfg.triangulate and cfg.export_trc:
            out.sinks.append(TrcExport(cfg.export_trc, cfg.trc_up, cfg.save_world))
    except BaseException:
        out.close_sinks()
        out.close_services()
        raise
    return out


def _gpu_jpeg(cfg: RunConfig) -> str | bool:
    """The device that JPEG-encodes published frames (the run's own: the encoder runs on the sink
    thread, whose current CUDA device is not the run's), or False: on the CPU."""
    wanted = cfg.gpu_jpeg if cfg.gpu_jpeg is not None else cfg.device != "cpu"
    return (cfg.device if cfg.device != "cpu" else "auto") if wanted else False


def _metrics(cfg: RunConfig, out: Outputs) -> None:
    """/metrics, /healthz and /readyz from the start. (Imported here: aiohttp and prometheus_client cost a
    run without them 0.2 s.)"""
    if cfg.metrics is None:
        return
    from pipeline.metrics import PipelineMetrics

    out.metrics = PipelineMetrics()
    out.metrics.beat()
    out.services.append(out.metrics.serve(cfg.metrics))


def _view(cfg: RunConfig, out: Outputs) -> None:
    """``--view``: a publisher of raw frames on a free loopback port (the page draws every layer), and the
    web viewer reading it."""
    if cfg.view is None:
        return
    from pipeline.viewer.server import ViewServer

    feed = ZmqPublisher("tcp://127.0.0.1:*", jpeg_quality=cfg.jpeg_quality, raw_frames=True, announce=VIEW_FEED)
    feed.bind()
    out.sinks.append(feed)
    server = ViewServer([feed.endpoint], cfg.view, cfg.view_token, kpt_threshold=cfg.kpt_threshold).start()
    out.services.append(server)
    log.info("web view: %s/%s", server.url, "?token=..." if cfg.view_token else "")
