"""Helpers for parity tests: build reference (transformers) models with random weights."""

from __future__ import annotations

import torch
import transformers
from transformers import Sapiens2Config as RefConfig

REF_CLASS = {
    "pose": "Sapiens2ForPoseEstimation",
    "seg": "Sapiens2ForSemanticSegmentation",
    "matting": "Sapiens2ForImageMatting",
    "normal": "Sapiens2ForNormalEstimation",
    "pointmap": "Sapiens2ForPointmapEstimation",
}
NUM_LABELS = {"pose": 308, "seg": 29, "matting": 4, "normal": 3, "pointmap": 3}


def head_config(task: str, kernel: int = 3) -> dict:
    if task == "pose":
        return dict(upsample_out_channels=[16, 16], conv_out_channels=[8, 8])
    if task == "seg":
        return dict(upsample_out_channels=[16, 16, 8, 8], conv_out_channels=[8])
    cfg = dict(upsample_out_channels=[16, 8, 8, 8], conv_out_channels=[8, 8], use_pixel_shuffle=True,
               upsample_kernel_size=kernel, conv_kernel_size=kernel)
    if task == "pointmap":
        cfg.update(scale_conv_out_channels=[8, 8], scale_conv_kernel_size=3, scale_final_hidden_sizes=[16, 8])
    return cfg


def reference_model(task: str, seed: int = 0, **arch) -> torch.nn.Module:
    """A random-init transformers Sapiens2 model for task; arch overrides the small default."""
    kwargs = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_attention_heads=2, num_first_full_attention_layers=1,
                  num_last_full_attention_layers=1, image_size=[128, 96], num_register_tokens=2,
                  num_labels=NUM_LABELS[task], head_config=head_config(task))
    kwargs.update(arch)
    torch.manual_seed(seed)
    model = getattr(transformers, REF_CLASS[task])(RefConfig(**kwargs)).eval()
    with torch.no_grad():  # non-trivial norm/scale weights so a mismatch in them would show
        for name, p in model.named_parameters():
            if name.endswith(("norm1.weight", "norm2.weight", "norm.weight", "q_norm.weight", "k_norm.weight",
                              "lambda1")):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    return model
