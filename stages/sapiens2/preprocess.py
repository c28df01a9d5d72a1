"""Batched input preparation on the model's device: person crops and full-frame resizes.

All functions are pure torch and take the image as a (3, H, W) uint8 tensor already on the device.
They reproduce the reference processor's arithmetic (transformers 5.23 ``Sapiens2ImageProcessor``).
"""

from __future__ import annotations

import functools
import platform
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


@functools.lru_cache(maxsize=64)
def device_constant(values: tuple, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A small constant tensor on ``device``, made once and shared (never modify it in place).

    ``torch.tensor(..., device="cuda")`` inside the per-frame path is a blocking copy from pageable
    memory: the host waits for the stream, and the next frame's work cannot be queued meanwhile.
    """
    return torch.tensor(values, dtype=dtype, device=device)


def upload(data, device: torch.device, pinned: bool = True,
           staging: Callable[[Tensor], Tensor] | None = None) -> Tensor:
    """Host array -> tensor on ``device``. On CUDA it is staged in page-locked memory and copied
    without blocking the host: through ``staging`` (a caller's reused buffers, e.g. the engine's
    ring) or a buffer of its own; ``pinned=False`` copies from pageable memory (the host waits)."""
    t = torch.as_tensor(data)
    if device.type == "cuda" and t.device.type == "cpu":
        if not pinned:
            return t.to(device)
        return staging(t) if staging is not None else t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def crop_params(boxes_xyxy: Tensor, input_size: tuple[int, int], padding: float = 1.25) -> tuple[Tensor, Tensor]:
    """Boxes (N, 4) xyxy -> centres (N, 2) and crop sizes (N, 2) (w, h): padded, widened to the input aspect."""
    x1, y1, x2, y2 = boxes_xyxy.float().unbind(-1)
    center = torch.stack(((x1 + x2) * 0.5, (y1 + y2) * 0.5), dim=-1)
    w, h = (x2 - x1) * padding, (y2 - y1) * padding
    aspect = input_size[1] / input_size[0]
    size = torch.where(
        (w > h * aspect)[..., None],
        torch.stack((w, w / aspect), dim=-1),
        torch.stack((h * aspect, h), dim=-1),
    )
    return center, size


def normalize(pixels: Tensor) -> Tensor:
    """0..255 float (B, 3, H, W) -> ImageNet-normalised float32."""
    mean = device_constant(MEAN, torch.float32, pixels.device).view(1, 3, 1, 1) * 255.0
    std = device_constant(STD, torch.float32, pixels.device).view(1, 3, 1, 1) * 255.0
    return (pixels.float() - mean) / std


def crop_persons(image: Tensor, boxes_xyxy: Tensor, input_size: tuple[int, int], padding: float = 1.25,
                 sampling: str = "auto") -> Tensor:
    """Affine-warp each box to the model input: (3, H, W) uint8 + (N, 4) -> (N, 3, h, w) normalised.

    Bilinear where the crop shrinks, bicubic where it enlarges, zeros outside the image.
    ``sampling``: "select" computes both samplings and selects per box (no host sync: the GPU way),
    "per-box" samples each crop once with its own filter (needs the choice on the host: the CPU
    way, 3x faster there); "auto" picks by the image's device. Both give the same crops.
    """
    out_h, out_w = input_size
    _, in_h, in_w = image.shape
    n = boxes_xyxy.shape[0]
    if n == 0:
        return torch.zeros(0, 3, out_h, out_w, device=image.device)
    center, size = crop_params(boxes_xyxy.to(image.device), input_size, padding)
    scale_x = (out_w - 1) / size[:, 0]  # (N,)
    scale_y = (out_h - 1) / size[:, 1]
    gy, gx = torch.meshgrid(
        torch.arange(out_h, dtype=torch.float32, device=image.device),
        torch.arange(out_w, dtype=torch.float32, device=image.device),
        indexing="ij",
    )
    # Same operation order as the reference so crops agree to the last bit.
    in_x = gx / scale_x[:, None, None] + center[:, 0, None, None] - 0.5 * size[:, 0, None, None]  # (N, h, w)
    in_y = gy / scale_y[:, None, None] + center[:, 1, None, None] - 0.5 * size[:, 1, None, None]
    # (a frame 1 pixel wide or high has one column or row to sample: any finite grid value finds it)
    grid = torch.stack((2.0 * in_x / max(in_w - 1, 1) - 1.0, 2.0 * in_y / max(in_h - 1, 1) - 1.0), dim=-1)
    shrink = torch.minimum(scale_x, scale_y) < 1.0  # (N,) bilinear where the crop shrinks
    pixels = image.float().unsqueeze(0)  # (1, 3, H, W)
    if sampling == "auto":
        sampling = "per-box" if image.device.type == "cpu" else "select"
    if sampling == "per-box":
        # No device to keep busy: sample each crop once, with its own filter (bicubic costs 4x).
        out = torch.empty(n, 3, out_h, out_w)
        for mode, chosen in (("bilinear", shrink), ("bicubic", ~shrink)):
            idx = chosen.nonzero().flatten()
            if len(idx):
                out[idx] = F.grid_sample(pixels.expand(len(idx), -1, -1, -1), grid[idx], mode=mode,
                                         padding_mode="zeros", align_corners=True)
        return normalize(out)
    src = pixels.expand(n, -1, -1, -1)
    bilinear = F.grid_sample(src, grid, mode="bilinear", padding_mode="zeros", align_corners=True)
    bicubic = F.grid_sample(src, grid, mode="bicubic", padding_mode="zeros", align_corners=True)
    return normalize(torch.where(shrink[:, None, None, None], bilinear, bicubic))


@functools.lru_cache(maxsize=8)
def _native_uint8_bilinear(device: torch.device) -> bool:
    """Whether torch resizes uint8 images itself (its AVX2/AVX512 and ARM CPU kernels), as torchvision asks."""
    return device.type == "cpu" and (torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
                                     or platform.machine() in ("aarch64", "arm64"))


def resize_bilinear(image: Tensor, size: tuple[int, int]) -> Tensor:
    """(C, H, W) uint8 -> (C, h, w) uint8, bilinear with antialiasing: torchvision's ``resize`` (v2) of
    a uint8 tensor, call for call, so the reference's pixels are ours bit for bit. Written out here
    because importing torchvision costs every process 1.3 s of CPU (it imports torch._dynamo)."""
    c, old_h, old_w = image.shape
    if (old_h, old_w) == tuple(size):
        return image
    batch = image.reshape(1, c, old_h, old_w)
    strides = batch.stride()
    if batch.is_contiguous(memory_format=torch.channels_last) and image.numel() != strides[0]:
        # (torchvision's re-striding: keeps a channels_last input's output channels_last, pytorch#68430)
        batch = batch.as_strided((1, c, old_h, old_w), [image.numel(), *strides[1:]])
    if _native_uint8_bilinear(image.device):
        out = F.interpolate(batch, size=list(size), mode="bilinear", align_corners=False, antialias=True)
    else:
        out = F.interpolate(batch.to(torch.float32), size=list(size), mode="bilinear", align_corners=False,
                            antialias=True).round_().to(torch.uint8)
    return out.reshape(c, *size)


def resize_full(image: Tensor, input_size: tuple[int, int]) -> Tensor:
    """Whole frame resized to the model input, aspect not kept (seg, matting): (1, 3, h, w) normalised."""
    resized = resize_bilinear(image, input_size)
    return normalize(resized.unsqueeze(0))


def fit_size(frame_hw: tuple[int, int], input_size: tuple[int, int]) -> tuple[int, int]:
    """Largest (h, w) with the frame's aspect that fits the input size."""
    scale = min(input_size[0] / frame_hw[0], input_size[1] / frame_hw[1])
    return int(frame_hw[0] * scale), int(frame_hw[1] * scale)


def pad_box(frame_hw: tuple[int, int], input_size: tuple[int, int]) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) of the frame's content inside the padded model input."""
    new_h, new_w = fit_size(frame_hw, input_size)
    top, left = (input_size[0] - new_h) // 2, (input_size[1] - new_w) // 2
    return top, left, top + new_h, left + new_w


