"""The one place a device name becomes a torch device: ``auto`` chosen, ``cuda`` given its index.

An unindexed ``torch.device("cuda")`` means "the current device" to some calls and is refused by
others (``torch.cuda.set_device`` on torch 2.11 ended every phase of the first GPU benchmark), and
comparing it with a tensor's device (always indexed) is never equal: every CUDA device the code
holds is indexed, resolved here once.
"""

from __future__ import annotations

import torch


class DeviceError(ValueError):
    """A device that is not one, or not on this machine; the message says what to use."""


def resolve_device(name: str | torch.device | None = "auto", make_current: bool = False) -> torch.device:
    """``auto``/None: ``cuda:N`` (the current device) when CUDA is available, else ``cpu``; ``cuda``:
    ``cuda:N`` likewise; ``cuda:N`` checked against the devices present. ``make_current`` makes a CUDA
    device the current one, so that a library that says just "cuda" (Ultralytics) lands on it."""
    if name is None or name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise DeviceError(f"device {name!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type != "cuda":
        raise DeviceError(f"device {name!r} is not supported; use auto, cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise DeviceError(f"device {name!r} requested but CUDA is not available; use --device cpu")
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise DeviceError(f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s) here")
    if make_current:
        torch.cuda.set_device(index)
    return torch.device("cuda", index)


__all__ = ["DeviceError", "resolve_device"]
