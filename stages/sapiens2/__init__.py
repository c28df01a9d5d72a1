"""Sapiens2 inference core: model, loading, pre/post-processing and task estimators.

The model and its loader (torch) are imported on first use, so that the configuration side
(``stages.sapiens2.config``, ``.fastpath_options``) can be checked without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from .config import ConfigError, HeadConfig, Sapiens2Config, variant

_LAZY = {"Sapiens2": ".model", "CheckpointError": ".weights", "load_model": ".weights"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CheckpointError", "ConfigError", "HeadConfig", "Sapiens2", "Sapiens2Config", "load_model",
           "variant"]
