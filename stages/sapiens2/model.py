"""Sapiens2 in plain PyTorch: ViT backbone (RoPE, QK-norm, GQA, SwiGLU) and the task heads. No I/O.

Names follow the published checkpoints (``ffn.w12``, ``decode_head.deconv_layers.0`` ...) except
``attn.wqkv``, the published ``wq``/``wk``/``wv`` fused into one GEMM at load (``remap``). Each
block is about 20 kernels: fused RMSNorm (``F.rms_norm``), RoPE on precomputed tables, LayerScale
and residual in one ``addcmul``.

Precision: in float16 (``set_precision``) the residual stream, the norms and LayerScale stay in
float32 and only the matmuls run in float16; outputs that overflow anyway are caught by the engine.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..tasks import get_task
from .config import Sapiens2Config


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor, out_dtype: torch.dtype | None = None) -> Tensor:
        """One fused kernel (``aten.rms_norm``) when x and the weight share a dtype; otherwise (the
        fp16-safe mode: float32 weights) in float32, cast to ``out_dtype``."""
        if self.weight.dtype == x.dtype:
            out = F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        else:
            out = F.rms_norm(x.float(), self.weight.shape, self.weight.float(), self.eps)
        return out if out_dtype is None or out.dtype == out_dtype else out.to(out_dtype)


class LayerScale(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.weight.to(x.dtype)

    def add_to(self, residual: Tensor, x: Tensor) -> Tensor:
        """residual + weight * x in one op (``addcmul``), in the residual's dtype."""
        if residual.dtype == x.dtype == self.weight.dtype:
            return torch.addcmul(residual, x, self.weight)
        return torch.addcmul(residual, x.to(residual.dtype), self.weight.to(residual.dtype))


