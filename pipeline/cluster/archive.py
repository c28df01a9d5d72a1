"""``sapiens2-stream batch INPUTS --out DIR``: a video archive through the pipeline on Ray Data.

Ray carries one small row per video (id and path in, outcome out); a pool of actors, each loading the
models once, runs the plain pipeline (``assemble`` + ``Runner``) on one video after another and writes
``DIR/<video_id>/``: ``keypoints.jsonl``, ``annotated.mp4``, then ``DONE.json`` last (its presence means
"complete"; ``FAILED.json`` with the reason instead when the video could not be processed). Outputs are
renamed into place once whole; files starting with a dot are temporaries, removed by the next run that
takes the video. A rerun of the same command skips the videos whose DONE.json has the same fingerprint
(file and settings) and does the others, so an interrupted run resumes. Every input's outcome is printed
and written to ``DIR/summary.jsonl``. The user's guide: docs/DEPLOYMENT.md, "Archives".
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import logging
import math
import os
import re
import signal
import sys
import time
import uuid
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.cli.args import raise_terminated
from stages.errors import ConfigError

from .archive_files import (
    FAILED,
    SUMMARY,
    Item,
    clear_partials,
    completed,
    fingerprint,
    from_marker,
    list_inputs,
    lock_out,
    outcome,
    prepare_out,
    weights_fingerprint,
    write_atomic,
)
from .archive_report import Progress, print_summary
from .archive_worker import LOADING, ROW_KEYS, ArchiveWorker, WorkersDied
from .prerequisites import need, unanswered

if TYPE_CHECKING:  # the models' modules load torch: imported where a command runs, not by the CLI's parser
    from pipeline.cli.config import RunConfig

log = logging.getLogger("sapiens2_stream")

# RunConfig keys that batch decides itself: where frames come from, where results go, live-only knobs.
SET_BY_BATCH = ("source", "sources", "source_id", "realtime", "stall_timeout_s", "batch_timeout_s", "control",
                "record", "save_keypoints", "publish", "publish_connect", "curve_dir", "curve_client",
                "jpeg_quality", "gpu_jpeg", "show", "view", "view_token", "metrics")
OBJECT_STORE_BYTES = 128 * 2**20  # a local Ray holds only the rows: keep its shared memory small
TASK_RETRIES = 2  # a video whose worker process dies is tried this many more times, then reported failed
ADDRESS_TIMEOUT_S = 5.0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``batch``: the run flags (less the ones batch sets itself) plus the archive's own."""
    from pipeline.cli.args import add_run_args
    from pipeline.cli.config import FIELDS

    p = subparsers.add_parser("batch", help="run a video archive through the pipeline on Ray (resumable)",
                              description="Each input gets DIR/<video_id>/keypoints.jsonl, annotated.mp4 and a "
                                          "DONE.json marker; a rerun skips the complete ones.")
    p.add_argument("inputs", nargs="+", metavar="INPUTS",
                   help="video files, folders (their video files), glob patterns (quote them) or manifests "
                        "(.csv with the header video_id,path; relative paths are relative to the manifest)")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (shared by every node of a cluster)")
    p.add_argument("--workers", type=int, metavar="N",
                   help="actors, each with its own models (default: one per GPU slot, else 1)")
    p.add_argument("--gpus-per-worker", type=float, metavar="G",
                   help="GPUs per actor, fractions allowed (default: 1 when the cluster has GPUs, else 0)")
    p.add_argument("--cpus-per-worker", type=float, default=1.0, metavar="C",
                   help="CPUs per actor; Ray sets the actor's OMP_NUM_THREADS (torch threads) to it unless the "
                        "environment sets one (default 1)")
    p.add_argument("--address", default=os.environ.get("RAY_ADDRESS"),
                   help="a running Ray cluster: HOST:PORT, ray://HOST:PORT or auto (default $RAY_ADDRESS; "
                        "unset: a local Ray is started for the run)")
    add_run_args(p)
    for action in p._actions:  # the flags batch sets itself stay parseable (to refuse them by name), unlisted
        if action.dest in SET_BY_BATCH and action.dest in FIELDS:
            action.help = argparse.SUPPRESS
    p.set_defaults(func=cmd_batch)


