"""The detectors' pixel noise as one step's triangulated points show it (``noise_of``): what a
view's error is held against, and what a point's expected 3D error is made of
(stages.mocap.triangulate)."""

from __future__ import annotations

import numpy as np

# The median of the chi-squared distribution of d degrees of freedom, d = 1, 3, 5, ... (2 per view less 3)
_CHI2_MEDIAN = np.array([0.0, 0.454936, 0.0, 2.365974, 0.0, 4.351460, 0.0, 6.345811, 0.0, 8.342833, 0.0, 10.340998,
                         0.0, 12.339756, 0.0, 14.338860])


def noise_of(squares: np.ndarray, used: np.ndarray, max_error_px: float) -> float:
    """The detectors' pixel noise (per coordinate) as a step's points show it: the median, over the
    points whose views are all within ``max_error_px``, of their squared errors' sum over the
    median of the chi-squared distribution of its degrees of freedom (two per view, less three):
    each such ratio has the noise's variance as its median, whatever the points' views. The points
    of three or more views, else of two (a rig of two cameras); squared errors and used (C, N).
    ``max_error_px`` / 10 when no point has two such views; at least 0.1 px."""
    count = used.sum(axis=0)
    squares = np.where(used, squares, 0.0)  # (C, N)
    within = squares.max(axis=0) <= max_error_px ** 2
    clean = within & (count >= 3)
    if not clean.any():
        clean = within & (count == 2)
        if not clean.any():
            return max_error_px / 10
    freedom = 2 * count[clean] - 3
    if freedom.max() < len(_CHI2_MEDIAN):
        median = _CHI2_MEDIAN[freedom]
    else:  # Wilson and Hilferty's approximation beyond the table
        median = np.where(freedom < len(_CHI2_MEDIAN), _CHI2_MEDIAN[np.minimum(freedom, len(_CHI2_MEDIAN) - 1)],
                          freedom * (1 - 2 / (9 * freedom)) ** 3)
    return max(float(np.sqrt(_median(squares.sum(axis=0)[clean] / median))), 0.1)


def _median(values: np.ndarray) -> float:
    """np.median of a 1-D array by partition (np.median's checks cost more than the partition)."""
    half = len(values) // 2
    if len(values) % 2:
        return float(np.partition(values, half)[half])
    low, high = np.partition(values, (half - 1, half))[half - 1:half + 1]
    return float((low + high) / 2)


__all__ = ["noise_of"]
