"""Small random-init checkpoints in the published layout, for tests and offline runs.

They are written exactly as a real checkpoint folder (``config.json`` + ``model.safetensors`` with the
original key names) and load through the same code as real weights. The safetensors metadata
marks them ``random-init`` so every output made with them can be labelled as meaningless.
"""

from __future__ import annotations

import json
import math
import stat
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import Tensor, nn

from ..tasks import get_task
from .config import Sapiens2Config, default_head
from .configjson import config_to_json
from .model import Attention, LayerScale, RMSNorm, Sapiens2
from .remap import ours_to_original
from .weights import RANDOM_INIT_KEY


def tiny_config(task: str, hidden: int = 64, layers: int = 4, heads: int = 4, registers: int = 2,
                image_size: tuple[int, int] = (256, 192)) -> Sapiens2Config:
    """A few-MB architecture of the same shape family as the published ones (GQA in the middle)."""
    kv = [heads if (i == 0 or i == layers - 1) else heads // 2 for i in range(layers)]
    head = default_head(task, hidden, (32, 32, 16, 16)[:len(get_task(task).upsample)])
    return Sapiens2Config(task=task, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                          intermediate_size=2 * hidden, num_key_value_heads_per_layer=kv,
                          num_register_tokens=registers, image_size=image_size,
                          num_labels=get_task(task).num_labels, head=head)


@torch.no_grad()
def random_init(model: Sapiens2, seed: int = 0, generator: torch.Generator | None = None) -> Sapiens2:
    """Deterministic random weights with activations of a sensible scale (unit norms, small gammas).

    ``generator`` (else a CPU one seeded with ``seed``) may live on the model's device: a GPU
    initialises a 0.4B model in well under a second. The fused q/k/v projection is drawn part by
    part, as the published wq, wk and wv (a part without a bias in the config keeps a zero one).
    """
    gen = generator if generator is not None else torch.Generator().manual_seed(seed)

    def linear(weight: Tensor, bias: Tensor | None, fan_in: int) -> None:
        weight.normal_(0.0, 1.0 / math.sqrt(fan_in), generator=gen)
        if bias is not None:
            bias.normal_(0.0, 0.02, generator=gen)

    drawn: set[int] = set()  # the fused projections, drawn with their attention (modules() yields it first)
    for module in model.modules():
        if id(module) in drawn:
            continue
        if isinstance(module, RMSNorm):
            module.weight.fill_(1.0)
        elif isinstance(module, LayerScale):
            module.weight.fill_(0.1)
        elif isinstance(module, Attention):
            qkv, fan_in = module.wqkv, module.wqkv.weight.shape[1]
            drawn.add(id(qkv))
            if qkv.bias is not None:
                qkv.bias.zero_()
            biases = qkv.bias.split(module.qkv_sizes) if qkv.bias is not None else (None,) * 3
            for weight, bias, has in zip(qkv.weight.split(module.qkv_sizes), biases, module.qkv_bias):
                linear(weight, bias if has else None, fan_in)
        elif isinstance(module, nn.Linear | nn.Conv2d | nn.ConvTranspose2d):
            fan_in = module.weight[0].numel() if not isinstance(module, nn.ConvTranspose2d) else module.weight.shape[0]
            linear(module.weight, module.bias, fan_in)
    bb = model.backbone
    bb.cls_token.normal_(0.0, 0.02, generator=gen)
    bb.storage_tokens.normal_(0.0, 0.02, generator=gen)
    return model


def write_checkpoint(model: Sapiens2, folder: str | Path, flip_pairs: list[list[int]] | None = None,
                     random_weights: bool = True) -> Path:
    """Write ``config.json`` + ``model.safetensors`` in the published layout."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().float().contiguous() for k, v in ours_to_original(model.state_dict(), model.cfg).items()}
    metadata = {"format": "pt"}
    if random_weights:
        metadata[RANDOM_INIT_KEY] = "random-init"
    save_file(sd, str(folder / "model.safetensors"), metadata=metadata)
    config = folder / "config.json"
    config.write_text(json.dumps(config_to_json(model.cfg, flip_pairs), indent=2))
    # safetensors creates its file 0600; give it the mode any new file gets here (the umask's), as config.json has
    (folder / "model.safetensors").chmod(stat.S_IMODE(config.stat().st_mode))
    return folder


def make_tiny(folder: str | Path, task: str, seed: int = 0, **arch: int) -> Path:
    """Create a tiny random-init checkpoint for ``task`` in ``folder``; returns the folder."""
    from ..metadata import load_metadata

    cfg = tiny_config(task, **arch)
    model = random_init(Sapiens2(cfg), seed)
    meta = load_metadata()  # the flip pairs of the metadata's keypoints: for a person task that predicts them
    flip = meta.flip_pairs.tolist() if get_task(task).per_person and cfg.num_labels == meta.num_keypoints else None
    return write_checkpoint(model, folder, flip)


__all__ = ["make_tiny", "random_init", "tiny_config", "write_checkpoint"]