# -- the command -----------------------------------------------------------------------------
def cmd_batch(args: argparse.Namespace) -> int:
    """Check everything that can be checked, skip complete videos, map the rest on Ray, report."""
    refuse_batch_flags(args)
    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"--workers: must be at least 1, got {args.workers}")
    for flag, value in (("--gpus-per-worker", args.gpus_per_worker), ("--cpus-per-worker", args.cpus_per_worker)):
        if value is not None and not (value >= 0 and math.isfinite(value)):
            raise ConfigError(f"{flag}: must be a number >= 0, got {value}")
    items = list_inputs(args.inputs, out=args.out)
    out = prepare_out(args.out)
    with lock_out(out):  # the folder is this run's until it ends
        # What a killed run left at the top (its workers' loading marks, a half-written summary): with
        # the lock held no other run can be using them.
        clear_partials(out)
        return _batch(args, items, out)


def _batch(args: argparse.Namespace, items: list[Item], out: Path) -> int:
    address = None if args.address in (None, "", "local") else args.address
    if address is not None:
        check_address(address)
    cfg = batch_config(args)
    logging.getLogger().setLevel(cfg.log_level.upper())
    run_id = time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
    rows: dict[str, dict[str, Any]] = {}
    settings = dataclasses.asdict(cfg)
    weights = None  # known here for a local run (a cluster's nodes resolve the weights themselves)
    if address is None:
        from pipeline.run.build import checkpoint_sources, fallback_line, tiny_fallbacks

        # a missing checkpoint fails here, and tiny ones are made once, not per actor
        sources = checkpoint_sources(cfg)
        weights = weights_fingerprint(sources)
        fallback = fallback_line(tiny_fallbacks(cfg, sources), None)
        if fallback:  # the workers log theirs where only Ray's logs show it
            log.warning("batch: %s", fallback)
    changed = []
    for item in items:
        marker = completed(out / item.video_id, fingerprint(item, settings, weights))
        if marker is not None:
            rows[item.video_id] = from_marker(item, marker, run_id)
        elif completed(out / item.video_id) is not None:
            changed.append(item.video_id)
    if changed:
        log.warning("batch: %d video(s) done before from another file or other settings are done again: %s",
                    len(changed), ", ".join(changed[:8]) + (" ..." if len(changed) > 8 else ""))
    todo = [item for item in items if item.video_id not in rows]
    log.info("batch %s: %d inputs, %d complete from before, %d to do", run_id, len(items), len(rows), len(todo))
    try:
        if todo:
            _run_on_ray(args, cfg, todo, out, run_id, address, rows, weights)
    finally:
        for item in todo:  # interrupted, or the Ray job stopped: finished unreported, or not run
            if item.video_id not in rows:
                marker = completed(out / item.video_id, fingerprint(item, settings, weights))
                rows[item.video_id] = outcome(item, "unfinished", run_id) if marker is None else \
                    from_marker(item, marker, run_id)
        report = [rows[item.video_id] for item in items]
        print_summary(report, out / SUMMARY)
        random = [row["video_id"] for row in report if row["status"] in ("done", "skipped")
                  and (completed(out / row["video_id"]) or {}).get("random_weights")]
        if random:
            log.warning("RANDOM WEIGHTS: %d of the videos (%s) were made with random weights; their outputs are "
                        "meaningless (their DONE.json says random_weights)", len(random),
                        ", ".join(random[:5]) + (" ..." if len(random) > 5 else ""))
        try:
            write_atomic(out / SUMMARY, "".join(json.dumps(row) + "\n" for row in report))
        except OSError as exc:  # a full disk: the table above is the summary; the outcome stays the run's
            log.error("batch: cannot write %s (%s); the table above is this run's summary", out / SUMMARY,
                      exc.strerror or exc)
    failed = [row for row in report if row["status"] not in ("done", "skipped")]
    if failed:
        names = ", ".join(f"{row['video_id']} ({row['error'] or row['status']})" for row in failed[:5])
        more = f" and {len(failed) - 5} more" if len(failed) > 5 else ""
        raise RuntimeError(f"{len(failed)} of {len(report)} inputs failed: {names}{more}; see {out / SUMMARY}")
    return 0


