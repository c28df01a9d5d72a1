"""Assembling a run from its config: checks, outputs, sources, stages, display; returns the exit code.

The order is what makes bad input cheap: everything that can be checked without a model first
(``pipeline.cli.preflight.check_run``), then the outputs (the publisher binds: a taken port fails here),
then the sources open (a missing camera or a corrupt file fails in seconds), and only then do the
models load. File outputs are created by their first frame, so a run that fails to start never
truncates an existing recording or keypoint file.
"""

from __future__ import annotations

import logging
import sys
import threading

from pipeline.cli.config import ConfigError, RunConfig
from pipeline.cli.preflight import Checked, check_run, matte_background
from pipeline.cli.sourcespecs import SourceSpec
from pipeline.cli.terminal import Display
from pipeline.mocap.setup import world_setup
from pipeline.run.build import Stages, build_stages, pick_device
from pipeline.run.engine import FrameEngine
from pipeline.run.runner import Runner
from pipeline.run.sinkthread import SourceStats
from pipeline.sinks import Sink
from pipeline.sinks.build import Outputs, build_outputs
from pipeline.sinks.publisher import ZmqPublisher
from pipeline.sources import Source, SourceError, open_source
from stages.annotate import compose_annotators
from stages.keypoints3d import Lift
from stages.metadata import load_metadata
from stages.smoothing import KeypointSmoother
from stages.tasks import TASKS, load, person_task
from stages.types import FrameResult

log = logging.getLogger("sapiens2_stream")

