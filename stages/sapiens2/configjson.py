"""config.json <-> Sapiens2Config, and inferring the architecture from tensor names and shapes."""

from __future__ import annotations

import re
from typing import Any

from torch import Tensor

from ..tasks import TASKS, by_architecture
from .config import BACKBONES, ConfigError, HeadConfig, Sapiens2Config

_INT_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
_OPTIONAL = {
    "num_register_tokens": int, "patch_size": int, "rope_theta": (int, float), "rms_norm_eps": (int, float),
    "query_bias": bool, "key_bias": bool, "value_bias": bool, "proj_bias": bool, "mlp_bias": bool,
    "use_qk_norm": bool, "use_gated_mlp": bool, "hidden_act": str, "num_key_value_heads_per_layer": list,
    "num_channels": int, "image_size": (int, list), "layerscale_value": (int, float),
}


def _typed(d: dict, key: str, types: Any, where: str) -> Any:
    value = d[key]
    allowed = types if isinstance(types, tuple) else (types,)
    if (isinstance(value, bool) and bool not in allowed) or not isinstance(value, allowed):
        raise ConfigError(f"{where}: field {key!r} has the wrong type ({type(value).__name__}: {value!r})")
    return value


def _int_list(d: dict, key: str, where: str, required: bool = False) -> list[int] | None:
    if d.get(key) is None:
        if required:
            raise ConfigError(f"{where}: head_config is missing the field {key!r}")
        return None
    value = d[key]
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ConfigError(f"{where}: head_config field {key!r} must be a list of integers, got {value!r}")
    return value


