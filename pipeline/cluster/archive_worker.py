"""One video of ``batch`` (``pipeline.cluster.archive``): the plain pipeline on a file into its folder
(outputs renamed into place once whole, DONE.json or FAILED.json last), and the Ray Data actor that loads
the models once and runs one video per call."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .archive_files import (
    DONE,
    FAILED,
    KEYPOINTS,
    VIDEO,
    Item,
    clear_partials,
    completed,
    fingerprint,
    from_marker,
    fsync_path,
    outcome,
    write_atomic,
)

if TYPE_CHECKING:  # the models' modules load torch: imported where a command runs, not by the CLI's parser
    from pipeline.cli.config import RunConfig
    from pipeline.run.build import Stages

log = logging.getLogger("sapiens2_stream")

ROW_KEYS = ("video_id", "path", "status", "frames", "seconds", "error", "run_id", "started", "finished",
            "decode_errors")
LOAD_DEATHS = 3  # worker processes that may die while loading the models before the job gives up


def process_video(cfg: RunConfig, stages: Stages, item: Item, out: Path, run_id: str,
                  weights: str | None = None) -> dict[str, Any]:
    """Run the pipeline on one video into ``out/<video_id>/``; never raises for a bad input (the
    outcome row says what happened; a video already complete is not done again). ``weights``: the
    driver's ``weights_fingerprint`` of the checkpoints, kept in the marker."""
    from pipeline.cli.args import one_line

    folder = out / item.video_id
    made_from = fingerprint(item, dataclasses.asdict(cfg), weights)
    marker = completed(folder, made_from)
    if marker is not None:  # a retried task whose first try finished before its worker died
        return from_marker(item, marker, run_id)
    started = time.time()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name in (DONE, FAILED):
            (folder / name).unlink(missing_ok=True)
        clear_partials(folder)
        frames, decode_errors = _run_one(cfg, stages, item, folder, f"{run_id}-{os.getpid()}")
        finished = time.time()
        row = outcome(item, "done", run_id, frames, finished - started, started=started, finished=finished,
                      decode_errors=decode_errors)
        marker = {**row, "outputs": [KEYPOINTS, VIDEO], "tasks": list(cfg.tasks), "fingerprint": made_from,
                  "random_weights": bool(stages.random_weights), "worker": f"{socket.gethostname()}:{os.getpid()}"}
        write_atomic(folder / DONE, json.dumps(marker) + "\n")  # (a full disk here fails the row, with why)
    except Exception as exc:  # a corrupt input fails its own row, never the archive
        clear_partials(folder)
        row = outcome(item, "failed", run_id, error=one_line(exc), started=started, finished=time.time(),
                      seconds=time.time() - started)
        try:
            write_atomic(folder / FAILED, json.dumps(row) + "\n")
        except OSError as write_exc:
            log.error("%s: cannot write %s: %s", item.video_id, FAILED, write_exc)
    return row


def _run_one(cfg: RunConfig, stages: Stages, item: Item, folder: Path, token: str) -> tuple[int, int]:
    """The plain pipeline on one file into temporaries, renamed into place once whole; (frames written,
    corrupt packets skipped)."""
    from pipeline.run.app import assemble
    from pipeline.sinks.build import build_outputs
    from pipeline.sources import Source
    from pipeline.sources.readers import open_file

    tmp = {name: folder / f".partial-{token}-{name}" for name in (KEYPOINTS, VIDEO)}
    run_cfg = dataclasses.replace(cfg, record=str(tmp[VIDEO]), save_keypoints=str(tmp[KEYPOINTS]), progress=False)
    stop = threading.Event()
    label = f"video file {item.path!r}"
    source = Source(lambda: open_file(item.path, label=label), label=label, source_id=item.video_id)
    sinks: list = []
    try:  # until the runner owns them, a failure here must close the source and sinks
        source.open()
        sinks = build_outputs(run_cfg, stop).sinks
        runner, display = assemble(run_cfg, source, stages, sinks, stop)
    except BaseException:
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
    for name, path in tmp.items():
        fsync_path(path)
        os.replace(path, folder / name)
    fsync_path(folder)
    return stats.frames, source.decode_errors


LOADING = ".partial-loading-"  # + run id + host + pid: a worker loading its models (in --out)


class WorkersDied(RuntimeError):
    """Worker processes died while loading the models, again and again: the job cannot go on."""


class ArchiveWorker:
    """The Ray Data actor: loads the models once, then runs one row (one video) per call."""

    def __init__(self, cfg: RunConfig, out: str, run_id: str, weights: str | None = None, workers: int = 1) -> None:
        from pipeline.cli.args import one_line

        logging.basicConfig(level=cfg.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
        self.cfg, self.out, self.run_id, self.weights = cfg, Path(out), run_id, weights
        self.stages, self.broken = None, ""
        # A process that dies while loading (out of memory) leaves its mark; Ray would restart it forever.
        marks = list(self.out.glob(f"{LOADING}{run_id}-*"))
        if len(marks) >= LOAD_DEATHS + workers - 1:  # (the other workers may be loading right now)
            raise WorkersDied(f"{len(marks) - workers + 1} worker processes died while loading the models (out of "
                              "memory?); see the Ray worker logs")
        loading = self.out / f"{LOADING}{run_id}-{socket.gethostname()}-{os.getpid()}"
        loading.touch()
        try:  # (importing torch and the model code is part of the loading: a process may die there too)
            from pipeline.run.build import build_stages

            self.stages = build_stages(cfg)
        except Exception as exc:  # every row this actor gets then fails with the reason; the job goes on
            self.broken = f"the worker could not load the models: {one_line(exc)}"
            log.error("%s", self.broken)
        loading.unlink(missing_ok=True)

    def __call__(self, batch: dict[str, Any]) -> dict[str, list]:
        from pipeline.cli.args import one_line

        rows = []
        for video_id, path in zip(batch["video_id"], batch["path"]):
            item = Item(str(video_id), str(path), "row")
            if self.broken:
                rows.append(outcome(item, "failed", self.run_id, error=self.broken))
                continue
            try:
                rows.append(process_video(self.cfg, self.stages, item, self.out, self.run_id, self.weights))
            except Exception as exc:  # the row says why (not "its worker died", which Ray would make of it)
                rows.append(outcome(item, "failed", self.run_id, error=one_line(exc)))
        return {key: [row[key] for row in rows] for key in ROW_KEYS}


