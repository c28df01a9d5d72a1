"""Loading Sapiens2 checkpoints: local folders, bare original files, hub ids. Never unpickles.

``load_model(source)`` accepts
- a folder as transformers' ``save_pretrained`` writes it (``config.json`` + ``model.safetensors`` or a
  sharded ``model.safetensors.index.json``), in the published (original) key names;
- a bare ``.safetensors`` file (Meta's original release) whose architecture is inferred from its
  tensors; files in transformers' in-memory layout (``model.embeddings...``) are accepted too;
- a hub id such as ``facebook/sapiens2-pose-0.4b``, resolved through huggingface_hub's cache.
The model is built on the meta device, loaded with ``assign=True`` (no second copy), cast once,
and put in eval mode. Every problem raises :class:`CheckpointError` with one actionable line.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor

from ..device import resolve_device
from ..tasks import TASKS
from .checkpoint_source import is_hub_id
from .config import ConfigError, Sapiens2Config
from .configjson import config_from_json, infer_config
from .model import Sapiens2
from .remap import (
    detect_layout,
    fuse_qkv,
    normalise_original,
    reference_to_original,
    split_qkv,
)

log = logging.getLogger(__name__)
RANDOM_INIT_KEY = "sapiens2_stream"  # safetensors metadata written by make-tiny


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be found, read or matched to the model."""


def cache_root() -> Path:
    """This tool's cache folder: ``$SAPIENS2_STREAM_CACHE``, else ``~/.cache/sapiens2-stream`` (tiny
    checkpoints, compiled kernels)."""
    return Path(os.environ.get("SAPIENS2_STREAM_CACHE", Path.home() / ".cache" / "sapiens2-stream"))


def default_dtype(device: torch.device) -> torch.dtype:
    """bfloat16 on CUDA (Sapiens2 was trained in bf16), float32 elsewhere."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def parse_dtype(name: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if name is None or name == "auto":
        return default_dtype(device)
    if isinstance(name, torch.dtype):
        return name
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}
    if name not in table:
        raise ValueError(f"unknown dtype {name!r}; use float32, bfloat16 or float16")
    return table[name]


def read_safetensors(path: Path) -> tuple[dict[str, Tensor], dict[str, str]]:
    """All tensors of one safetensors file (CPU) and its metadata; clear errors for bad files."""
    if path.suffix in (".pt", ".pth", ".bin", ".ckpt"):
        raise CheckpointError(f"{path}: pickle-based checkpoints are not loaded (unsafe); convert it to .safetensors")
    try:
        tensors: dict[str, Tensor] = {}
        with safe_open(str(path), framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
            for key in f.keys():
                tensors[key] = f.get_tensor(key)
        return tensors, metadata
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found") from None
    except Exception as exc:  # safetensors raises its own error types for bad headers and short files
        raise CheckpointError(
            f"{path}: not a readable safetensors file ({exc}); it may be truncated or corrupt, download it again"
        ) from None


def _read_folder(folder: Path) -> tuple[dict[str, Tensor], dict[str, str]]:
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.exists():
        return read_safetensors(single)
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index}: invalid shard index ({exc})") from None
        tensors, metadata = {}, {}
        for shard in sorted(set(weight_map.values())):
            part, meta = read_safetensors(folder / shard)
            tensors.update(part)
            metadata.update(meta)
        missing = sorted(set(weight_map) - set(tensors))
        if missing:
            raise CheckpointError(f"{index}: shards lack {len(missing)} listed tensors, e.g. {missing[:3]}")
        return tensors, metadata
    raise CheckpointError(f"{folder}: no model.safetensors or model.safetensors.index.json in this folder")


def resolve_hub(repo_id: str) -> Path:
    """Local snapshot folder of a hub repo; offline and not cached -> one clear error."""
    from huggingface_hub import constants

    offline_error = CheckpointError(
        f"{repo_id}: weights are not in the Hugging Face cache and the hub cannot be reached (offline); run "
        f"`hf download {repo_id}` where there is network, or pass a local checkpoint folder")
    # Offline with no folder of the repo in the cache: said at once, without importing the download
    # machinery (half a second of every offline start that falls back to random weights).
    cached = Path(constants.HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}"
    if constants.HF_HUB_OFFLINE and not cached.is_dir():
        raise offline_error
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:  # huggingface_hub honours HF_HUB_OFFLINE itself: offline, only the cache is looked at
        return Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors"]))
    except LocalEntryNotFoundError:
        raise offline_error from None
    except Exception as exc:  # network, auth and repo errors all end the same way for the user
        reason = f"{type(exc).__name__}: {exc}"
        raise CheckpointError(f"{repo_id}: could not fetch from the Hugging Face hub ({reason})") from None


def locate(source: str | os.PathLike) -> Path:
    """The local folder or file of a source: a hub id is resolved through the cache (downloaded
    when online); a missing local path raises CheckpointError. Loads nothing."""
    path = resolve_hub(str(source)) if is_hub_id(source) else Path(source)
    if not path.exists():
        raise CheckpointError(f"{source}: no such checkpoint file, folder or hub id")
    return path


def load_state(source: str | os.PathLike, image_size: tuple[int, int] | None = None
               ) -> tuple[Sapiens2Config, dict[str, Tensor], dict[str, str], str]:
    """(config, state dict in original names, safetensors metadata, description) for a source."""
    path = locate(source)
    if path.is_dir():
        config_path = path / "config.json"
        if not config_path.exists():
            raise CheckpointError(
                f"{path}: no config.json; pass the .safetensors file itself to infer the architecture"
            )
        try:
            cfg = config_from_json(json.loads(config_path.read_text()), str(config_path))
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{config_path}: not valid JSON ({exc})") from None
        except ConfigError as exc:
            raise CheckpointError(str(exc)) from None
        sd, meta = _read_folder(path)
        if detect_layout(list(sd)) == "reference":
            sd = reference_to_original(sd, cfg.task)
        return cfg, sd, meta, str(path)
    sd, meta = read_safetensors(path)
    if detect_layout(list(sd)) == "reference":
        task = _reference_task(sd, path)
        sd = reference_to_original(sd, task)
    try:
        cfg = infer_config(sd, str(path), image_size or (1024, 768))
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from None
    return cfg, sd, meta, str(path)


def _reference_task(sd: dict[str, Tensor], path: Path) -> str:
    """Task of a bare in-memory-layout file: from the predictor's output channels and head kind."""
    scale = any(k.startswith("scale_head.") for k in sd)
    out = sd.get("decode_head.predictor.weight")
    if out is None:
        raise CheckpointError(f"{path}: no decode_head.predictor; cannot tell the task")
    by_labels = {}  # the first task of the registry with this many channels (and a scale head or not)
    for spec in reversed(TASKS.values()):
        if spec.scale_head == scale:
            by_labels[spec.num_labels] = spec.name
    if out.shape[0] not in by_labels:
        raise CheckpointError(f"{path}: cannot tell the task of a {out.shape[0]}-channel head; add a config.json")
    return by_labels[out.shape[0]]


