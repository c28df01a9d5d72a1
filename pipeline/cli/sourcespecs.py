"""The sources of a run, named and checked: a YAML ``sources:`` list and ``--source [NAME=]SPEC``
flags become ``SourceSpec``s (RunConfig.source_specs). No I/O beyond asking whether a ``NAME=SPEC``
text is itself an existing path."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sapiens2_client.wire import check_source_id
from stages.errors import ConfigError

SOURCE_KEYS = {"id", "uri", "realtime", "stall_timeout_s"}
VIDEO_SUFFIXES = frozenset({".mp4", ".mov", ".m4v", ".mkv", ".avi", ".webm", ".mpg", ".mpeg", ".ts", ".mts",
                            ".m2ts", ".flv", ".wmv", ".3gp"})  # what a folder of videos (``batch``) holds
_NAME = re.compile(r"[A-Za-z0-9_\-:]*")


@dataclass(frozen=True)
class SourceSpec:
    """One source of a run: its name (None: from the source itself), what to open, and its own
    settings where they differ from the run's (None: the run's)."""

    id: str | None
    uri: str
    realtime: bool | None = None
    stall_timeout_s: float | None = None
    where: str = "source"


def check_source_name(name: str, where: str) -> None:
    """ConfigError naming ``where`` unless ``name`` can be a source id (topics, file names, the wire)."""
    if not name:
        raise ConfigError(f"{where}: the name is empty; write NAME=SPEC with a name")
    try:
        check_source_id(name)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def check_source_settings(entry: dict[str, Any], where: str) -> None:
    """ConfigError naming ``where`` unless the entry's own settings (``realtime``, ``stall_timeout_s``;
    absent or null: the run's) have the right types and ranges."""
    for key, kind in (("realtime", bool), ("stall_timeout_s", int | float)):
        value = entry.get(key)
        if value is not None and (isinstance(value, bool) != (kind is bool) or not isinstance(value, kind)):
            raise ConfigError(f"{where}: {key} must be {'true or false' if kind is bool else 'a number'}")
    stall = entry.get("stall_timeout_s")
    if stall is not None and not 0 < stall < math.inf:  # NaN too
        raise ConfigError(f"{where}: stall_timeout_s must be a positive number of seconds, got {stall}")


def missing_file(uri: str) -> str | None:
    """Why a source that names a local file (a video, ``loop:FILE``, an image) cannot open because
    the file is not there, or None (it exists, or the source is a camera, a stream, the demo, a glob)."""
    path = uri.removeprefix("loop:")
    if (path == "demo" or path.startswith(("webcam", "/dev/video")) or "://" in path
            or any(ch in path for ch in "*?[") or Path(path).exists()):
        return None
    return f"{path!r}: no such file; check the path (use --source demo for the built-in clip)"


def split_source(text: str, where: str = "source") -> tuple[str | None, str]:
    """``NAME=SPEC`` -> (NAME, SPEC); a SPEC alone (URLs with ``=`` in their query too) -> (None, SPEC)."""
    name, sep, uri = text.partition("=")
    if not sep or "://" in name or "/" in name or "\\" in name or Path(text).exists():
        return None, text.strip()  # a path or URL with = in it (a name cannot hold / anyway)
    if not _NAME.fullmatch(name):  # meant as a name (there is no such file): say what a name may hold
        check_source_name(name, where)
    if not uri.strip():
        raise ConfigError(f"{where}: {text!r} names a source but gives nothing to open; write NAME=SPEC")
    return name, uri.strip()


def name_sources(sources: list[dict[str, Any]], source_texts: list[str], source_id: str | None) -> list[SourceSpec]:
    """Every source of the run, named: ``sources`` entries, then ``source`` specs ([NAME=]SPEC).

    Unnamed sources are cam0, cam1, ... when there are several; a single one keeps the name its
    kind suggests (``demo``, the file's stem, ``cam0`` for webcam:0; or ``source_id``).
    ConfigError naming the entry for an empty or repeated name or an unknown key."""
    specs: list[SourceSpec] = []
    for i, entry in enumerate(sources):
        where = f"sources[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: expected a mapping with id and uri, got {entry!r}")
        unknown = sorted(set(entry) - SOURCE_KEYS)
        if unknown:
            takes = ", ".join(sorted(SOURCE_KEYS))
            raise ConfigError(f"{where}: unknown key {unknown[0]!r}; a source takes {takes}")
        if not isinstance(entry.get("uri"), str) or not entry["uri"].strip():
            raise ConfigError(f"{where}: needs a uri (what --source takes)")
        check_source_settings(entry, where)
        name = entry.get("id")
        if name is not None and not isinstance(name, str):
            raise ConfigError(f"{where}: id must be a string")
        specs.append(SourceSpec(name, entry["uri"].strip(), entry.get("realtime"),
                                entry.get("stall_timeout_s"), where))
    for i, text in enumerate(source_texts):
        name, uri = split_source(text, f"source[{i}]")
        specs.append(SourceSpec(name, uri, None, None, f"--source {text!r}"))
    if not specs:  # nothing named anywhere: the default camera
        specs.append(SourceSpec(None, "webcam", None, None, "--source 'webcam' (the default)"))
    if len(specs) > 1 and source_id is not None:
        raise ConfigError("source_id: names one source; with several, name each as NAME=SPEC")
    named = []
    for i, spec in enumerate(specs):
        name = spec.id if spec.id is not None else (f"cam{i}" if len(specs) > 1 else source_id)
        where = "source_id" if spec.id is None and name is not None and len(specs) == 1 else spec.where
        if name is not None:
            check_source_name(name, where)
        named.append(dataclasses.replace(spec, id=name))
    seen: dict[str, tuple[SourceSpec, bool]] = {}
    for spec, given in zip(named, specs):
        if spec.id is None:
            continue
        auto = given.id is None  # named cam<i> by its place
        if spec.id in seen:
            first, first_auto = seen[spec.id]
            hint = " (unnamed sources are cam0, cam1, ... in order)" if auto or first_auto else ""
            raise ConfigError(f"{first.where} and {spec.where} are both named {spec.id!r}; give each source "
                              f"its own name{hint}")
        seen[spec.id] = (spec, auto)
    return named
