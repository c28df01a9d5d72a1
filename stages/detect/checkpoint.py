"""Detector checkpoints: find a YOLO model, refuse one that cannot be had or is unsafe to load, load it.

A ``.pt`` file is a pickle, and unpickling one runs whatever code it holds (a file named
``yolo11n.pt`` in the current folder may be anybody's). Unless trusted (``--trust-detector-model``),
every ``.pt``, official names included, is first read by PyTorch's restricted unpickler, which may
build only what a YOLO checkpoint is made of (torch.nn's and Ultralytics' layer classes, tensors,
plain containers); anything else is refused, named. Ultralytics then loads the checked bytes (from
a private copy), so the file cannot change in between. A ``.yaml`` model is built with random
weights and needs no file.

A ``.pt`` name not on this machine raises ``DetectorError`` without a download when ``YOLO_OFFLINE``
or ``HF_HUB_OFFLINE`` is set; otherwise Ultralytics may download an official name once. Every failure
is one ``DetectorError`` line. Ultralytics' pip auto-install and analytics are switched off in-process
(its settings file is not touched).
"""

from __future__ import annotations

import logging
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

from . import DetectorError

log = logging.getLogger(__name__)

_OFFLINE_ENV = ("YOLO_OFFLINE", "HF_HUB_OFFLINE")


def is_offline() -> bool:
    """True when the environment asks for no network: ``YOLO_OFFLINE`` or ``HF_HUB_OFFLINE``, both
    read as huggingface_hub reads its own flag (so the two never disagree)."""
    from huggingface_hub.constants import ENV_VARS_TRUE_VALUES

    return any(os.environ.get(name, "").upper() in ENV_VARS_TRUE_VALUES for name in _OFFLINE_ENV)


def _quiet_ultralytics() -> None:
    """Stop Ultralytics from pip-installing packages or posting analytics from this process."""
    import ultralytics.utils.checks as checks
    import ultralytics.utils.events as events

    checks.AUTOINSTALL = False
    events.events.enabled = False


def _missing_message(model: str, why: str) -> str:
    return (
        f"{model} is not on this machine{why}; pass --detector-model PATH "
        f"to a local .pt, --detector-model yolo11n.yaml for random weights (testing only), or --detector full-frame"
    )


def official_name(model: str | Path) -> bool:
    """True for a bare Ultralytics release name (``yolo11n.pt``), which Ultralytics fetches itself."""
    from ultralytics.utils.downloads import GITHUB_ASSETS_NAMES

    path = Path(str(model))
    return path.parent == Path(".") and path.name in GITHUB_ASSETS_NAMES


def check_detector_model(model: str | Path, trust: bool = False, read: bool = True) -> None:
    """Refuse, before anything loads, a model that cannot be had or would be unpickled untrusted
    (read=False: leave reading the file to the loader, which checks the bytes it loads)."""
    name = str(model)
    path = Path(name)
    if path.suffix.lower() in {".yaml", ".yml"}:
        return
    if path.parent != Path(".") and not path.is_file():
        raise DetectorError(_missing_message(name, " (no such file)"))
    if path.suffix.lower() == ".pt" and not trust and read:
        local = _local_weights(path)
        if local is not None:
            check_pickle(local.read_bytes(), name)
        elif not official_name(name):
            raise DetectorError(_missing_message(name, " (no such file)"))


def _local_weights(path: Path) -> Path | None:
    """The file a weights name stands for here: the path itself, or Ultralytics' weights folder."""
    if path.is_file():
        return path
    if path.parent == Path("."):
        from ultralytics.utils import SETTINGS

        cached = Path(SETTINGS["weights_dir"]) / path.name
        if cached.is_file():
            return cached
    return None


def _checkpoint_classes() -> list[type]:
    """What a YOLO checkpoint may be built of: the nn.Module classes of torch.nn and of Ultralytics'
    model modules and tasks (none of them fetches or loads anything when built: TorchVision, which
    can, is left out) and a few plain value types of its metadata."""
    import importlib
    import pathlib
    import types

    import torch.nn.modules

    found: set[type] = {set, frozenset, types.SimpleNamespace, pathlib.PosixPath, pathlib.WindowsPath}
    names = [f"torch.nn.modules.{m}" for m in dir(torch.nn.modules) if not m.startswith("_")]
    names += ["ultralytics.nn.tasks", "ultralytics.utils", *(f"ultralytics.nn.modules.{m}" for m in
                                                             ("block", "conv", "head", "transformer", "activation"))]
    for name in names:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        for value in vars(module).values():
            if not isinstance(value, type) or value.__name__ == "TorchVision":
                continue
            root = value.__module__.split(".")[0]
            if root in ("torch", "ultralytics") and (issubclass(value, torch.nn.Module) or
                                                     issubclass(value, types.SimpleNamespace)):
                found.add(value)
    return sorted(found, key=lambda t: f"{t.__module__}.{t.__qualname__}")


