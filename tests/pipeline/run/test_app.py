"""Run assembly from the config: annotation layers follow the tasks and the style options."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from pipeline.cli.config import ConfigError, load_config
from pipeline.cli.preflight import matte_background
from pipeline.run.app import _annotation_layers
from stages.annotate import MatteAnnotator, SkeletonAnnotator


def test_layers_follow_tasks_and_style() -> None:
    cfg = load_config(None, {"tasks": ["pose", "matting"], "matte_mode": "replace", "matte_background": "255,0,0",
                             "kpt_threshold": 0.6})
    layers = _annotation_layers(cfg)
    matte = next(a for a in layers if isinstance(a, MatteAnnotator))
    assert matte.mode == "replace" and tuple(matte.background) == (255, 0, 0)
    assert next(a for a in layers if isinstance(a, SkeletonAnnotator)).threshold == 0.6
    assert "seg" not in layers  # seg does not run, so its layer is left out
    assert "boxes" in layers and "hud" in layers


def test_matte_background_image_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "bg.png"
    cv2.imwrite(str(path), np.full((4, 6, 3), (10, 20, 30), np.uint8))  # BGR on disk
    image = matte_background(str(path))
    assert image.shape == (4, 6, 3) and tuple(image[0, 0]) == (30, 20, 10)  # RGB in memory
    with pytest.raises(ConfigError, match="matte_background"):
        matte_background(str(tmp_path / "missing.png"))
    with pytest.raises(ConfigError, match="0..255"):
        matte_background("300,0,0")


def test_a_dense_input_the_pointmap_cannot_take_is_said_once() -> None:
    """The pointmap model's scale branch fixes its input size: a --dense-input for it is named as not
    applying (it was ignored without a word), and the size the model needs is used."""
    from types import SimpleNamespace

    from pipeline.cli.config import RunConfig
    from pipeline.run.build import _input_size

    model = SimpleNamespace(random_weights=False, cfg=SimpleNamespace(image_size=[128, 96],
                                                                      head=SimpleNamespace(has_scale=True)))
    notes: list[str] = []
    assert _input_size("pointmap", RunConfig(dense_input=[256, 192]), model, notes) == (128, 96)
    assert notes == ["pointmap: --dense-input 256x192 does not apply: its scale branch fixes the input at 128x96"]
    notes.clear()
    assert _input_size("seg", RunConfig(dense_input=[256, 192]), model, notes) == (256, 192) and notes == []