def check_state(model_sd: dict[str, Tensor], sd: dict[str, Tensor], where: str) -> None:
    """Strict match: every missing/unexpected key and shape mismatch named in one error."""
    missing = sorted(set(model_sd) - set(sd))
    unexpected = sorted(set(sd) - set(model_sd))
    shapes = [f"{k} {tuple(sd[k].shape)} vs model {tuple(v.shape)}"
              for k, v in model_sd.items() if k in sd and sd[k].shape != v.shape]
    problems = []
    if missing:
        problems.append(f"missing {len(missing)}: {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}")
    if unexpected:
        more = " ..." if len(unexpected) > 8 else ""
        problems.append(f"unexpected {len(unexpected)}: {', '.join(unexpected[:8])}{more}")
    if shapes:
        problems.append(f"shape mismatch {len(shapes)}: {'; '.join(shapes[:6])}")
    if problems:
        raise CheckpointError(f"{where}: checkpoint does not match the architecture: {' | '.join(problems)}")


def load_model(
    source: str | os.PathLike,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    image_size: tuple[int, int] | None = None,
) -> Sapiens2:
    """Load a Sapiens2 task model (see module docstring for sources). Returns it in eval mode.

    dtype: float32 | bfloat16 | float16 (default: bfloat16 on CUDA, float32 on CPU). float16 keeps
    the residual stream and norms in float32.
    """
    device = resolve_device(device)
    dtype = parse_dtype(dtype, device)
    cfg, sd, meta, where = load_state(source, image_size)
    sd = normalise_original(sd, cfg)
    with torch.device("meta"):
        model = Sapiens2(cfg)
    # Checked in the published layout (q/k/v apart) so that errors name the tensors as the file has them.
    check_state(split_qkv(model.state_dict(), cfg), sd, where)
    model.load_state_dict(fuse_qkv(sd, cfg), strict=True, assign=True)
    model.set_precision(dtype)  # cast on the host, then one transfer
    model.to(device=device)
    model.eval().requires_grad_(False)
    model.source = where
    model.random_weights = meta.get(RANDOM_INIT_KEY) == "random-init"
    log.info("loaded %s %s from %s (%s, %s%s)", cfg.task, _size_name(cfg), where, device, dtype,
             ", RANDOM WEIGHTS" if model.random_weights else "")
    return model


def _size_name(cfg: Sapiens2Config) -> str:
    return f"D={cfg.hidden_size} L={cfg.num_hidden_layers} H={cfg.num_attention_heads}"
