"""A run's motion capture from its config: the checks before anything loads (the rig file against
the sources' names, then against their frame sizes once they open) and the world step."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from pathlib import Path

from stages.errors import ConfigError
from stages.mocap.associate import Association
from stages.mocap.camera import Rig, same_aspect
from stages.mocap.fuse import Fusion, WorldFuser
from stages.mocap.points import Triangulation

from .options import MocapFields
from .world import WorldStep

log = logging.getLogger(__name__)


def rig_for_frames(rig: Rig, sizes: Mapping[str, tuple[int, int]], rescale: bool, frames: str,
                   calibration: str | Path) -> Rig:
    """The rig for frames of ``sizes`` (camera -> (width, height); cameras without one are kept): a
    camera calibrated at another size is refused (ConfigError, one line naming the camera and both
    sizes), or with ``rescale`` scaled to a same-aspect size (``Camera.rescaled``; another aspect is
    always refused). ``frames`` says whose frames they are (e.g. "its frames")."""
    cameras = dict(rig.cameras)
    for name, size in sizes.items():
        camera = cameras.get(name)
        if camera is None or tuple(size) == camera.size:
            continue
        (w0, h0), (w1, h1) = camera.size, size
        if not same_aspect(camera.size, size):
            raise ConfigError(f"{calibration}: camera {name!r} was calibrated at {w0}x{h0} but {frames} are {w1}x{h1}, "
                              f"another aspect (a crop or another sensor mode) that no scaling fixes; calibrate "
                              f"it at {w1}x{h1}")
        if not rescale:
            raise ConfigError(f"{calibration}: camera {name!r} was calibrated at {w0}x{h0} but {frames} are {w1}x{h1}; "
                              f"calibrate it at {w1}x{h1}, or, if they are its {w0}x{h0} view resized, pass "
                              f"--rescale-calibration to scale the calibration to {w1}x{h1}")
        cameras[name] = camera.rescaled(size)
        log.info("%s: camera %s calibrated at %dx%d, scaled to the %dx%d of %s", calibration, name, w0, h0, w1, h1,
                 frames)
    return dataclasses.replace(rig, cameras=cameras)


def fusion_of(cfg: MocapFields, kpt_threshold: float, smooth_min_cutoff: float) -> Fusion:
    """The fusion settings of a run."""
    return Fusion(window_s=cfg.world_window_ms / 1000.0,
                  association=Association(kpt_threshold, cfg.world_max_epipolar_px),
                  triangulation=Triangulation(kpt_threshold, cfg.world_max_error_px, cfg.world_min_views,
                                              cfg.world_min_angle_deg,
                                              max_uncertainty_mm=cfg.world_max_uncertainty_mm),
                  smooth=(smooth_min_cutoff, cfg.world_smooth_beta) if cfg.world_smooth else None)


def world_setup(cfg, rig: Rig | None, sources: list) -> WorldStep | None:
    """The world step of a run (None without --triangulate), the rig fitted to the frame sizes of the
    opened ``sources`` (``rig_for_frames``). Its outputs are sinks (``pipeline.sinks.build``)."""
    if rig is None:
        return None
    sizes = {s.info.source_id: (s.info.width, s.info.height) for s in sources}
    rig = rig_for_frames(rig, sizes, cfg.rescale_calibration, "its frames", cfg.calibration)
    return WorldStep(WorldFuser(rig, fusion_of(cfg, cfg.kpt_threshold, cfg.smooth_min_cutoff)))
