"""The progress bars of the commands (a run over files, ``batch`` over videos): tqdm on stderr."""

from __future__ import annotations

import os
import sys
from typing import Any


def progress_bar(total: int | None, unit: str) -> Any:
    """A tqdm bar on stderr that follows the terminal's width. A terminal that reports no size (a
    pty nobody sized, as some CI runners and ``script`` give) would get a bar of width 0, and tqdm
    then draws nothing at all: 80 columns and 20 rows then."""
    from tqdm import tqdm

    try:
        sized = min(os.get_terminal_size(sys.stderr.fileno())) > 0
    except OSError:
        sized = False
    if sized:
        return tqdm(total=total, unit=unit, file=sys.stderr, dynamic_ncols=True)
    return tqdm(total=total, unit=unit, file=sys.stderr, ncols=80, nrows=20)
