"""Typed Sapiens2 architecture config, the table of published variants, and config.json parsing.

A checkpoint folder's ``config.json`` (as transformers' ``save_pretrained`` writes it) is parsed
into :class:`Sapiens2Config`; unknown architectures, missing or ill-typed fields fail with
:class:`ConfigError` naming the field and the file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from ..tasks import TASKS, get_task


@dataclass
class HeadConfig:
    """Decode head: upsampling blocks, refinement convs, 1x1 predictor; optional pointmap scale branch.

    Deconv heads (pose, seg) upsample with stride-2 transposed convs; pixel-shuffle heads
    (matting, normal, pointmap) start with a 3x3 input conv and upsample with conv + PixelShuffle(2).
    """

    upsample_out_channels: list[int]
    upsample_kernel_sizes: list[int]
    conv_out_channels: list[int]
    conv_kernel_sizes: list[int]
    use_pixel_shuffle: bool = False
    scale_conv_out_channels: list[int] | None = None
    scale_conv_kernel_sizes: list[int] | None = None
    scale_final_hidden_sizes: list[int] | None = None
    scale_final_input_size: int | None = None

    def __post_init__(self) -> None:
        if len(self.upsample_kernel_sizes) != len(self.upsample_out_channels):
            raise ConfigError("head_config: upsample_kernel_sizes and upsample_out_channels differ in length")
        if len(self.conv_kernel_sizes) != len(self.conv_out_channels):
            raise ConfigError("head_config: conv_kernel_sizes and conv_out_channels differ in length")
        has_scale = self.scale_conv_out_channels is not None
        if has_scale and (self.scale_final_hidden_sizes is None or len(self.scale_final_hidden_sizes) != 2):
            raise ConfigError("head_config: a scale branch needs scale_final_hidden_sizes with two entries")
        if has_scale and self.scale_conv_kernel_sizes is None:
            self.scale_conv_kernel_sizes = [1] * len(self.scale_conv_out_channels)

    @property
    def has_scale(self) -> bool:
        return self.scale_conv_out_channels is not None


@dataclass
class Sapiens2Config:
    """One Sapiens2 model: ViT backbone + one task head. Derived fields are set in __post_init__."""

    task: str
    hidden_size: int = 1024
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    intermediate_size: int = 4096
    num_key_value_heads_per_layer: list[int] = field(default_factory=list)
    num_register_tokens: int = 8
    patch_size: int = 16
    image_size: tuple[int, int] = (1024, 768)
    rope_theta: float = 100.0
    rms_norm_eps: float = 1e-6
    query_bias: bool = True
    key_bias: bool = True
    value_bias: bool = True
    proj_bias: bool = True
    mlp_bias: bool = True
    use_qk_norm: bool = True
    num_labels: int = 308
    head: HeadConfig | None = None

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ConfigError(f"unknown task {self.task!r}; expected one of {', '.join(TASKS)}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError("hidden_size must be divisible by num_attention_heads")
        self.head_dim = self.hidden_size // self.num_attention_heads
        if self.head_dim % 4:
            raise ConfigError("head_dim must be divisible by 4 (2-D RoPE splits it into y and x halves)")
        if not self.num_key_value_heads_per_layer:
            self.num_key_value_heads_per_layer = default_kv_heads(self.num_hidden_layers, self.num_attention_heads)
        if len(self.num_key_value_heads_per_layer) != self.num_hidden_layers:
            raise ConfigError("num_key_value_heads_per_layer must have one entry per layer")
        for kv in self.num_key_value_heads_per_layer:
            if kv <= 0 or self.num_attention_heads % kv:
                raise ConfigError(f"{kv} key/value heads do not divide {self.num_attention_heads} attention heads")
        self.image_size = tuple(int(s) for s in self.image_size)
        if self.head is None:
            raise ConfigError("a task model needs a head config")
        if self.head.has_scale and self.head.scale_final_input_size is None:
            self.head.scale_final_input_size = scale_input_size(self)

    @property
    def num_prefix_tokens(self) -> int:
        return 1 + self.num_register_tokens


def check_image_size(size: tuple[int, int], patch_size: int = 16) -> None:
    if any(s <= 0 or s % patch_size for s in size):
        raise ConfigError(f"input size {size[0]}x{size[1]} must be positive multiples of {patch_size}")


def default_kv_heads(num_layers: int, num_heads: int, first_full: int = 8, last_full: int = 8) -> list[int]:
    """First and last 8 layers full multi-head attention, the middle ones GQA with half the KV heads."""
    return [
        num_heads if (i < first_full or i >= num_layers - last_full) else num_heads // 2 for i in range(num_layers)
    ]


def scale_input_size(cfg: Sapiens2Config) -> int:
    """Flattened size entering the pointmap scale MLP (depends on the input size the model was built for)."""
    assert cfg.head is not None and cfg.head.scale_conv_out_channels is not None
    h, w = (s // cfg.patch_size for s in cfg.image_size)
    for k in cfg.head.scale_conv_kernel_sizes or []:
        pad = (k - 1) // 2
        h = (h + 2 * pad - k) // 2 + 1
        w = (w + 2 * pad - k) // 2 + 1
    return h * w * cfg.head.scale_conv_out_channels[-1]


# Backbone sizes of the published checkpoints: (hidden, layers, heads).
BACKBONES = {
    "0.4b": (1024, 24, 16),
    "0.8b": (1280, 32, 16),
    "1b": (1536, 40, 24),
    "5b": (2432, 56, 32),
}


def default_head(task: str, hidden: int, channels: tuple[int, ...] | None = None) -> HeadConfig:
    """The head layout of a task (its registry entry) when no config.json says otherwise: the published
    one, or with ``channels`` for the upsampling blocks (make-tiny)."""
    spec = get_task(task)
    up = list(channels or spec.upsample)
    shuffle = spec.head == "pixel_shuffle"
    head = HeadConfig(up, [3 if shuffle else 4] * len(up), [up[-1]] * 2, [3 if shuffle else 1] * 2,
                      use_pixel_shuffle=shuffle)
    if spec.scale_head:
        published = channels is None
        head.scale_conv_out_channels = [256, 128, 64] if published else [16, 16]
        head.scale_conv_kernel_sizes = [3] * len(head.scale_conv_out_channels)
        head.scale_final_hidden_sizes = [128, 64] if published else [32, 16]
    return head


def variant(task: str, size: str, **overrides: Any) -> Sapiens2Config:
    """The published architecture ``facebook/sapiens2-{task}-{size}`` (head layout assumed)."""
    if size not in BACKBONES:
        raise ConfigError(f"unknown model size {size!r}; expected one of {', '.join(BACKBONES)}")
    hidden, layers, heads = BACKBONES[size]
    kwargs: dict[str, Any] = dict(
        task=task,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        num_labels=get_task(task).num_labels,
        head=default_head(task, hidden),
    )
    kwargs.update(overrides)
    return Sapiens2Config(**kwargs)
