"""The files of an archive run (``sapiens2-stream batch``): which videos the inputs name, and the
folder each gets under ``--out`` with its outputs and its completion marker, written atomically.
No Ray, no models: the driver checks and skips with these before anything starts."""

from __future__ import annotations

import csv
import glob
import hashlib
import json
import os
import socket
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.cli.sourcespecs import VIDEO_SUFFIXES
from sapiens2_client.wire import check_source_id
from stages.errors import ConfigError

KEYPOINTS, VIDEO = "keypoints.jsonl", "annotated.mp4"  # the outputs of a video, in DIR/<video_id>/
DONE, FAILED, SUMMARY = "DONE.json", "FAILED.json", "summary.jsonl"


# -- inputs ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Item:
    """One input video: its id (the folder name under --out) and the path the workers open."""

    video_id: str
    path: str
    where: str  # where it was named, for error messages


def list_inputs(specs: list[str], out: str | None = None) -> list[Item]:
    """Every video named by files, folders, globs and manifests, each once (a file named twice is one
    input); ConfigError for none, a bad id or one id for two files. Folders and globs leave out hidden
    files (``._a.mp4`` of macOS is not a video) and anything under ``out`` (earlier outputs are no inputs)."""
    outside = _outside(out)
    items: list[Item] = []
    for spec in specs:
        path = Path(spec)
        if path.is_file() and path.suffix.lower() == ".csv":
            items.extend(read_manifest(path))
        elif path.is_file():
            items.append(_from_file(path, spec))
        elif path.is_dir():
            files = sorted(f for f in path.iterdir() if f.is_file() and f.suffix.lower() in VIDEO_SUFFIXES
                           and not f.name.startswith(".") and outside(f))
            if not files:
                raise ConfigError(f"{spec}: no video files in this folder (looked for "
                                  f"{', '.join(sorted(VIDEO_SUFFIXES))})")
            items.extend(_from_file(f, f"folder {spec}") for f in files)
        elif any(ch in spec for ch in "*?["):
            files = sorted(Path(m) for m in glob.glob(spec, recursive=True) if Path(m).is_file() and outside(Path(m)))
            if not files:
                raise ConfigError(f"{spec!r}: the pattern matches no files")
            items.extend(_from_file(f, f"pattern {spec!r}") for f in files)
        else:
            raise ConfigError(f"{spec}: no such file, folder or manifest; check the path")
    if not items:
        raise ConfigError("no inputs: the manifests list no videos")
    seen: dict[str, Item] = {}
    unique: list[Item] = []
    for item in items:
        first = seen.get(item.video_id)
        if first is not None and Path(first.path).resolve() == Path(item.path).resolve():
            continue  # the same video named twice (a folder and one of its files): done once
        if first is not None:
            raise ConfigError(f"video id {item.video_id!r} is used twice ({seen[item.video_id].where} and "
                              f"{item.where}); ids name the output folders, so each video needs its own "
                              "(a manifest video_id,path names them)")
        seen[item.video_id] = item
        unique.append(item)
    return unique


def _outside(out: str | None):
    """A test: the file is not under the output folder ``out``."""
    if out is None:
        return lambda path: True
    root = Path(out).resolve()
    return lambda path: not path.resolve().is_relative_to(root)


def read_manifest(path: Path) -> list[Item]:
    """Rows of a ``video_id,path`` CSV (other columns are ignored); paths relative to the manifest."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:
            reader = csv.DictReader(handle)
            missing = {"video_id", "path"} - set(reader.fieldnames or ())
            if missing:
                raise ConfigError(f"{path}: the header must name video_id and path (missing "
                                  f"{', '.join(sorted(missing))})")
            rows = [(reader.line_num, row) for row in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ConfigError(f"{path}: cannot read the manifest ({exc})") from None
    items = []
    for line, row in rows:
        video_id, video = (row.get("video_id") or "").strip(), (row.get("path") or "").strip()
        if not video_id and not video:
            continue  # a blank line
        where = f"{path} line {line}"
        if not video_id or not video:
            raise ConfigError(f"{where}: needs both a video_id and a path")
        _check_id(video_id, where)
        items.append(Item(video_id, str((path.parent / video).absolute()), where))
    return items


def _from_file(path: Path, where: str) -> Item:
    from pipeline.sources.source import id_from_name  # (decoders load with it: not at the CLI's start)

    video_id = id_from_name(path.stem)  # the id a plain run gives the same file
    if len(video_id) > 64 or not path.stem.isascii():  # too long, or letters an id cannot hold (日本, 中文)
        base = id_from_name(path.stem.encode("ascii", "ignore").decode())[:55].strip("_-")
        video_id = f"{base if base != 'src' else 'video'}-{hashlib.sha256(path.stem.encode()).hexdigest()[:8]}"
    _check_id(video_id, f"{where} ({path.name})")
    return Item(video_id, str(path.absolute()), f"{where}: {path}")


def _check_id(video_id: str, where: str) -> None:
    try:
        check_source_id(video_id)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}; name the video in a manifest") from None


# -- outputs and markers ---------------------------------------------------------------------
def lock_out(out: Path) -> Any:
    """An exclusive lock on ``out`` for this run (held while the returned file stays open); ConfigError
    naming the other run when one holds it (two runs on one folder would clobber each other's files)."""
    import fcntl

    handle = open(out / ".lock", "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise ConfigError(f"--out {out}: another batch run ({holder}) is using it; wait for it to end, or pick "
                          "another folder") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{socket.gethostname()} pid {os.getpid()}\n")
    handle.flush()
    return handle


def prepare_out(out: str) -> Path:
    """The output folder (absolute: workers on other nodes, in other folders, write there too), created;
    ConfigError when it cannot be written."""
    path = Path(out).absolute()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--out {out}: is a file; name a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".probe-"):
            pass
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot write there ({exc.strerror or exc}); pick a writable folder") from None
    return path


