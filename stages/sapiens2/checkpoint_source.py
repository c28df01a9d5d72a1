"""What a checkpoint source names: a hub repo (``owner/name``) or a local path. Torch-free, so the
command line can check a ``--checkpoint`` before anything heavy is imported."""

from __future__ import annotations

import os
import re
from pathlib import Path

HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


def is_hub_id(source: str | os.PathLike) -> bool:
    """True when ``source`` names a hub repo (``owner/name``) rather than a local path."""
    path = Path(source)
    looks_like_file = path.suffix in (".safetensors", ".pt", ".pth", ".bin", ".ckpt", ".json")
    return (not path.exists() and isinstance(source, str) and bool(HUB_ID.match(source)) and not looks_like_file
            and not source.startswith((".", "/")))