def resize_pad(image: Tensor, input_size: tuple[int, int]) -> Tensor:
    """Aspect kept, zero-padded to the centre of the input (normals, pointmap): (1, 3, h, w) normalised."""
    frame_hw = (image.shape[1], image.shape[2])
    new_h, new_w = fit_size(frame_hw, input_size)
    resized = resize_bilinear(image, (new_h, new_w))
    top, left, bottom, right = pad_box(frame_hw, input_size)
    padded = F.pad(resized, (left, input_size[1] - right, top, input_size[0] - bottom))
    return normalize(padded.unsqueeze(0))


def to_device_image(image, device: torch.device, pinned: bool = True,
                    staging: Callable[[Tensor], Tensor] | None = None) -> Tensor:
    """(H, W, 3) uint8 numpy/tensor -> (3, H, W) uint8 tensor on device.

    On CUDA the frame is staged in page-locked memory (``staging``: see ``upload``) and copied
    without blocking the host; ``pinned=False`` copies straight from pageable memory (the host
    waits for the copy).
    """
    t = torch.as_tensor(image)
    if t.dtype != torch.uint8 or t.ndim != 3 or t.shape[-1] != 3:
        raise ValueError(f"expected an (H, W, 3) uint8 RGB image, got {tuple(t.shape)} {t.dtype}")
    return upload(t, device, pinned, staging).permute(2, 0, 1)
