"""JPEG of published frames on the GPU (nvJPEG through torchvision), with the CPU encoder as fallback."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


class JpegEncoder:
    """JPEG of published frames on a torch device (nvJPEG through torchvision on CUDA).

    device: "auto" (CUDA when present), a device name, or None (off). ``encode`` returns None when
    the caller should use the CPU encoder instead: no device, or after the first failure, which is
    logged once and turns this encoder off for the rest of the run.
    """

    def __init__(self, quality: int = 90, device: str | None = "auto") -> None:
        self.quality = quality
        self.device: Any = None
        if device is None:
            return
        import torch

        if device == "auto":
            if not torch.cuda.is_available():
                log.info("gpu_jpeg: no CUDA device; frames are JPEG-encoded on the CPU")
                return
            device = "cuda"
        self.device = torch.device(device)
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._staging: Any = None  # pinned (H, W, 3) uint8 host buffer, reused while the size holds

    @property
    def active(self) -> bool:
        return self.device is not None

    def encode(self, image: np.ndarray) -> bytes | None:
        """(H, W, 3) RGB uint8 -> JPEG bytes, or None: use the CPU path."""
        if self.device is None:
            return None
        try:
            return self._encode(image)
        except (ImportError, RuntimeError, ValueError, TypeError, OSError) as exc:
            # ImportError: torchvision 0.29 deprecates its image codecs (TorchCodec replaces them);
            # a release without encode_jpeg must leave the CPU encoder working.
            log.warning("GPU JPEG encoding failed (%s); encoding frames on the CPU from now on",
                        str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
            self.device = None
            return None

    def _encode(self, image: np.ndarray) -> bytes:
        import torch
        from torchvision.io import encode_jpeg

        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            raise ValueError(f"expected (H, W, 3) uint8 RGB, got {image.shape} {image.dtype}")
        host = torch.from_numpy(np.ascontiguousarray(image))
        if self.device.type == "cuda":
            if self._staging is None or self._staging.shape != host.shape:
                self._staging = torch.empty(host.shape, dtype=torch.uint8, pin_memory=True)
            self._staging.copy_(host)
            with torch.cuda.stream(self._stream):  # off the model streams
                chw = self._staging.to(self.device, non_blocking=True).permute(2, 0, 1).contiguous()  # (3, H, W)
                # torchvision's nvJPEG encoder works on a stream of its own: the input must be ready.
                self._stream.synchronize()
                encoded = encode_jpeg(chw, quality=self.quality)
            # It writes the bitstream on the legacy default stream; copy it out on that stream too.
            data = encoded.cpu()
        else:
            data = encode_jpeg(host.permute(2, 0, 1).contiguous(), quality=self.quality)
        return data.numpy().tobytes()