def config_from_json(data: Any, where: str = "config.json") -> Sapiens2Config:
    """Parse a transformers-style Sapiens2 config.json dict; every problem names the field and file."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a JSON object")
    if data.get("model_type") not in (None, "sapiens2"):
        raise ConfigError(f"{where}: model_type is {data.get('model_type')!r}, not a Sapiens2 checkpoint")
    archs = data.get("architectures")
    spec = by_architecture(archs[0]) if archs and isinstance(archs, list) else None
    if spec is None:
        names = ", ".join(s.architecture for s in TASKS.values())
        raise ConfigError(f"{where}: field 'architectures' must name one of {names}, got {archs!r}")
    task = spec.name
    for key in _INT_FIELDS:
        if key not in data:
            raise ConfigError(f"{where}: missing required field {key!r}")
        _typed(data, key, int, where)
        if data[key] <= 0:
            raise ConfigError(f"{where}: field {key!r} must be positive, got {data[key]}")
    for key, types in _OPTIONAL.items():
        if key in data and data[key] is not None:
            _typed(data, key, types, where)
    if data.get("use_gated_mlp", True) is not True or data.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"{where}: only the gated SiLU MLP of the published checkpoints is supported")
    if data.get("num_channels", 3) != 3:
        raise ConfigError(f"{where}: num_channels must be 3")
    if data.get("layerscale_value", 1.0) is None:
        raise ConfigError(f"{where}: layerscale_value must be a number")
    head = data.get("head_config")
    if not isinstance(head, dict):
        raise ConfigError(f"{where}: missing required field 'head_config'")
    up = _int_list(head, "upsample_out_channels", where, required=True)
    conv = _int_list(head, "conv_out_channels", where) or []
    try:
        head_cfg = _head_config(head, up, conv, where)
    except ConfigError as exc:
        raise ConfigError(str(exc) if str(exc).startswith(where) else f"{where}: {exc}") from None
    labels = data.get("id2label")
    if isinstance(labels, dict) and labels:
        num_labels = len(labels)
    else:
        num_labels = data.get("num_labels", spec.num_labels)
    image_size = data.get("image_size", [1024, 768])
    if isinstance(image_size, int):
        image_size = [image_size, image_size]
    kwargs = {k: data[k] for k in _INT_FIELDS}
    for key in ("num_register_tokens", "patch_size", "rope_theta", "rms_norm_eps", "query_bias", "key_bias",
                "value_bias", "proj_bias", "mlp_bias", "use_qk_norm"):
        if data.get(key) is not None:
            kwargs[key] = data[key]
    kv = data.get("num_key_value_heads_per_layer")
    try:
        return Sapiens2Config(task=task, num_labels=num_labels, image_size=tuple(image_size), head=head_cfg,
                              num_key_value_heads_per_layer=list(kv or []), **kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _head_config(head: dict, up: list[int], conv: list[int], where: str) -> HeadConfig:
    return HeadConfig(
        upsample_out_channels=up,
        upsample_kernel_sizes=(
            _int_list(head, "upsample_kernel_sizes", where) or [head.get("upsample_kernel_size", 4)] * len(up)
        ),
        conv_out_channels=conv,
        conv_kernel_sizes=_int_list(head, "conv_kernel_sizes", where) or [head.get("conv_kernel_size", 1)] * len(conv),
        use_pixel_shuffle=bool(head.get("use_pixel_shuffle")),
        scale_conv_out_channels=_int_list(head, "scale_conv_out_channels", where),
        scale_conv_kernel_sizes=_int_list(head, "scale_conv_kernel_sizes", where),
        scale_final_hidden_sizes=_int_list(head, "scale_final_hidden_sizes", where),
        scale_final_input_size=head.get("scale_final_input_size"),
    )


def config_to_json(cfg: Sapiens2Config, flip_pairs: list[list[int]] | None = None) -> dict[str, Any]:
    """The config.json transformers 5.23 writes for this architecture (loadable by the reference)."""
    hc = cfg.head
    assert hc is not None
    head: dict[str, Any] = {
        "upsample_out_channels": hc.upsample_out_channels, "upsample_kernel_sizes": hc.upsample_kernel_sizes,
        "conv_out_channels": hc.conv_out_channels, "conv_kernel_sizes": hc.conv_kernel_sizes,
        "use_pixel_shuffle": True if hc.use_pixel_shuffle else None, "model_type": "sapiens2_head",
    }
    if hc.has_scale:
        head.update(scale_conv_out_channels=hc.scale_conv_out_channels,
                    scale_conv_kernel_sizes=hc.scale_conv_kernel_sizes,
                    scale_final_hidden_sizes=hc.scale_final_hidden_sizes,
                    scale_final_input_size=hc.scale_final_input_size)
    return {
        "architectures": [TASKS[cfg.task].architecture], "model_type": "sapiens2",
        "hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads, "intermediate_size": cfg.intermediate_size,
        "num_key_value_heads_per_layer": list(cfg.num_key_value_heads_per_layer),
        "num_register_tokens": cfg.num_register_tokens, "patch_size": cfg.patch_size,
        "image_size": list(cfg.image_size), "rope_theta": cfg.rope_theta, "rms_norm_eps": cfg.rms_norm_eps,
        "query_bias": cfg.query_bias, "key_bias": cfg.key_bias, "value_bias": cfg.value_bias,
        "proj_bias": cfg.proj_bias, "mlp_bias": cfg.mlp_bias, "use_qk_norm": cfg.use_qk_norm,
        "use_gated_mlp": True, "hidden_act": "silu", "layerscale_value": 1.0, "num_channels": 3,
        "id2label": {str(i): f"LABEL_{i}" for i in range(cfg.num_labels)},
        "label2id": {f"LABEL_{i}": i for i in range(cfg.num_labels)},
        "flip_pairs": flip_pairs, "head_config": head, "dtype": "float32",
    }


def infer_config(sd: dict[str, Tensor], where: str, image_size: tuple[int, int] = (1024, 768)) -> Sapiens2Config:
    """Architecture of a bare original checkpoint (no config.json) from its tensor names and shapes."""
    def need(key: str) -> Tensor:
        if key not in sd:
            raise ConfigError(f"{where}: cannot infer the architecture: tensor {key!r} is missing")
        return sd[key]

    tasks = [t for t, spec in TASKS.items() if f"decode_head.{spec.predictor}.weight" in sd]
    if len(tasks) != 1:
        names = ",".join(TASKS)
        raise ConfigError(f"{where}: cannot tell the task: expected one of decode_head.conv_{{{names}}}")
    task = tasks[0]
    proj = need("backbone.patch_embed.projection.weight")  # (D, 3, p, p)
    hidden, patch = proj.shape[0], proj.shape[-1]
    layers = 1 + max((int(m.group(1)) for k in sd if (m := re.match(r"backbone\.blocks\.(\d+)\.", k))), default=-1)
    if layers == 0:
        raise ConfigError(f"{where}: no transformer blocks (backbone.blocks.N.*) found")
    if "backbone.blocks.0.attn.q_norm.weight" in sd:
        head_dim = sd["backbone.blocks.0.attn.q_norm.weight"].shape[0]
    else:  # no QK-norm to read the head size from: fall back to the published backbones
        heads = {d: h for d, _, h in BACKBONES.values()}.get(hidden)
        if heads is None:
            raise ConfigError(f"{where}: cannot infer the number of attention heads; add a config.json")
        head_dim = hidden // heads
    kv = [need(f"backbone.blocks.{i}.attn.wk.weight").shape[0] // head_dim for i in range(layers)]
    b0 = "backbone.blocks.0."
    pixel_shuffle = "decode_head.input_conv.0.weight" in sd
    if pixel_shuffle:
        ups = [k for k in sd if re.match(r"decode_head\.upsample_blocks\.\d+\.0\.weight$", k)]
        up_w = [sd[f"decode_head.upsample_blocks.{i}.0.weight"] for i in range(len(ups))]
        up_out, up_k = [w.shape[0] // 4 for w in up_w], [w.shape[-1] for w in up_w]
    else:
        ups = sorted(int(m.group(1)) for k in sd if (m := re.match(r"decode_head\.deconv_layers\.(\d+)\.weight$", k)))
        up_w = [sd[f"decode_head.deconv_layers.{i}.weight"] for i in ups]
        up_out, up_k = [w.shape[1] for w in up_w], [w.shape[-1] for w in up_w]
    conv_idx = sorted(int(m.group(1)) for k in sd if (m := re.match(r"decode_head\.conv_layers\.(\d+)\.weight$", k)))
    conv_w = [sd[f"decode_head.conv_layers.{i}.weight"] for i in conv_idx]
    head = HeadConfig(up_out, up_k, [w.shape[0] for w in conv_w], [w.shape[-1] for w in conv_w], pixel_shuffle)
    scale_key = re.compile(r"decode_head\.scale_conv_layers\.(\d+)\.weight$")
    scale_idx = sorted(int(m.group(1)) for k in sd if (m := scale_key.match(k)))
    if scale_idx:
        scale_w = [sd[f"decode_head.scale_conv_layers.{i}.weight"] for i in scale_idx]
        head.scale_conv_out_channels = [w.shape[0] for w in scale_w]
        head.scale_conv_kernel_sizes = [w.shape[-1] for w in scale_w]
        l1, l3 = need("decode_head.scale_final_layer.1.weight"), need("decode_head.scale_final_layer.3.weight")
        head.scale_final_hidden_sizes = [l1.shape[0], l3.shape[0]]
        head.scale_final_input_size = l1.shape[1]
    try:
        return Sapiens2Config(
            task=task, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=hidden // head_dim,
            intermediate_size=need(b0 + "ffn.w12.weight").shape[0] // 2, num_key_value_heads_per_layer=kv,
            num_register_tokens=need("backbone.storage_tokens").shape[1], patch_size=patch, image_size=image_size,
            query_bias=b0 + "attn.wq.bias" in sd, key_bias=b0 + "attn.wk.bias" in sd,
            value_bias=b0 + "attn.wv.bias" in sd, proj_bias=b0 + "attn.proj.bias" in sd,
            mlp_bias=b0 + "ffn.w12.bias" in sd, use_qk_norm=b0 + "attn.q_norm.weight" in sd,
            num_labels=sd[f"decode_head.{TASKS[task].predictor}.weight"].shape[0], head=head,
        )
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
