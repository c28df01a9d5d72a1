"""Output files checked before anything is opened: a run that cannot write its output says so at
once, in one line, and leaves nothing on disk (the check creates and removes a probe file, so a
read-only mount or a folder that refuses even root is found too, where ``os.access`` says yes)."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path


_WHY = {errno.EACCES: "permission denied", errno.EPERM: "permission denied", errno.EROFS: "a read-only file system",
        errno.ENOSPC: "no space left", errno.EDQUOT: "over its quota"}


def unwritable(path: str | Path) -> str | None:
    """Why ``path`` cannot be created (with any missing folders) or replaced; None when it can."""
    path = Path(path)
    if path.is_dir():
        return f"{path} is a folder; name a file"
    existing = next((p for p in path.parents if p.exists()), None)
    if existing is None or not existing.is_dir():
        return f"{existing} is not a folder"
    if path.exists() and not os.access(path, os.W_OK):
        return f"{path} is not writable"
    try:  # the folder must take new files: writers create theirs there (and rename over the old one)
        fd, probe = tempfile.mkstemp(prefix=".sapiens2-probe-", dir=existing)
    except OSError as exc:  # one reason: the OS's words only where they add one (/proc answers "no such file")
        why = _WHY.get(exc.errno)
        return f"{existing} is not writable{f' ({why})' if why else ''}"
    os.close(fd)
    os.unlink(probe)
    return None