def refuse_batch_flags(args: argparse.Namespace) -> None:
    """ConfigError naming the run flags given that batch sets itself."""
    from pipeline.cli.config import flag_of

    given = [key for key in SET_BY_BATCH if getattr(args, key, None) is not None]
    if given:
        flags = ", ".join(flag_of(k) for k in given)
        raise ConfigError(f"batch sets {flags} itself (sources come from INPUTS, outputs go to "
                          f"DIR/<video_id>/); leave {'it' if len(given) == 1 else 'them'} out")


def batch_config(args: argparse.Namespace) -> RunConfig:
    """The run config of every video: YAML and flags, with the keys batch sets itself cleared (from
    the YAML file they are ignored, with one warning), checked as far as it can be without models."""
    from pipeline.cli.args import run_config
    from pipeline.cli.config import FIELDS
    from pipeline.cli.preflight import preflight
    from pipeline.cli.sourcespecs import SourceSpec

    cfg = run_config(args)
    defaults = {key: FIELDS[key].default_factory() if FIELDS[key].default_factory is not dataclasses.MISSING
                else FIELDS[key].default for key in SET_BY_BATCH}
    ignored = [key for key, value in defaults.items() if getattr(cfg, key) != value]
    if ignored:
        log.warning("batch: ignoring %s from %s (sources come from INPUTS, outputs go to --out)",
                    ", ".join(ignored), args.config)
    cfg = dataclasses.replace(cfg, **defaults)
    preflight(cfg, [SourceSpec("video", "-")], check_sources=False)  # annotation background, detector model
    # Files named relative to here, absolute: the workers run in other folders (on a cluster, other hosts)
    return dataclasses.replace(cfg, checkpoints={task: _absolute(v) for task, v in cfg.checkpoints.items()},
                               detector_model=_absolute(cfg.detector_model),
                               matte_background=_absolute(cfg.matte_background))


def _absolute(value: str) -> str:
    """A path that names an existing file or folder here, absolute; anything else (a hub id, a colour) as it is."""
    return str(Path(value).absolute()) if value and Path(value).exists() else value


def check_address(address: str) -> None:
    """ConfigError unless a Ray head answers at HOST:PORT (``auto`` is left to Ray)."""
    if address == "auto":
        return
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"--address {address!r}: expected HOST:PORT (the head's GCS port, 6379 unless changed), "
                          "ray://HOST:PORT or auto")
    why = unanswered(host, int(port), "grpc", ADDRESS_TIMEOUT_S)
    if why is not None:
        raise ConfigError(f"--address {address}: no Ray cluster answers there ({why}); start one "
                          "with `ray start --head`, or leave --address out to run on a local Ray")


