"""What triangulation takes and gives (stages.mocap.triangulate): its settings (``Triangulation``,
checked when made) and its points (``Points3D``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Triangulation:
    """min_score: a view's keypoint counts from this score; max_error_px: a view over this
    reprojection error does not agree; min_views: views a valid point needs (2 or more);
    min_angle_deg: the widest angle between two of a valid point's views (and of a pair that
    proposes a point); suspect_share: the share of a person's points on which the others may
    outvote a view before it is suspect for that person; max_uncertainty_mm: the largest error (RMS,
    mm) that the step's pixel noise leaves a valid point with, through the geometry of its views."""

    min_score: float = 0.3
    max_error_px: float = 15.0
    min_views: int = 2
    min_angle_deg: float = 15.0
    suspect_share: float = 0.02
    max_uncertainty_mm: float = 15.0

    def __post_init__(self) -> None:
        if self.min_views < 2:
            raise ValueError(f"min_views must be at least 2 (one view has no depth), got {self.min_views}")
        if not self.max_error_px > 0:
            raise ValueError(f"max_error_px must be positive, got {self.max_error_px}")
        if not 0 <= self.min_angle_deg < 90:
            raise ValueError(f"min_angle_deg must be within 0 and 90, got {self.min_angle_deg}")
        if not 0 <= self.suspect_share <= 1:
            raise ValueError(f"suspect_share must be within 0 and 1, got {self.suspect_share}")
        if not self.max_uncertainty_mm > 0:
            raise ValueError(f"max_uncertainty_mm must be positive (inf: no bound), got {self.max_uncertainty_mm}")


@dataclass
class Points3D:
    """xyz (P, K, 3) float32 metres, zeros where not valid; valid (P, K) bool; error (P, K) float32 RMS
    reprojection error in pixels over the views used; views (P, K) uint8 views used; used (P, C, K)
    bool: which views each point was solved from."""

    xyz: np.ndarray
    valid: np.ndarray
    error: np.ndarray
    views: np.ndarray
    used: np.ndarray


__all__ = ["Points3D", "Triangulation"]
