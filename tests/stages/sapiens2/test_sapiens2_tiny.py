"""make-tiny writes the real published layout: transformers' Sapiens2* classes load it with no
missing/unexpected/mismatched keys and compute what our model computes."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from safetensors import safe_open

from stages.sapiens2 import load_model
from stages.sapiens2.tiny import make_tiny
from stages.tasks import TASKS
from tests.refutil import REF_CLASS

SIZE = (128, 96)


def _ref_output(task, out):
    if task == "matting":
        return torch.cat([out.foregrounds, out.alphas], 1)
    return getattr(out, {"pose": "heatmaps", "seg": "logits", "normal": "normals", "pointmap": "pointmaps"}[task])


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    return {task: make_tiny(tmp_path_factory.mktemp(f"tiny_{task}"), task, image_size=SIZE) for task in TASKS}


def _keys(folder) -> set[str]:
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        return set(f.keys())


@pytest.mark.parametrize("task", TASKS)
def test_make_tiny_writes_a_loadable_folder(tiny_dirs, task):
    folder = tiny_dirs[task]
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == [REF_CLASS[task]] and cfg["model_type"] == "sapiens2"
    model = load_model(folder, device="cpu")
    assert model.random_weights is True
    assert model.cfg.task == task and tuple(model.cfg.image_size) == SIZE
    assert model.dtype == torch.float32 and not model.training


@pytest.mark.parametrize("task", TASKS)
def test_transformers_loads_tiny_without_key_problems_and_agrees(tiny_dirs, task):
    folder = tiny_dirs[task]
    ref, info = getattr(transformers, REF_CLASS[task]).from_pretrained(folder, output_loading_info=True)
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        assert not list(info.get(kind, [])), f"{task}: {kind} {info[kind]}"
    assert not list(info.get("error_msgs", []))
    ref.eval()
    ours = load_model(folder, device="cpu", dtype="float32")
    x = torch.randn(2, 3, *SIZE, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = ref(x)
        got, scale = ours(x)
    expected = _ref_output(task, out)
    assert got.shape == expected.shape
    assert (got - expected).abs().max() <= 1e-4 * expected.abs().max(), task
    if task == "pointmap":
        assert (scale - out.scales).abs().max() <= 1e-4 * out.scales.abs().max()


@pytest.mark.parametrize("task", TASKS)
def test_tiny_keys_use_original_names(tiny_dirs, task):
    keys = _keys(tiny_dirs[task])
    for key in ("backbone.blocks.0.attn.wq.weight", "backbone.blocks.0.attn.wk.weight",
                "backbone.blocks.0.attn.wv.weight", "backbone.blocks.0.attn.gamma.weight",
                "backbone.blocks.0.ffn.w12.weight", "backbone.blocks.0.ffn.w3.weight",
                "backbone.storage_tokens", "backbone.cls_token", "backbone.patch_embed.projection.weight",
                "backbone.ln1.weight", f"decode_head.conv_{task}.weight"):
        assert key in keys, f"{task}: {key} not written"
    if task in ("pose", "seg"):
        assert "decode_head.deconv_layers.0.weight" in keys
    else:
        assert "decode_head.input_conv.0.weight" in keys
        assert "decode_head.upsample_blocks.0.0.weight" in keys
    if task == "pointmap":
        assert "decode_head.scale_conv_layers.0.weight" in keys
        assert "decode_head.scale_final_layer.1.weight" in keys
    # none of our internal or transformers' in-memory names leak into the file
    assert not any(".wqkv." in k or "decode_head.predictor." in k or k.startswith("model.") for k in keys)