def completed(folder: Path, fingerprint: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The DONE.json of a video whose outputs are complete, else None; with ``fingerprint``, only
    when they were made from the same input file and settings (a marker from before fingerprints
    were kept counts as the same)."""
    try:
        marker = json.loads((folder / DONE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("status") != "done":
        return None
    stored = marker.get("fingerprint", fingerprint)
    if fingerprint is not None and (not isinstance(stored, dict)
                                    or any(stored.get(k, v) != v for k, v in fingerprint.items())):
        return None  # (a key a marker from an older version does not have counts as the same)
    return marker if all((folder / name).is_file() for name in (KEYPOINTS, VIDEO)) else None


# Settings that change nothing in the outputs (where and how fast it runs, what else is served).
UNCHANGING = frozenset({"device", "attention", "channels_last", "compile", "cuda_graphs", "pose_buckets", "gpu_jpeg",
                        "log_level", "progress", "show", "metrics", "view", "view_token", "control", "publish",
                        "publish_connect", "curve_dir", "curve_client", "fallback_tiny"})


def fingerprint(item: Item, settings: dict[str, Any], weights: str | None = None) -> dict[str, Any]:
    """What a video's outputs were made from: the input file (path, size, modification time), a hash
    of the run settings that shape them and, when known, of the weights (``weights_fingerprint``);
    kept in DONE.json, so a rerun redoes a video whose file, settings or weights changed (random
    weights then real ones, a checkpoint retrained in place) instead of skipping it."""
    path = Path(item.path)
    try:
        stat = path.stat()
        size, mtime_ns = stat.st_size, stat.st_mtime_ns
    except OSError:
        size = mtime_ns = None
    shaping = {k: v for k, v in sorted(settings.items()) if k not in UNCHANGING}
    made = {"input": str(path.resolve()), "size": size, "mtime_ns": mtime_ns, "settings": _digest(shaping)}
    return made if weights is None else {**made, "weights": weights}


def weights_fingerprint(checkpoints: dict[str, Path]) -> str:
    """A hash of the checkpoint each task loads: its folder and its weights file's size and time."""
    seen = {}
    for task, folder in sorted(checkpoints.items()):
        folder = Path(folder)
        weights = folder / "model.safetensors" if folder.is_dir() else folder
        try:
            stat = weights.stat()
            seen[task] = [str(folder.resolve()), stat.st_size, stat.st_mtime_ns]
        except OSError:
            seen[task] = [str(folder), None, None]
    return _digest(seen)


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


PARTIALS = (".partial-*", "..partial-*")  # our temporaries (and the recorder's own beside one): nothing else


def clear_partials(folder: Path) -> None:
    """Remove the temporaries an interrupted run left (only ours: a user's dotfiles there stay)."""
    for pattern in PARTIALS:
        for path in folder.glob(pattern):
            if path.is_file():
                path.unlink(missing_ok=True)


def write_atomic(path: Path, text: str) -> None:
    """``text`` into ``path`` whole or not at all (a temporary beside it, fsynced, renamed over it; the
    temporary is removed when any of it fails)."""
    tmp = path.with_name(f".partial-{uuid.uuid4().hex[:8]}-{path.name}")
    try:
        with open(tmp, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def fsync_path(path: Path) -> None:
    """fsync a file or a folder (a rename is durable once its folder is)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def outcome(item: Item, status: str, run_id: str, frames: int = 0, seconds: float = 0.0, error: str = "",
            started: float = 0.0, finished: float = 0.0, decode_errors: int = 0) -> dict[str, Any]:
    """One summary row (also the body of DONE.json / FAILED.json); ``decode_errors``: corrupt packets the
    decoder skipped (a video damaged in the middle is done with fewer frames, and says so)."""
    return {"video_id": item.video_id, "path": item.path, "status": status, "frames": int(frames),
            "seconds": round(float(seconds), 3), "error": error, "run_id": run_id, "started": started,
            "finished": finished, "decode_errors": int(decode_errors)}


def from_marker(item: Item, marker: dict[str, Any], run_id: str) -> dict[str, Any]:
    """The row of a complete video from its DONE.json: done by this run, or skipped (done by an earlier one)."""
    by = str(marker.get("run_id", ""))
    return outcome(item, "done" if by == run_id else "skipped", by, marker.get("frames", 0), marker.get("seconds", 0.0),
                   started=marker.get("started", 0.0), finished=marker.get("finished", 0.0),
                   decode_errors=marker.get("decode_errors", 0))
