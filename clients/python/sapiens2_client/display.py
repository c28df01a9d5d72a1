"""Whether a preview window (``--show``, OpenCV's highgui) can open here: without a display,
OpenCV's Qt build aborts the whole process (SIGABRT), taking unfinished recordings with it, so
the command lines ask first."""

from __future__ import annotations

import os
import sys


def no_display() -> str | None:
    """Why a window cannot open on this machine, or None when it may (Linux is checked; on macOS
    and Windows a desktop session is assumed)."""
    if not sys.platform.startswith("linux"):
        return None
    if os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"):
        return None
    return "no display here (DISPLAY and WAYLAND_DISPLAY are unset, e.g. over ssh or in a container)"