def _run_on_ray(args: argparse.Namespace, cfg: RunConfig, todo: list[Item], out: Path, run_id: str, address: str | None,
                rows: dict[str, dict[str, Any]], weights: str | None) -> None:
    """Start a local Ray (or join ``address``), map ``todo`` through the actor pool, and put each
    video's outcome into ``rows`` as it arrives; Ray is shut down (or left) at the end."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray = need("ray", "batch")
    need("ray.data", "batch")
    from pipeline.cli.args import one_line

    workers = args.workers or 1
    try:
        if address is None:
            cpus = max(os.cpu_count() or 1, math.ceil(workers * args.cpus_per_worker))
            ray.init(address="local", num_cpus=cpus, object_store_memory=OBJECT_STORE_BYTES, include_dashboard=False,
                     log_to_driver=False, logging_level=logging.ERROR)
        else:
            ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    except Exception as exc:  # Ray's own failure to start or connect, as one line
        raise RuntimeError(f"Ray did not start{'' if address is None else f' at {address}'}: {one_line(exc)}") from None
    # SIGTERM (a scheduler stopping the job) as Ctrl-C: the summary, then exit 143; not Ray's crash handler
    signal.signal(signal.SIGTERM, raise_terminated)
    try:
        gpus_there = float(ray.cluster_resources().get("GPU", 0))
        gpus = args.gpus_per_worker if args.gpus_per_worker is not None else (1.0 if gpus_there else 0.0)
        if args.workers is None and gpus:
            workers = max(1, int(gpus_there // gpus))
        workers = min(workers, len(todo))  # an actor without a video would only load models
        _check_resources(cfg, workers, gpus, gpus_there, local=address is None)
        log.info("batch %s: %d videos on %d workers (%g GPU, %g CPU each); as they start, Ray logs one error "
                 "line, core_worker.cc '... max_restarts > 0': expected here and harmless (docs/DEPLOYMENT.md)",
                 run_id, len(todo), workers, gpus, args.cpus_per_worker)
        by_id = {item.video_id: item for item in todo}
        progress = Progress(len(todo), bar=cfg.progress and sys.stderr.isatty())
        stopped = None
        try:
            for row in _dataset(ray, cfg, todo, out, run_id, workers, gpus, args.cpus_per_worker,
                                weights).iter_rows():
                result = {key: _plain(row[key]) for key in ROW_KEYS}
                rows[result["video_id"]] = result
                progress.update(result)
        except KeyboardInterrupt as exc:  # raised again below, without the frames that hold Ray's iterator
            stopped = type(exc)(*exc.args)
        except Exception as exc:  # the Ray job itself stopped (not one video: those are rows)
            died = re.search(WorkersDied.__name__ + r": (.+)", str(exc))  # Ray wraps it in its own report
            why = died.group(1) if died else one_line(exc)
            raise RuntimeError(f"the Ray job stopped after {progress.done} of {len(todo)} videos: {why}; rerun the "
                               "same command to resume") from None
        finally:
            progress.close()
            for mark in out.glob(f"{LOADING}{run_id}-*"):
                mark.unlink(missing_ok=True)
        if stopped is not None:
            gc.collect()  # the interrupted iterator stops its executor now, while Ray is up (at exit it printed
            raise stopped  # a ValueError from Ray Data after the error line)
        for video_id in by_id.keys() - rows.keys():  # its worker process died on it, every try
            clear_partials(out / video_id)
            rows[video_id] = outcome(by_id[video_id], "failed", run_id,
                                     error=f"its worker process died on it {TASK_RETRIES + 1} times (see the Ray "
                                           "worker logs)")
            write_atomic(out / video_id / FAILED, json.dumps(rows[video_id]) + "\n")
    finally:
        ray.shutdown()


def _check_resources(cfg: RunConfig, workers: int, gpus: float, gpus_there: float, local: bool) -> None:
    if gpus == 0 and cfg.device.startswith("cuda"):
        raise ConfigError(f"device {cfg.device}: the workers get no GPU; pass --gpus-per-worker (e.g. 1)")
    if gpus and workers * gpus > gpus_there:
        text = f"--workers {workers} x --gpus-per-worker {gpus:g} needs {workers * gpus:g} GPUs; the cluster has " \
               f"{gpus_there:g}"
        if local:
            raise ConfigError(f"{text}: lower --workers or --gpus-per-worker")
        log.warning("%s now: the other workers start when the cluster grows", text)


def _dataset(ray: Any, cfg: RunConfig, todo: list[Item], out: Path, run_id: str, workers: int, gpus: float,
             cpus: float, weights: str | None) -> Any:
    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # this command shows its own, per video
    ctx.print_on_execution_start = False
    ctx.max_errored_blocks = -1  # a row whose worker died every try is reported missing, not fatal
    logging.getLogger("ray.data").setLevel(logging.CRITICAL)
    rows = [{"video_id": item.video_id, "path": item.path} for item in todo]
    # One block per video, so that any idle actor can take any video.
    ds = ray.data.from_items(rows, override_num_blocks=len(rows))
    with warnings.catch_warnings():  # Ray 2.60 deprecates passing actor options as keywords; no other way yet
        warnings.filterwarnings("ignore", message=".*ray_remote_args.*")
        return ds.map_batches(
            ArchiveWorker, batch_size=1,
            fn_constructor_kwargs={"cfg": cfg, "out": str(out), "run_id": run_id, "weights": weights,
                                   "workers": workers},
            # one video in flight per actor: a long video never holds others queued behind it
            compute=ray.data.ActorPoolStrategy(size=workers, max_tasks_in_flight_per_actor=1),
            num_gpus=gpus, num_cpus=cpus, max_task_retries=TASK_RETRIES)


def _plain(value: Any) -> Any:
    """numpy scalars of a Ray row as JSON values."""
    return value.item() if hasattr(value, "item") else value
