"""Pure key remapping between checkpoint layouts. No I/O.

Layouts:
- ``original``: the published names (``backbone.blocks.N.attn.wq``, ``decode_head.conv_pose``), which
  both Meta's files and transformers' ``save_pretrained`` use;
- ``reference``: transformers' in-memory names (``model.embeddings.*``, ``model.model.layer.N.*``);
- ``ours``: original names, except the predictor is ``decode_head.predictor`` and ``attn.wq/wk/wv``
  are one ``attn.wqkv``.
"""

from __future__ import annotations

import re

import torch
from torch import Tensor

from ..tasks import TASKS
from .config import Sapiens2Config

# Keys real files may carry that the model does not need (RoPE periods are recomputed; the mask
# token only serves masked-image pretraining).
IGNORED = re.compile(r"(^|\.)(periods|mask_token)$")


def detect_layout(keys: list[str]) -> str:
    """'reference' for transformers' in-memory names, else 'original'."""
    if any(k.startswith(("model.embeddings.", "model.model.layer.")) for k in keys):
        return "reference"
    return "original"


_REFERENCE_RULES = [
    (r"^model\.embeddings\.cls_token$", "backbone.cls_token"),
    (r"^model\.embeddings\.register_tokens$", "backbone.storage_tokens"),
    (r"^model\.embeddings\.patch_embeddings\.", "backbone.patch_embed.projection."),
    (r"^model\.embeddings\.mask_token$", "backbone.mask_token"),
    (r"^model\.model\.layer\.(\d+)\.norm1\.", r"backbone.blocks.\1.ln1."),
    (r"^model\.model\.layer\.(\d+)\.norm2\.", r"backbone.blocks.\1.ln2."),
    (r"^model\.model\.layer\.(\d+)\.attention\.q_proj\.", r"backbone.blocks.\1.attn.wq."),
    (r"^model\.model\.layer\.(\d+)\.attention\.k_proj\.", r"backbone.blocks.\1.attn.wk."),
    (r"^model\.model\.layer\.(\d+)\.attention\.v_proj\.", r"backbone.blocks.\1.attn.wv."),
    (r"^model\.model\.layer\.(\d+)\.attention\.o_proj\.", r"backbone.blocks.\1.attn.proj."),
    (r"^model\.model\.layer\.(\d+)\.attention\.(q_norm|k_norm)\.", r"backbone.blocks.\1.attn.\2."),
    (r"^model\.model\.layer\.(\d+)\.layer_scale1\.lambda1$", r"backbone.blocks.\1.attn.gamma.weight"),
    (r"^model\.model\.layer\.(\d+)\.mlp\.down_proj\.", r"backbone.blocks.\1.ffn.w3."),
    (r"^model\.norm\.", "backbone.ln1."),
    (r"^decode_head\.input_conv\.convolution\.", "decode_head.input_conv.0."),
    (r"^scale_head\.predictor\.block1\.layers\.0\.", "decode_head.scale_final_layer.1."),
    (r"^scale_head\.predictor\.block2\.layers\.0\.", "decode_head.scale_final_layer.3."),
    (r"^scale_head\.predictor\.proj\.", "decode_head.scale_final_layer.5."),
]
_TRIPLE_INDEX = [
    (r"^decode_head\.conv_layers\.(\d+)\.convolution\.(.*)$", "decode_head.conv_layers.{}.{}"),
    (r"^scale_head\.conv_layers\.(\d+)\.convolution\.(.*)$", "decode_head.scale_conv_layers.{}.{}"),
]


def reference_to_original(sd: dict[str, Tensor], task: str) -> dict[str, Tensor]:
    """transformers' in-memory state dict -> published key names (gate/up fused back into w12)."""
    out: dict[str, Tensor] = {}
    pixel_shuffle = any(k.startswith("decode_head.input_conv.") for k in sd)
    for key, value in sd.items():
        m = re.match(r"^model\.model\.layer\.(\d+)\.mlp\.(gate_proj|up_proj)\.(weight|bias)$", key)
        if m:
            if m.group(2) == "gate_proj":
                up = sd[key.replace("gate_proj", "up_proj")]
                out[f"backbone.blocks.{m.group(1)}.ffn.w12.{m.group(3)}"] = torch.cat((value, up), 0)
            continue
        new = _rename_reference_key(key, task, pixel_shuffle)
        out[new] = value
    return out