def _pickle_globals(data: bytes) -> list[str]:
    """``module.name`` of every global a pickle (or a zip checkpoint's data.pkl) imports, in order;
    for the error message only (the restricted unpickler is what decides)."""
    import io
    import pickletools
    import zipfile

    if zipfile.is_zipfile(io.BytesIO(data)):
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            pkl = next((n for n in archive.namelist() if n.endswith("data.pkl")), None)
            data = archive.read(pkl) if pkl else b""
    names, strings = [], []
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name == "GLOBAL":
                names.append(str(arg).replace(" ", "."))
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                names.append(f"{strings[-2]}.{strings[-1]}")
            elif isinstance(arg, str):
                strings.append(arg)
    except Exception:  # a damaged pickle: what was read so far
        pass
    return names


def check_pickle(data: bytes, name: str) -> None:
    """DetectorError unless PyTorch's restricted unpickler reads ``data`` as a YOLO checkpoint."""
    import io
    import pickle
    import re

    try:
        with torch.serialization.safe_globals(_checkpoint_classes()), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "pickle protocol 4": Ultralytics saves with it
            torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        allowed = {f"{t.__module__}.{t.__qualname__}" for t in _checkpoint_classes()}
        unsafe = [g for g in _pickle_globals(data) if g not in allowed and not g.startswith(("torch.", "collections."))]
        found = re.search(r"GLOBAL ([\w.]+)", str(exc))
        what = unsafe[0] if unsafe else found.group(1) if found else "something the restricted unpickler refuses"
        raise DetectorError(
            f"{name} is a pickle that names {what}, which a YOLO checkpoint has no need of: loading it could run "
            "any code; pass --trust-detector-model if you trust where it came from") from None
    except Exception as exc:  # not a checkpoint at all (truncated, another format)
        raise DetectorError(f"cannot load detector weights {name}: {type(exc).__name__}: "
                            f"{(str(exc).splitlines() or [''])[0][:200]}") from None


def load_yolo(model: str | Path, trust: bool = False) -> tuple[Any, bool]:
    """Build an Ultralytics YOLO; returns (model, random_weights). Raises DetectorError."""
    check_detector_model(model, trust, read=False)
    try:
        from ultralytics import YOLO
        from ultralytics.utils import SETTINGS
    except ImportError as exc:
        raise DetectorError(f"ultralytics is not installed ({exc}); install it or use --detector full-frame") from exc
    _quiet_ultralytics()
    name = str(model)
    path = Path(name)
    if path.suffix.lower() in {".yaml", ".yml"}:
        try:
            yolo = YOLO(name)  # architecture from the yaml, random init: no files needed
        except (FileNotFoundError, KeyError, ValueError, TypeError) as exc:
            raise DetectorError(f"cannot build a detector from {name}: {exc}") from exc
        log.warning("detector %s has random weights: it finds few or no people (testing only)", name)
        return yolo, True
    if not path.exists():
        cached = Path(SETTINGS["weights_dir"]) / path.name
        if cached.exists():
            path = cached
        elif is_offline():
            raise DetectorError(_missing_message(name, " and cannot be downloaded (offline)"))
        else:
            path = _download(name)
    private = None
    if path.suffix.lower() == ".pt" and not trust:  # load exactly the bytes that were checked
        data = path.read_bytes()
        check_pickle(data, name)
        private = tempfile.TemporaryDirectory(prefix="sapiens2-detector-")
        path = Path(private.name) / path.name
        path.write_bytes(data)
    try:
        yolo = YOLO(str(path))
    except (OSError, RuntimeError, ValueError, KeyError, AttributeError, TypeError) as exc:
        raise DetectorError(f"cannot load detector weights {name}: {exc}") from exc
    finally:
        if private is not None:
            private.cleanup()  # the model is in memory now
    return yolo, False


def _download(name: str) -> Path:
    """An official weights name fetched by Ultralytics from its release assets (online only)."""
    from ultralytics.utils.downloads import attempt_download_asset

    try:
        path = Path(attempt_download_asset(name))
    except Exception as exc:
        log.debug("download of %s failed", name, exc_info=True)
        raise DetectorError(_missing_message(name, f" and the download failed ({type(exc).__name__}; offline?)")) \
            from None
    if not path.is_file():
        raise DetectorError(_missing_message(name, " and the download failed (offline?)"))
    return path
