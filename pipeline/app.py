"""Assembling a run from its config: source, stages, sinks, display; returns the exit code."""

from __future__ import annotations

import logging
import sys
import threading
import time
from dataclasses import replace

import cv2
import numpy as np

from stages.annotate import MatteAnnotator, SkeletonAnnotator, compose_annotators
from stages.smoothing import KeypointSmoother
from stages.types import FrameResult

from .config import ConfigError, RunConfig
from .engine import FrameEngine
from .runner import Runner
from .sinks import Sink
from .sinks.jsonl import KeypointWriter
from .sinks.preview import PreviewWindow
from .sinks.publisher import CurveServerKeys, ZmqPublisher
from .sinks.recorder import VideoRecorder
from .sources import Source, open_source
from .stages_setup import Stages, build_stages

log = logging.getLogger("sapiens2_stream")


class Display:
    """Progress bar with fps for files; one rewritten status line for live sources."""

    def __init__(self, source: Source, enabled: bool, total: int | None) -> None:
        self.source, self.enabled, self.live = source, enabled, source.info.live
        self.bar = None
        self.last = 0.0
        if enabled and not self.live:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="frame", file=sys.stderr, dynamic_ncols=True)

    def on_result(self, result: FrameResult) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(1)
            return
        now = time.monotonic()
        if now - self.last >= 0.5:
            self.last = now
            self._status(result)

    def _status(self, result: FrameResult | None) -> None:
        lat = "" if result is None else " ".join(f"{k} {v:.0f}ms" for k, v in result.latency_ms.items())
        persons = 0 if result is None else len(result.detections)
        src = self.source
        sys.stderr.write(f"\r[{src.health}] frame {src.frames_decoded} drops {src.frames_dropped} "
                         f"reopens {src.reopens} persons {persons} {lat}\033[K")
        sys.stderr.flush()

    def on_idle(self, source: Source) -> None:
        if self.enabled and self.live and time.monotonic() - self.last >= 1.0:
            self.last = time.monotonic()
            self._status(None)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled and self.live:
            sys.stderr.write("\n")


def build_sinks(cfg: RunConfig, stop: threading.Event) -> list[Sink]:
    sinks: list[Sink] = []
    if cfg.record:
        sinks.append(VideoRecorder(cfg.record, codec=cfg.record_codec))
    if cfg.save_keypoints:
        sinks.append(KeypointWriter(cfg.save_keypoints))
    if cfg.publish:
        curve = CurveServerKeys.from_dir(cfg.curve_dir) if cfg.curve_dir else None
        sinks.append(ZmqPublisher(cfg.publish, jpeg_quality=cfg.jpeg_quality, curve=curve,
                                  gpu_jpeg=cfg.gpu_jpeg))
    if cfg.show:
        sinks.append(PreviewWindow(stop))
    return sinks


def run_pipeline(cfg: RunConfig, stop: threading.Event | None = None) -> int:
    """Run until the source ends, max_frames, a stop request or an error. 0 on success."""
    stop = stop or threading.Event()
    # The source first: a missing camera or a corrupt file fails in seconds, before any weights load.
    source = open_source(cfg.source, realtime=cfg.realtime, stall_timeout_s=cfg.stall_timeout_s,
                         source_id=cfg.source_id)
    try:  # until the runner owns the source, a setup failure must stop it here
        stages = build_stages(cfg)
        runner, display = assemble(cfg, source, stages, stop)
    except BaseException:
        source.stop()
        raise
    try:
        stats = runner.run()
    finally:
        display.close()
    if stats.error is not None:
        raise stats.error
    p95 = float(np.percentile(stats.latency_ms, 95)) if stats.latency_ms else 0.0
    log.info("done: %d frames, %.1f fps, capture-to-output p95 %.0f ms, %d dropped%s", stats.frames, stats.fps,
             p95, source.frames_dropped, " (RANDOM WEIGHTS)" if stages.random_weights else "")
    for path in (cfg.record, cfg.save_keypoints):
        if path:
            log.info("wrote %s", path)
    return 0


def assemble(cfg: RunConfig, source: Source, stages: Stages, stop: threading.Event) -> tuple[Runner, Display]:
    """Sinks, annotation, engine and display around an opened source and loaded stages."""
    for note in stages.notes:
        log.warning(note)
    info = source.info
    if stages.random_weights:
        log.warning("RANDOM WEIGHTS in use: outputs are meaningless (tests and offline demo only)")
        info = replace(info, random_weights=True)
    sinks = build_sinks(cfg, stop)
    publisher = next((s for s in sinks if isinstance(s, ZmqPublisher)), None)
    always_image = any(isinstance(s, VideoRecorder | PreviewWindow) for s in sinks)
    annotator = compose_annotators(_annotation_layers(cfg)) if always_image or publisher is not None else None
    frame_topic = f"frame.{info.source_id}"

    def wants_image() -> bool:  # a frame nobody records, shows or subscribes to is not drawn
        return always_image or (publisher is not None and publisher.subscribed(frame_topic))

    smoother = KeypointSmoother(cfg.smooth_min_cutoff, cfg.smooth_beta) if cfg.smooth else None
    engine = FrameEngine(stages, cfg.kpt_threshold, cfg.detect_every, smoother, pinned=cfg.pinned_memory)
    display = Display(source, cfg.progress, cfg.max_frames or _frame_count(source))

    def on_result(result: FrameResult) -> None:
        if publisher is not None:
            publisher.set_health(source.health)
        display.on_result(result)

    def on_idle(src: Source) -> None:
        if publisher is not None:
            publisher.set_health(src.health)
        display.on_idle(src)

    log.info("source %s (%dx%d, %s) -> tasks %s on %s", info.source_id, info.width, info.height,
             "live" if info.live else "file", ",".join(cfg.tasks), stages.device)
    runner = Runner(source, engine, sinks, annotator, stages.random_weights, cfg.max_frames, on_result, on_idle,
                    stop, info, wants_image=wants_image)
    return runner, display


def _annotation_layers(cfg: RunConfig) -> list:
    """The configured layers whose task runs, styled from the config (matte background, threshold)."""
    layer_task = {"matte": "matting", "seg": "seg", "pose": "pose", "boxes": "pose"}
    layers: list = []
    for layer in cfg.annotate:
        if layer in layer_task and layer_task[layer] not in cfg.tasks:
            continue
        if layer == "matte":
            layers.append(MatteAnnotator(matte_background(cfg.matte_background), cfg.matte_mode))
        elif layer == "pose":
            layers.append(SkeletonAnnotator(threshold=cfg.kpt_threshold))
        else:
            layers.append(layer)
    return layers


def matte_background(spec: str) -> tuple[int, int, int] | np.ndarray:
    """"R,G,B" -> a colour; anything else is an image file (read once, RGB)."""
    parts = spec.split(",")
    if len(parts) == 3 and all(p.strip().isdigit() for p in parts):
        r, g, b = (int(p) for p in parts)
        if max(r, g, b) > 255:
            raise ConfigError(f"matte_background: colour values must be 0..255, got {spec!r}")
        return r, g, b
    image = cv2.imread(spec, cv2.IMREAD_COLOR)
    if image is None:
        raise ConfigError(f"matte_background: {spec!r} is neither R,G,B nor a readable image file")
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


def _frame_count(source: Source) -> int | None:
    return getattr(source, "frame_count", None)