def _rename_reference_key(key: str, task: str, pixel_shuffle: bool) -> str:
    for pattern, repl in _REFERENCE_RULES:
        if re.search(pattern, key):
            return re.sub(pattern, repl, key)
    for pattern, fmt in _TRIPLE_INDEX:
        m = re.match(pattern, key)
        if m:
            return fmt.format(3 * int(m.group(1)), m.group(2))
    m = re.match(r"^decode_head\.upsample_layers\.(\d+)\.convolution\.(.*)$", key)
    if m:
        i, rest = int(m.group(1)), m.group(2)
        if pixel_shuffle:
            return f"decode_head.upsample_blocks.{i}.0.{rest}"
        return f"decode_head.deconv_layers.{3 * i}.{rest}"
    if key.startswith("decode_head.predictor."):
        return key.replace("decode_head.predictor.", f"decode_head.{TASKS[task].predictor}.")
    return key  # unknown keys pass through and are reported by the strict load


def normalise_original(sd: dict[str, Tensor], cfg: Sapiens2Config) -> dict[str, Tensor]:
    """Published names -> our names before fusion: predictor renamed, ignorable keys dropped."""
    out: dict[str, Tensor] = {}
    predictor = f"decode_head.{TASKS[cfg.task].predictor}."
    for key, value in sd.items():
        if IGNORED.search(key):
            continue
        if key.startswith(predictor):
            key = "decode_head.predictor." + key[len(predictor):]
        out[key] = value
    return out


def _qkv_parts(cfg: Sapiens2Config, layer: int) -> tuple[tuple[int, int, int], tuple[bool, bool, bool]]:
    kv = cfg.num_key_value_heads_per_layer[layer] * cfg.head_dim
    return (cfg.hidden_size, kv, kv), (cfg.query_bias, cfg.key_bias, cfg.value_bias)


def fuse_qkv(sd: dict[str, Tensor], cfg: Sapiens2Config) -> dict[str, Tensor]:
    """Concatenate attn.wq/wk/wv into attn.wqkv (zero bias where a projection has none)."""
    out = dict(sd)
    for i in range(cfg.num_hidden_layers):
        p = f"backbone.blocks.{i}.attn."
        names = [p + n + ".weight" for n in ("wq", "wk", "wv")]
        if not all(n in out for n in names):
            continue  # left for the strict load to report
        weights = [out.pop(n) for n in names]
        out[p + "wqkv.weight"] = torch.cat(weights, 0)
        biases = [out.pop(p + n + ".bias", None) for n in ("wq", "wk", "wv")]
        if any(b is not None for b in biases):
            filled = [b if b is not None else torch.zeros(w.shape[0], dtype=w.dtype, device=w.device)
                      for b, w in zip(biases, weights)]
            out[p + "wqkv.bias"] = torch.cat(filled, 0)
    return out


def split_qkv(sd: dict[str, Tensor], cfg: Sapiens2Config) -> dict[str, Tensor]:
    """The inverse of ``fuse_qkv``: attn.wqkv back into wq/wk/wv, biases only where the config has them.
    A fused bias that is not zero where the config has none cannot be written in the published layout."""
    out = dict(sd)
    for i in range(cfg.num_hidden_layers):
        p = f"backbone.blocks.{i}.attn."
        if p + "wqkv.weight" not in out:
            continue
        sizes, has_bias = _qkv_parts(cfg, i)
        for name, weight in zip(("wq", "wk", "wv"), out.pop(p + "wqkv.weight").split(sizes, 0)):
            out[p + name + ".weight"] = weight
        bias = out.pop(p + "wqkv.bias", None)
        if bias is None:
            continue
        for name, part, keep in zip(("wq", "wk", "wv"), bias.split(sizes, 0), has_bias):
            if keep:
                out[p + name + ".bias"] = part
            elif not part.is_meta and bool(part.any()):
                raise ValueError(f"{p}{name}: the config has no bias for it, but the fused bias is not zero there")
    return out


def original_to_ours(sd: dict[str, Tensor], cfg: Sapiens2Config) -> dict[str, Tensor]:
    """Published names -> our module names (predictor renamed, ignorable keys dropped, q/k/v fused)."""
    return fuse_qkv(normalise_original(sd, cfg), cfg)


def ours_to_original(sd: dict[str, Tensor], cfg: Sapiens2Config) -> dict[str, Tensor]:
    """Our names -> published names, for writing checkpoints in the real layout."""
    sd = split_qkv(sd, cfg)
    predictor = f"decode_head.{TASKS[cfg.task].predictor}."
    return {(predictor + k[len("decode_head.predictor."):] if k.startswith("decode_head.predictor.") else k): v
            for k, v in sd.items()}
