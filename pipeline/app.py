"""Assembling a run from its config: checks, outputs, source, stages, display; returns the exit code.

The order is what makes bad input cheap: everything that can be checked without a model is
checked first (``preflight``: values, endpoints, output folders, files, keys, the detector model),
then the publisher binds (a taken port fails here), then the source opens (a missing camera or a
corrupt file fails in seconds), and only then do the models load. File outputs are created by
their first frame, so a run that fails to start never truncates an existing recording or
keypoint file.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import cv2
import numpy as np

from sapiens2_client.jsonl import JsonlError, LineWriter
from sapiens2_client.video import FRAGMENTED
from stages.annotate import MatteAnnotator, SkeletonAnnotator, compose_annotators
from stages.detector import check_detector_model
from stages.smoothing import KeypointSmoother
from stages.types import FrameResult

from .config import ConfigError, RunConfig
from .engine import FrameEngine
from .runner import Runner
from .sinks import Sink
from .sinks.jsonl import KeypointWriter
from .sinks.preview import PreviewWindow
from .sinks.publisher import ZmqPublisher, curve_for
from .sinks.recorder import RecorderError, VideoRecorder
from .sources import Source, open_source
from .stages_setup import Stages, build_stages, pick_device

log = logging.getLogger("sapiens2_stream")

RECORD_SUFFIXES = (*FRAGMENTED, ".mkv")


class Display:
    """Progress bar with fps for files; one rewritten status line for live sources. While it shows,
    log lines are printed above it instead of onto it."""

    def __init__(self, source: Source, enabled: bool, total: int | None) -> None:
        self.source, self.enabled, self.live = source, enabled, source.info.live
        self.bar = None
        self.last = 0.0
        self._handler: logging.Handler | None = None
        self._status_shown = False
        if enabled and not self.live:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="frame", file=sys.stderr, dynamic_ncols=True)
        if enabled:
            self._handler = _AboveDisplay(self)
            root = logging.getLogger()
            for handler in root.handlers:
                if getattr(handler, "stream", None) is sys.stderr:
                    self._handler.setFormatter(handler.formatter)
                    handler.addFilter(_mute)
            root.addHandler(self._handler)

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
        self._status_shown = True

    def write_line(self, text: str) -> None:
        """A log line above the bar or status line."""
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
            return
        prefix = "\r\033[K" if self._status_shown else ""
        sys.stderr.write(prefix + text + "\n")
        sys.stderr.flush()
        self._status_shown = False

    def on_idle(self, source: Source) -> None:
        if self.enabled and self.live and time.monotonic() - self.last >= 1.0:
            self.last = time.monotonic()
            self._status(None)

    def close(self) -> None:
        if self._handler is not None:
            root = logging.getLogger()
            root.removeHandler(self._handler)
            for handler in root.handlers:
                handler.removeFilter(_mute)
            self._handler = None
        if self.bar is not None:
            self.bar.close()
        elif self.enabled and self.live and self._status_shown:
            sys.stderr.write("\n")


class _AboveDisplay(logging.Handler):
    def __init__(self, display: Display) -> None:
        super().__init__()
        self.display = display

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.display.write_line(self.format(record))
        except Exception:  # a logging handler must never raise into the pipeline
            self.handleError(record)


def _mute(record: logging.LogRecord) -> bool:
    """Filter for the plain stderr handler while the display prints the records itself."""
    return False


# -- preflight ------------------------------------------------------------------------------
def _writable_target(path: Path) -> Path | None:
    """The existing file, or the nearest existing folder it would be created in."""
    if path.exists():
        return path
    return next((p for p in path.parents if p.exists()), None)


def check_output_path(path: str, what: str, suffixes: tuple[str, ...] | None = None) -> None:
    """ConfigError when ``path`` cannot be written (bad suffix, not a folder on the way, read-only)."""
    p = Path(path)
    if suffixes is not None and p.suffix.lower() not in suffixes:
        raise ConfigError(f"{what}: {path!r} must end in one of {', '.join(suffixes)}")
    if p.is_dir():
        raise ConfigError(f"{what}: {path!r} is a folder; name a file")
    target = _writable_target(p)
    if target is None or (target != p and not target.is_dir()):
        raise ConfigError(f"{what}: cannot create {path!r} ({target} is not a folder)")
    if not os.access(target, os.W_OK) or _read_only_mount(target):
        raise ConfigError(f"{what}: {target} is not writable; pick another path")


def _read_only_mount(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def preflight(cfg: RunConfig) -> None:
    """Everything that can be known wrong before a model loads; ConfigError (one line) if so."""
    if cfg.record:
        check_output_path(cfg.record, "record", RECORD_SUFFIXES)
    if cfg.save_keypoints:
        check_output_path(cfg.save_keypoints, "save_keypoints")
        try:
            LineWriter(cfg.save_keypoints).check()
        except JsonlError as exc:
            raise ConfigError(str(exc)) from None
    if "matting" in cfg.tasks:
        matte_background(cfg.matte_background)
    if cfg.detector == "yolo" and "pose" in cfg.tasks and cfg.detector_model != RunConfig.detector_model:
        from stages.detector import DetectorError

        try:
            check_detector_model(cfg.detector_model, cfg.trust_detector_model)
        except DetectorError as exc:
            raise ConfigError(f"detector_model: {exc}") from None
    if cfg.curve_dir and not Path(cfg.curve_dir).is_dir():
        raise ConfigError(f"curve_dir: {cfg.curve_dir!r} is not a folder; create keys with "
                          f"`sapiens2-stream keys {cfg.curve_dir}`")


def build_sinks(cfg: RunConfig, stop: threading.Event) -> list[Sink]:
    """The run's sinks; the publisher is bound here (before models load), files are created later."""
    sinks: list[Sink] = []
    endpoint = cfg.publish or cfg.publish_connect
    if endpoint:
        connect = cfg.publish_connect is not None
        publisher = ZmqPublisher(endpoint, connect=connect, jpeg_quality=cfg.jpeg_quality,
                                 curve=curve_for(cfg.curve_dir, connect, cfg.curve_client), gpu_jpeg=cfg.gpu_jpeg)
        publisher.bind()
        sinks.append(publisher)
    if cfg.record:
        sinks.append(VideoRecorder(cfg.record, codec=cfg.record_codec, fragment_s=cfg.record_fragment_s))
    if cfg.save_keypoints:
        sinks.append(KeypointWriter(cfg.save_keypoints))
    if cfg.show:
        sinks.append(PreviewWindow(stop))
    return sinks