def open_sources(cfg: RunConfig, specs: list[SourceSpec]) -> tuple[list[Source], dict[str, str]]:
    """Open every source (in parallel: a slow camera does not hold the others up). Returns the ones
    that opened and, for the others, why not; SourceError when none opened."""
    results: dict[int, Source | SourceError] = {}

    def open_one(i: int, spec: SourceSpec) -> None:
        try:
            results[i] = open_spec(cfg, spec)
        except SourceError as exc:
            results[i] = exc
        except Exception as exc:  # a bug, not a bad source: still this source's failure, never a silent loss
            log.debug("opening %s failed", spec.uri, exc_info=True)
            results[i] = SourceError(f"{spec.uri}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=open_one, args=(i, spec), daemon=True) for i, spec in enumerate(specs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    opened = [r for _, r in sorted(results.items()) if isinstance(r, Source)]
    failed = {specs[i].id or specs[i].uri: str(r) for i, r in sorted(results.items()) if isinstance(r, SourceError)}
    if not opened:
        first = next(r for _, r in sorted(results.items()) if isinstance(r, SourceError))
        if len(specs) == 1:
            raise first
        raise SourceError(f"none of the {len(specs)} sources opened; first: {first}")
    for name, why in failed.items():
        log.error("source %s did not open: %s; the other sources go on", name, why)
    ids = [s.info.source_id for s in opened]
    if len(set(ids)) != len(ids):
        for source in opened:
            source.stop()
        raise ConfigError(f"two sources are both called {next(i for i in ids if ids.count(i) > 1)!r}; name them "
                          "with NAME=SPEC")
    return opened, failed


def open_spec(cfg: RunConfig, spec: SourceSpec) -> Source:
    """Open one source of the run with its own settings where it has them."""
    realtime = cfg.realtime if spec.realtime is None else spec.realtime
    stall = cfg.stall_timeout_s if spec.stall_timeout_s is None else float(spec.stall_timeout_s)
    return open_source(spec.uri, realtime=realtime, stall_timeout_s=stall, source_id=spec.id)


def run_pipeline(cfg: RunConfig, stop: threading.Event | None = None, checked: Checked | None = None) -> int:
    """Run until every source ended, max_frames, a stop request or an error. 0 on success; raises
    (one line) when a source failed, after the others finished and every output was finalised.
    ``checked``: the run's input as ``check_run`` found it (the command line checks before it imports
    this module); checked here when not given."""
    stop = stop or threading.Event()
    checked = checked or check_run(cfg)
    specs, rig = checked.specs, checked.rig
    device = pick_device(cfg.device)
    outputs = Outputs()
    sources: list[Source] = []
    try:  # until the runner owns them, a setup failure must close the sources and outputs here
        outputs = build_outputs(cfg, stop, several=len(specs) > 1 or cfg.control is not None)
        metrics = outputs.metrics
        sources, failed_at_start = open_sources(cfg, specs)
        world = world_setup(cfg, rig, sources)  # the calibration checked against the frame sizes
        if metrics is not None:
            for name in failed_at_start:  # a series at 0 for each: an alert on source_up sees it
                metrics.add_source(name)
        stages = build_stages(cfg, device)
        runner, display = assemble(cfg, sources, stages, outputs.sinks, stop, max_frames_per_step=len(specs),
                                   world=world)
        if metrics is not None:
            def describe() -> None:  # the precision each stage computes in, as resolved (and after a fallback)
                metrics.describe_run(cfg.tasks, cfg.model_size, precision(stages), stages.device,
                                     stages.random_weights)

            describe()
            runner.engine.on_precision_change = describe
            metrics.ready = True
            idle = runner.on_idle
            runner.on_idle = lambda source: (metrics.beat(), idle and idle(source))
        if cfg.control is not None:
            from pipeline.net.control import ControlServer

            outputs.services.append(ControlServer(cfg.control, runner, lambda spec: open_spec(cfg, spec)))
            runner.keep_alive = True
            runner.idle_note = f"every source has ended; the control endpoint {cfg.control} waits for more " \
                               "(Ctrl-C to stop)"
        if cfg.view is not None:  # the page shows the last picture and the end instead of losing its server
            runner.keep_alive = True
            runner.idle_note = f"every source has ended; the web view stays up on {cfg.view} (Ctrl-C to stop)"
    except BaseException:
        for source in sources:
            source.stop()
        outputs.close_sinks()
        outputs.close_services()
        raise
    if metrics is not None:
        metrics.loop_started()
    try:
        stats = runner.run()
    finally:
        stages.close()
        outputs.close_services()
        display.close()
    if stats.error is not None:
        raise stats.error
    _summary(stats, runner.every_source(), stages.random_weights)
    for line in outputs.wrote():
        log.info("%s", line)
    failed = {**failed_at_start, **stats.failed}
    if failed:
        names = ", ".join(f"{name} ({why})" for name, why in failed.items())
        raise SourceError(f"{len(failed)} of {len(specs)} sources failed: {names}")
    return 0


def precision(stages: Stages) -> str:
    """The dtype the models compute in (``float16,bfloat16`` when a stage fell back), or ``none``."""
    dtypes = {str(est.model.dtype).removeprefix("torch.") for est in stages.estimators.values()}
    return ",".join(sorted(dtypes)) or "none"


def _summary(stats, sources: list[Source], random_weights: bool) -> None:
    label = " (RANDOM WEIGHTS)" if random_weights else ""
    if len(stats.per_source) <= 1 and len(sources) == 1:
        source = sources[0]
        f = stats.per_source.get(source.info.source_id, SourceStats()).summary()
        errors = f", {source.decode_errors} corrupt packets skipped" if source.decode_errors else ""
        log.info("done: %d frames, %.1f fps, %s, %d dropped%s%s%s", stats.frames, stats.fps, _latency(source, f),
                 source.frames_dropped, _why_dropped(source), errors, label)
        return
    by_id = {s.source_id: s for s in sources}
    mean_batch = stats.batched_frames / stats.steps if stats.steps else 0.0
    log.info("done: %d frames from %d sources in %d batched steps (%.2f frames per step), %.1f fps in all%s",
             stats.frames, len(stats.per_source), stats.steps, mean_batch, stats.fps, label)
    for sid, per in sorted(stats.per_source.items()):
        f = per.summary()
        source = by_id.get(sid)
        extra = "" if source is None else \
            f", {source.frames_dropped} dropped, {source.reopens} reopens{_why_dropped(source)}"
        log.info("  %s: %d frames, %.1f fps while it gave frames, %s%s", sid, f["frames"], f["fps"],
                 _latency(source, f), extra)


def _latency(source: Source | None, f: dict[str, float]) -> str:
    """A source's latency as what it is: a camera's from its capture; a file's from its release, the wait in
    the read-ahead queue (a file is decoded ahead of the models: its frames queue up) named apart."""
    if source is not None and not source.info.live:
        return (f"latency p95 {f['pipeline_p95_ms']:.0f} ms in the pipeline + {f['queue_p95_ms']:.0f} ms waiting in "
                "the file's read-ahead queue")
    return f"capture-to-output p50 {f['p50_ms']:.0f} ms, p95 {f['p95_ms']:.0f} ms"


def _why_dropped(source: Source) -> str:
    """Why a live source drops frames: said once, beside the count."""
    return " (live: the newest frame wins while the models are busy)" if source.info.live and source.frames_dropped \
        else ""


def assemble(cfg: RunConfig, sources: Source | list[Source], stages: Stages, sinks: list[Sink],
             stop: threading.Event, max_frames_per_step: int = 1, world=None) -> tuple[Runner, Display]:
    """Annotation, engine and display around opened sources, loaded stages and built sinks."""
    sources = sources if isinstance(sources, list) else [sources]
    for note in stages.notes:
        log.warning(note)
    if stages.random_weights:
        if stages.fallback is None:  # (a fallback's line said so already)
            log.warning("RANDOM WEIGHTS in use: outputs are meaningless (tests and offline demo only)")
        for source in sources:
            source.mark_random_weights()
    for sink in sinks:  # status messages say how persons are found (a viewer explains "1 person" of a crowd)
        if isinstance(sink, ZmqPublisher):
            sink.detector = getattr(stages.detector, "kind", None)
    # the publisher that sends annotated frames (a raw-frames one, the --view feed included, draws nothing)
    publisher = next((s for s in sinks if isinstance(s, ZmqPublisher) and not s.raw_frames), None)
    always_image = any(getattr(s, "uses_image", False) for s in sinks)  # recordings, previews
    annotator = compose_annotators(_annotation_layers(cfg)) if always_image or publisher is not None else None

    def wants_image(result: FrameResult) -> bool:  # a frame nobody records, shows or subscribes to is not drawn
        return always_image or (publisher is not None and publisher.wants(f"frame.{result.frame.source_id}"))

    smoother = KeypointSmoother(cfg.smooth_min_cutoff, cfg.smooth_beta) if cfg.smooth else None
    engine = FrameEngine(stages, cfg.kpt_threshold, cfg.detect_every, smoother, pinned=cfg.pinned_memory,
                         track=cfg.track, keypoints3d=lift_of(cfg), pointmap_every=cfg.pointmap_every,
                         beta3d=cfg.smooth_beta3d)
    if stages.device.type == "cuda" or any(est.needs_warm_up for est in stages.estimators.values()):
        # Before the first frame, each stage on the stream that runs it: every fast path checked against
        # eager, every input shape run once (CUDA graphs captured, cuDNN tuned); compiling starts after.
        persons = getattr(stages.detector, "persons_per_frame", None) or cfg.max_persons  # full frame: one
        seconds = engine.warm_up(persons * max(1, max_frames_per_step), max(1, max_frames_per_step),
                                 tuple((s.info.height, s.info.width) for s in sources))
        stages.warmup_s = seconds
        log.info("warm-up %.1f s (%s)%s", sum(seconds.values()),
                 ", ".join(f"{t} {s:.1f} s" for t, s in seconds.items()),
                 "; compiling in the background, each input shape switches when ready" if cfg.compile != "off" else "")
    counts = [s.frame_count for s in sources]
    total = None if any(c is None for c in counts) else sum(min(c, cfg.max_frames or c) for c in counts)
    display = Display(sources, cfg.progress, total, terminal=sys.stderr.isatty())

    def on_event(record: dict) -> None:
        details = ", ".join(f"{k} {v}" for k, v in record.items() if k not in ("event", "source_id", "time_ns"))
        log.warning("source %s: %s (%s)", record["source_id"], record["event"], details)

    for source in sources:
        info = source.info
        log.info("source %s (%dx%d, %s) -> tasks %s on %s", info.source_id, info.width, info.height,
                 "live" if info.live else "file", ",".join(cfg.tasks), stages.device)
    runner = Runner(sources, engine, sinks, annotator, stages.random_weights, cfg.max_frames, display.on_result,
                    display.on_idle, stop, wants_image=wants_image, on_event=on_event,
                    batch_timeout_s=cfg.batch_timeout_s, world=world)
    return runner, display


def lift_of(cfg: RunConfig) -> Lift | None:
    """How keypoints are lifted into 3D (None: --keypoints3d is off): window, threshold, the hips."""
    if not cfg.keypoints3d:
        return None
    meta = load_metadata()
    hips = (meta.keypoint_index("left_hip"), meta.keypoint_index("right_hip"))
    return Lift(cfg.keypoints3d_window, cfg.kpt_threshold, hips)


STYLE_VALUES = {"matte_background": matte_background}  # a setting an annotator takes as something else


def _annotation_layers(cfg: RunConfig) -> list:
    """The configured layers whose task runs, styled from the config (``TaskSpec.style``: the matte's
    background and mode, the skeleton's threshold); the others by name."""
    by_layer = {spec.layer: spec for spec in TASKS.values() if spec.layer}
    chosen: list = []
    for layer in cfg.annotate:
        spec = by_layer.get(layer)
        if spec is not None and spec.name not in cfg.tasks or layer == "side3d" and not cfg.keypoints3d \
                or layer == "boxes" and person_task(cfg.tasks) is None:  # (boxes: the detector runs for it)
            continue
        if spec is not None and spec.style:
            style = {word: STYLE_VALUES.get(key, lambda v: v)(getattr(cfg, key)) for word, key in spec.style}
            chosen.append(load(spec.annotator)(**style))
        else:
            chosen.append(layer)
    return chosen


__all__ = ["assemble", "run_pipeline"]
