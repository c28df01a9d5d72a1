"""The run configuration's motion-capture keys (a base of pipeline.cli.config.RunConfig: flags are made
from them like the others) and their checks."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.cli.options import option
from stages.errors import ConfigError

TRC_UP = ("y", "z")


@dataclass
class MocapFields:
    calibration: str | None = option(None, "the rig's calibration file (TOML: from `sapiens2-stream calibrate`, "
                                           "Pose2Sim or aniposelib); its camera names are the source names")
    triangulate: bool = option(False, "fuse the calibrated cameras into world skeletons: persons associated across "
                                      "views, every keypoint triangulated, published as world messages (needs "
                                      "--calibration and the pose task)")
    save_world: str | None = option(None, "write one JSON line per world step here (.jsonl; metres, world frame)")
    export_trc: str | None = option(None, "when the run ends, write the world skeletons as TRC (OpenSim, Pose2Sim) "
                                          "here: one file per person, {person} in the name or _P<id> added")
    rescale_calibration: bool = option(False, "with --triangulate: a camera calibrated at another size than its "
                                              "frames (a resize: the same aspect) has its calibration scaled to "
                                              "them; without it, such a camera is refused")
    trc_up: str = option("y", "the TRC's up axis: y (OpenSim; the world's Z-up axes become Y-up) or z (as "
                              "calibrated)", choices=list(TRC_UP))
    world_window_ms: float = option(20.0, "with --triangulate: a camera's frame joins a step when its clock is "
                                          "within this of the step's median (ms)")
    world_max_error_px: float = option(15.0, "with --triangulate: a view that reprojects farther than this "
                                             "(pixels) from the point of its views, or of the others alone, "
                                             "disagrees and is left out of the point")
    world_max_epipolar_px: float = option(25.0, "with --triangulate: two views' persons are one person only when "
                                                "their keypoints' mean epipolar distance is under this (pixels)")
    world_min_views: int = option(2, "with --triangulate: views a world point needs (2 or more)")
    world_min_angle_deg: float = option(15.0, "with --triangulate: two of a world point's views must see it from "
                                              "directions this far apart (degrees); cameras facing each other, "
                                              "or side by side far away, cannot place it along their rays")
    world_max_uncertainty_mm: float = option(15.0, "with --triangulate: a world point is placed only when the "
                                                   "detectors' noise (measured on each step) leaves it within "
                                                   "this error (RMS, mm) through its views' geometry: two views "
                                                   "close to one line, or far away, place it too loosely; 1e9: no "
                                                   "bound")
    world_smooth: bool = option(False, "with --triangulate: One-Euro smoothing of the world points per person "
                                       "(cutoff --smooth-min-cutoff)")
    world_smooth_beta: float = option(1.0, "One-Euro speed coefficient of the world points (Hz per m/s)")

    def validate_mocap(self, tasks: list[str]) -> None:
        """The motion-capture keys on their own and against the others; ConfigError names the key."""
        if self.triangulate:
            if not self.calibration:
                raise ConfigError("triangulate: needs --calibration FILE (the rig's cameras); make one with "
                                  "`sapiens2-stream calibrate`")
            if "pose" not in tasks:
                raise ConfigError("triangulate: needs the pose task (the 2D keypoints it triangulates); add pose "
                                  "to tasks")
        for key in ("save_world", "export_trc"):
            if getattr(self, key) and not self.triangulate:
                raise ConfigError(f"{key}: world skeletons come only with --triangulate (and --calibration)")
        if self.export_trc and not self.export_trc.lower().endswith(".trc"):
            raise ConfigError(f"export_trc: {self.export_trc!r} must end in .trc")
        for key in ("world_window_ms", "world_max_error_px", "world_max_epipolar_px", "world_max_uncertainty_mm"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"{key}: must be positive, got {getattr(self, key)}")
        if self.world_min_views < 2:
            raise ConfigError(f"world_min_views: must be at least 2 (one view has no depth), got "
                              f"{self.world_min_views}")
        if not 0 <= self.world_min_angle_deg < 90:
            raise ConfigError(f"world_min_angle_deg: must be within 0 and 90, got {self.world_min_angle_deg}")
        if self.world_smooth_beta < 0:
            raise ConfigError(f"world_smooth_beta: must be at least 0, got {self.world_smooth_beta}")
