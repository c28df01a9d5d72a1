"""Which persons seen by the cameras of one step are the same person: association across views.

For two cameras a and b, the cost of pairing person i of a with person j of b is the mean
symmetric epipolar distance, in pixels, of their keypoints that both views see with a good score
(a point of a lies on its epipolar line in b when they are the same point; the distance is
measured in normalised coordinates and scaled by each camera's focal length). Fewer than
``min_common`` such keypoints: no pairing.

Cameras are taken in order; each keeps a set of groups (world persons being formed). A camera's
persons are assigned to the groups so far with ``scipy.optimize.linear_sum_assignment`` on the
mean cost to the group's members; a pairing over ``max_epipolar_px`` is refused and that person
starts a group of its own. A group with members in two or more cameras is a world person; a
group of one is a person seen by one camera only, reported as such and never triangulated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from .camera import Camera

_REFUSED = 1e9


@dataclass(frozen=True)
class Association:
    """min_score: keypoints counted; max_epipolar_px: the largest mean distance of a pairing;
    min_common: keypoints two views must share to be compared."""

    min_score: float = 0.3
    max_epipolar_px: float = 25.0
    min_common: int = 8


@dataclass(frozen=True)
class View:
    """One camera's persons in a step. normalised (N, K, 2) undistorted coordinates; scores (N, K)."""

    camera: Camera
    normalised: np.ndarray
    scores: np.ndarray


def essential(a: Camera, b: Camera) -> np.ndarray:
    """The essential matrix E with x_b^T E x_a = 0 for normalised coordinates of one world point."""
    rotation = b.rotation @ a.rotation.T
    t = b.tvec - rotation @ a.tvec
    tx = np.array([[0, -t[2], t[1]], [t[2], 0, -t[0]], [-t[1], t[0], 0]])
    return tx @ rotation


def pair_costs(a: View, b: View, spec: Association) -> np.ndarray:
    """(Na, Nb) mean symmetric epipolar distance in pixels; _REFUSED where too few keypoints are shared."""
    na, nb = len(a.scores), len(b.scores)
    if na == 0 or nb == 0:
        return np.zeros((na, nb))
    e = essential(a.camera, b.camera)
    xa = np.concatenate([a.normalised, np.ones((*a.normalised.shape[:2], 1))], axis=-1)  # (Na, K, 3)
    xb = np.concatenate([b.normalised, np.ones((*b.normalised.shape[:2], 1))], axis=-1)  # (Nb, K, 3)
    lines_b = xa @ e.T  # (Na, K, 3): epipolar lines in b of a's points
    lines_a = xb @ e  # (Nb, K, 3): epipolar lines in a of b's points
    algebraic = np.einsum("ikc,jkc->ijk", lines_b, xb)  # (Na, Nb, K): x_b^T E x_a
    norm_b = np.hypot(lines_b[..., 0], lines_b[..., 1])[:, None, :]  # (Na, 1, K)
    norm_a = np.hypot(lines_a[..., 0], lines_a[..., 1])[None, :, :]  # (1, Nb, K)
    fa = float(np.mean(np.diag(a.camera.matrix)[:2]))
    fb = float(np.mean(np.diag(b.camera.matrix)[:2]))
    with np.errstate(divide="ignore", invalid="ignore"):
        distance = 0.5 * np.abs(algebraic) * (fb / norm_b + fa / norm_a)  # (Na, Nb, K) pixels
    both = (a.scores[:, None, :] >= spec.min_score) & (b.scores[None, :, :] >= spec.min_score) & \
        np.isfinite(distance)
    count = both.sum(axis=-1)
    mean = np.where(both, distance, 0.0).sum(axis=-1) / np.maximum(count, 1)
    return np.where(count >= spec.min_common, mean, _REFUSED)


def associate(views: Sequence[View], spec: Association = Association()) -> list[dict[int, int]]:
    """Group the persons of the views: a list of groups, each {view index: person index}, in the
    order they were formed (groups of one camera included: the caller reports them as single-view)."""
    groups: list[dict[int, int]] = []
    costs: dict[tuple[int, int], np.ndarray] = {}
    for v, view in enumerate(views):
        n = len(view.scores)
        if n == 0:
            continue
        if groups:
            for u in {u for g in groups for u in g}:
                costs[u, v] = pair_costs(views[u], view, spec)
            table = np.full((len(groups), n), _REFUSED)
            for g, group in enumerate(groups):
                rows = np.array([costs[u, v][i] for u, i in group.items()])  # (members, n)
                known = rows < _REFUSED  # a member too little seen to compare does not veto the others
                mean = np.where(known, rows, 0.0).sum(axis=0) / np.maximum(known.sum(axis=0), 1)
                table[g] = np.where(known.any(axis=0), mean, _REFUSED)
            rows, cols = linear_sum_assignment(table)
            taken = set()
            for g, j in zip(rows, cols):
                if table[g, j] <= spec.max_epipolar_px:
                    groups[g][v] = int(j)
                    taken.add(int(j))
            groups.extend({v: j} for j in range(n) if j not in taken)
        else:
            groups.extend({v: j} for j in range(n))
    return groups