def rope_tables(grid_h: int, grid_w: int, head_dim: int, base: float, num_prefix: int, device: torch.device,
                dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and signed sin (T, head_dim) for every token, in ``dtype``: patch centres normalised to
    [-1, 1] per axis, y frequencies first; the CLS and register rows are the identity (cos 1, sin 0).

    The sign of ``rotate_half`` is folded into the sin table: ``rope(x) = x * cos + roll(x, hd/2) * sin``.
    """
    inv_freq = 1.0 / base ** torch.arange(0, 1, 4 / head_dim, dtype=torch.float32, device=device)  # (hd/4,)
    ys = (torch.arange(0.5, grid_h, dtype=torch.float32, device=device) / grid_h) * 2 - 1
    xs = (torch.arange(0.5, grid_w, dtype=torch.float32, device=device) / grid_w) * 2 - 1
    coords = torch.stack(torch.meshgrid(ys, xs, indexing="ij"), dim=-1).flatten(0, 1)  # (P, 2)
    angles = (2 * math.pi * coords[:, :, None] * inv_freq[None, None, :]).flatten(1, 2)  # (P, hd/2)
    angles = angles.tile(2)  # (P, hd)
    half = head_dim // 2
    sign = torch.cat((torch.full((half,), -1.0, device=device), torch.ones(half, device=device)))  # (hd,)
    cos = torch.cat((torch.ones(num_prefix, head_dim, device=device), angles.cos()))  # (T, hd)
    sin = torch.cat((torch.zeros(num_prefix, head_dim, device=device), angles.sin() * sign))  # (T, hd)
    return cos.to(dtype), sin.to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x (B, T, H, hd) by the tables (T, 1, hd): three kernels, no slicing or concatenation."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin)


class Attention(nn.Module):
    """Multi-head attention with QK-norm, 2-D RoPE and GQA; q, k and v come from one fused GEMM
    (``wqkv``; the published ``wq``/``wk``/``wv`` are concatenated at load, see ``remap.fuse_qkv``)."""

    def __init__(self, cfg: Sapiens2Config, num_kv_heads: int) -> None:
        super().__init__()
        d, hd = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, num_kv_heads, hd
        self.qkv_sizes = (d, num_kv_heads * hd, num_kv_heads * hd)
        # A projection the checkpoint has no bias for gets a zero slice of the fused bias.
        self.qkv_bias = (cfg.query_bias, cfg.key_bias, cfg.value_bias)
        self.wqkv = nn.Linear(d, sum(self.qkv_sizes), bias=any(self.qkv_bias))
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps) if cfg.use_qk_norm else None
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps) if cfg.use_qk_norm else None
        self.proj = nn.Linear(d, d, bias=cfg.proj_bias)
        self.gamma = LayerScale(d)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.wqkv(x).split(self.qkv_sizes, dim=-1)
        q = q.view(b, t, self.num_heads, self.head_dim)  # (B, T, H, hd)
        k = k.view(b, t, self.num_kv_heads, self.head_dim)  # (B, T, Hkv, hd)
        v = v.view(b, t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q, x.dtype), self.k_norm(k, x.dtype)
        cos, sin = rope  # (T, 1, hd)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             enable_gqa=self.num_kv_heads != self.num_heads)  # (B, H, T, hd)
        return self.proj(out.transpose(1, 2).reshape(b, t, d))


class SwiGLU(nn.Module):
    """w12 holds gate and up projections stacked (one GEMM); w3 projects back."""

    def __init__(self, cfg: Sapiens2Config) -> None:
        super().__init__()
        self.w12 = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.w3 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.w12(x).chunk(2, dim=-1)
        return self.w3(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: Sapiens2Config, num_kv_heads: int) -> None:
        super().__init__()
        self.ln1 = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = Attention(cfg, num_kv_heads)
        self.ln2 = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.ffn = SwiGLU(cfg)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], compute_dtype: torch.dtype) -> Tensor:
        # x is the residual stream (float32 in the fp16-safe mode); branches run in compute_dtype.
        x = self.attn.gamma.add_to(x, self.attn(self.ln1(x, compute_dtype), rope))
        out = self.ffn(self.ln2(x, compute_dtype))
        return x + (out if out.dtype == x.dtype else out.to(x.dtype))


class Backbone(nn.Module):
    def __init__(self, cfg: Sapiens2Config) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden_size
        self.patch_embed = nn.Module()
        self.patch_embed.projection = nn.Conv2d(3, d, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        self.storage_tokens = nn.Parameter(torch.zeros(1, cfg.num_register_tokens, d))
        self.blocks = nn.ModuleList(Block(cfg, kv) for kv in cfg.num_key_value_heads_per_layer)
        self.ln1 = RMSNorm(d, cfg.rms_norm_eps)
        self.residual_dtype: torch.dtype | None = None  # None: same as the weights
        self._rope_cache: dict[tuple, tuple[Tensor, Tensor]] = {}

    def rope(self, grid_h: int, grid_w: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """RoPE tables (T, 1, hd) for a patch grid, made once per grid, device and dtype."""
        key = (grid_h, grid_w, device, dtype)
        if key not in self._rope_cache:
            cos, sin = rope_tables(grid_h, grid_w, self.cfg.head_dim, self.cfg.rope_theta,
                                   self.cfg.num_prefix_tokens, device, dtype)
            self._rope_cache[key] = cos[:, None], sin[:, None]
        return self._rope_cache[key]

    def forward_features(self, pixels: Tensor) -> Tensor:
        """pixels (B, 3, H, W) normalised -> final-normed patch features (B, D, H/16, W/16)."""
        compute_dtype = self.patch_embed.projection.weight.dtype
        residual_dtype = self.residual_dtype or compute_dtype
        b, _, h, w = pixels.shape
        gh, gw = h // self.cfg.patch_size, w // self.cfg.patch_size
        patches = self.patch_embed.projection(pixels.to(compute_dtype)).flatten(2).transpose(1, 2)  # (B, P, D)
        x = torch.cat(
            (self.cls_token.expand(b, -1, -1), self.storage_tokens.expand(b, -1, -1), patches), dim=1
        ).to(residual_dtype)  # (B, T, D)
        rope = self.rope(gh, gw, pixels.device, compute_dtype)
        for block in self.blocks:
            x = block(x, rope, compute_dtype)
        x = self.ln1(x, compute_dtype)[:, self.cfg.num_prefix_tokens :]  # (B, P, D)
        return x.transpose(1, 2).reshape(b, -1, gh, gw)


class InstanceNorm(nn.Module):
    """Affine-free instance norm. float16 input is normalised in float32 (its squares overflow);
    bfloat16 and float32 in their own dtype (the kernels accumulate in float32), which spares a
    float32 copy of every head activation."""

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype == torch.float16:
            return F.instance_norm(x.float(), eps=1e-5).to(x.dtype)
        return F.instance_norm(x, eps=1e-5)


def _norm_act() -> list[nn.Module]:
    return [InstanceNorm(), nn.SiLU()]


class Head(nn.Module):
    """Decode head. Sequential indices reproduce the original key names (deconv_layers.3, ...)."""

    def __init__(self, cfg: Sapiens2Config) -> None:
        super().__init__()
        hc = cfg.head
        assert hc is not None
        d = cfg.hidden_size
        self.pixel_shuffle = hc.use_pixel_shuffle
        if hc.use_pixel_shuffle:
            self.input_conv = nn.Sequential(nn.Conv2d(d, d, 3, padding=1), *_norm_act())
            blocks, in_ch = [], d
            for out_ch, k in zip(hc.upsample_out_channels, hc.upsample_kernel_sizes):
                blocks.append(
                    nn.Sequential(
                        nn.Conv2d(in_ch, out_ch * 4, k, padding=(k - 1) // 2), nn.PixelShuffle(2), *_norm_act()
                    )
                )
                in_ch = out_ch
            self.upsample_blocks = nn.ModuleList(blocks)
        else:
            layers, in_ch = [], d
            for out_ch, k in zip(hc.upsample_out_channels, hc.upsample_kernel_sizes):
                layers += [nn.ConvTranspose2d(in_ch, out_ch, k, stride=2, padding=1, bias=False), *_norm_act()]
                in_ch = out_ch
            self.deconv_layers = nn.Sequential(*layers)
        convs = []
        for out_ch, k in zip(hc.conv_out_channels, hc.conv_kernel_sizes):
            pad = (k - 1) // 2 if hc.use_pixel_shuffle else 0
            convs += [nn.Conv2d(in_ch, out_ch, k, padding=pad), *_norm_act()]
            in_ch = out_ch
        self.conv_layers = nn.Sequential(*convs)
        self.predictor = nn.Conv2d(in_ch, cfg.num_labels, 1)
        if hc.has_scale:
            scale_layers, s_in = [], d
            for out_ch, k in zip(hc.scale_conv_out_channels, hc.scale_conv_kernel_sizes):
                scale_layers += [nn.Conv2d(s_in, out_ch, k, stride=2, padding=(k - 1) // 2), *_norm_act()]
                s_in = out_ch
            self.scale_conv_layers = nn.Sequential(*scale_layers)
            h1, h2 = hc.scale_final_hidden_sizes
            self.scale_final_layer = nn.Sequential(
                nn.Flatten(), nn.Linear(hc.scale_final_input_size, h1), nn.SiLU(), nn.Linear(h1, h2), nn.SiLU(),
                nn.Linear(h2, 1),
            )

    def forward(self, features: Tensor) -> tuple[Tensor, Tensor | None]:
        """features (B, D, h, w) -> (maps (B, num_labels, h*f, w*f), scale (B, 1) or None)."""
        x = features
        if self.pixel_shuffle:
            x = self.input_conv(x)
            for block in self.upsample_blocks:
                x = block(x)
        else:
            x = self.deconv_layers(x)
        maps = self.predictor(self.conv_layers(x))
        scale = self.scale_final_layer(self.scale_conv_layers(features)) if hasattr(self, "scale_final_layer") else None
        return maps, scale


class Sapiens2(nn.Module):
    """Backbone + one task head. forward(pixels) returns the raw head output (and scale for pointmap)."""

    def __init__(self, cfg: Sapiens2Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.backbone = Backbone(cfg)
        self.decode_head = Head(cfg)
        self.activation = get_task(cfg.task).activation  # on the head's maps (matting: sigmoid)
        self.channels_last = False  # decode head in NHWC (see set_channels_last)

    @property
    def dtype(self) -> torch.dtype:
        return self.backbone.patch_embed.projection.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.backbone.patch_embed.projection.weight.device

    def set_precision(self, dtype: torch.dtype) -> Sapiens2:
        """Cast once to dtype; in float16 the weights of the residual stream's norms and of LayerScale
        stay float32 (QK-norm runs on float16 GEMM outputs: in float16, with a float32 accumulator)."""
        bb = self.backbone
        on_residual = [bb.ln1, *(n for b in bb.blocks for n in (b.ln1, b.ln2, b.attn.gamma))]
        keep = {id(p) for m in on_residual for p in m.parameters()}
        for param in self.parameters():
            target = torch.float32 if dtype == torch.float16 and id(param) in keep else dtype
            param.data = param.data.to(target)
        self.backbone.residual_dtype = torch.float32 if dtype == torch.float16 else None
        return self

    def set_channels_last(self, enabled: bool) -> Sapiens2:
        """Run the decode head's convolutions in channels_last (NHWC) memory format, or back to NCHW.

        Only the layout changes, not the values: cuDNN picks its faster NHWC kernels on tensor cores.
        """
        fmt = torch.channels_last if enabled else torch.contiguous_format
        for module in self.decode_head.modules():
            if isinstance(module, nn.Conv2d | nn.ConvTranspose2d):
                module.weight.data = module.weight.data.contiguous(memory_format=fmt)
        self.channels_last = enabled
        return self

    def forward(self, pixels: Tensor) -> tuple[Tensor, Tensor | None]:
        features = self.backbone.forward_features(pixels)  # (B, D, h, w)
        if self.channels_last:
            features = features.contiguous(memory_format=torch.channels_last)
        maps, scale = self.decode_head(features)
        if self.activation == "sigmoid":
            maps = maps.sigmoid()  # matting: (B, 4, H, W) premultiplied RGB foreground + alpha
        return maps, scale