def run_pipeline(cfg: RunConfig, stop: threading.Event | None = None) -> int:
    """Run until the source ends, max_frames, a stop request or an error. 0 on success."""
    stop = stop or threading.Event()
    preflight(cfg)
    device = pick_device(cfg.device)
    sinks = build_sinks(cfg, stop)
    source = None
    try:  # until the runner owns them, a setup failure must close the source and sinks here
        source = open_source(cfg.source, realtime=cfg.realtime, stall_timeout_s=cfg.stall_timeout_s,
                             source_id=cfg.source_id)
        stages = build_stages(cfg, device)
        runner, display = assemble(cfg, source, stages, sinks, stop)
    except BaseException:
        if source is not None:
            source.stop()
        for sink in sinks:
            sink.close()
        raise
    try:
        stats = runner.run()
    finally:
        display.close()
    if stats.error is not None:
        raise stats.error
    p95 = float(np.percentile(stats.latency_ms, 95)) if stats.latency_ms else 0.0
    errors = f", {source.decode_errors} corrupt packets skipped" if source.decode_errors else ""
    log.info("done: %d frames, %.1f fps, capture-to-output p95 %.0f ms, %d dropped%s%s", stats.frames, stats.fps,
             p95, source.frames_dropped, errors, " (RANDOM WEIGHTS)" if stages.random_weights else "")
    for sink in sinks:
        if isinstance(sink, VideoRecorder) and sink.frames_written:
            log.info("wrote %s (%d frames)", sink.path, sink.frames_written)
        elif isinstance(sink, KeypointWriter) and sink.lines_written:
            log.info("wrote %s (%d lines)", sink.path, sink.lines_written)
    return 0


def assemble(cfg: RunConfig, source: Source, stages: Stages, sinks: list[Sink],
             stop: threading.Event) -> tuple[Runner, Display]:
    """Annotation, engine and display around an opened source, loaded stages and built sinks."""
    for note in stages.notes:
        log.warning(note)
    info = source.info
    if stages.random_weights:
        log.warning("RANDOM WEIGHTS in use: outputs are meaningless (tests and offline demo only)")
        info = replace(info, random_weights=True)
    publisher = next((s for s in sinks if isinstance(s, ZmqPublisher)), None)
    always_image = any(isinstance(s, VideoRecorder | PreviewWindow) for s in sinks)
    annotator = compose_annotators(_annotation_layers(cfg)) if always_image or publisher is not None else None
    frame_topic = f"frame.{info.source_id}"

    def wants_image() -> bool:  # a frame nobody records, shows or subscribes to is not drawn
        return always_image or (publisher is not None and publisher.subscribed(frame_topic))

    smoother = KeypointSmoother(cfg.smooth_min_cutoff, cfg.smooth_beta) if cfg.smooth else None
    engine = FrameEngine(stages, cfg.kpt_threshold, cfg.detect_every, smoother, pinned=cfg.pinned_memory,
                         track=cfg.track)
    if cfg.compile != "off" or stages.device.type == "cuda":
        # Every input shape once before the first frame, each stage on the stream that runs it:
        # compiles, CUDA-graph recording and cuDNN autotuning happen here, not mid-stream.
        seconds = engine.warm_up(cfg.max_persons)
        stages.warmup_s = seconds
        log.info("%s %.1f s (%s)", "compile warm-up" if cfg.compile != "off" else "warm-up", sum(seconds.values()),
                 ", ".join(f"{t} {s:.1f} s" for t, s in seconds.items()))
    display = Display(source, cfg.progress, cfg.max_frames or source.frame_count)

    def on_result(result: FrameResult) -> None:
        display.on_result(result)

    def on_event(record: dict) -> None:
        details = ", ".join(f"{k} {v}" for k, v in record.items() if k not in ("event", "source_id", "time_ns"))
        log.warning("source %s: %s (%s)", record["source_id"], record["event"], details)

    log.info("source %s (%dx%d, %s) -> tasks %s on %s", info.source_id, info.width, info.height,
             "live" if info.live else "file", ",".join(cfg.tasks), stages.device)
    runner = Runner(source, engine, sinks, annotator, stages.random_weights, cfg.max_frames, on_result,
                    display.on_idle, stop, info, wants_image=wants_image, on_event=on_event)
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


__all__ = ["Display", "RecorderError", "assemble", "build_sinks", "matte_background", "preflight", "run_pipeline"]
