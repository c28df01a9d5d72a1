"""Which persons seen by the cameras of one step are the same person: association across views.

For two cameras a and b, the cost of pairing person i of a with person j of b is the mean
symmetric epipolar distance, in pixels, of their keypoints that both views see with a good score
(70 keypoints spread over the body: ``compared_keypoints``; a point of a lies on its epipolar line
in b when they are the same point; the distance is measured in normalised coordinates and scaled
by each camera's focal length). Fewer than
``min_common`` such keypoints: no pairing.

Cameras are taken in order; each keeps a set of groups (world persons being formed). A camera's
persons are assigned to the groups so far with ``scipy.optimize.linear_sum_assignment`` on the
mean cost to the group's members; a pairing over ``max_epipolar_px`` is refused and that person
starts a group of its own. A group with members in two or more cameras is a world person; a
group of one is a person seen by one camera only, reported as such and never triangulated.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from stages.metadata import load_metadata

from .camera import Camera

_REFUSED = 1e9


@functools.lru_cache(maxsize=4)
def compared_keypoints(num_keypoints: int) -> np.ndarray:
    """The keypoints two views are compared on: Sapiens2's body (wrists included), feet and extra
    points, every 4th hand point and every 8th face point, 70 of 308. Matching persons needs points
    spread over the body, not the face's density, and its cost grows with the points. Another
    keypoint count: all of them."""
    meta = load_metadata()
    if num_keypoints != meta.num_keypoints:
        picked = np.arange(num_keypoints)
    else:
        g = meta.groups
        picked = np.unique(np.concatenate([g["body"], g["foot"], g["extra"], g["left_hand"][::4],
                                           g["right_hand"][::4], g["face"][::8]]))
    picked.flags.writeable = False  # one array for every caller (cached)
    return picked


def assign(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The least-cost assignment of rows to columns (scipy's ``linear_sum_assignment``). scipy is
    imported on a rig's first step, not by every run that imports the pipeline (0.45 s of CPU)."""
    from scipy.optimize import linear_sum_assignment

    return linear_sum_assignment(cost)


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


@functools.lru_cache(maxsize=64)
def _pair_geometry(cameras: tuple[Camera, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The pairs u < v of a step's cameras (Q,) each, their essential matrices (Q, 3, 3) and the
    cameras' mean focal lengths (C,): constants of a rig, cached by its Camera objects."""
    us, vs = np.triu_indices(len(cameras), 1)
    e = np.stack([essential(cameras[u], cameras[v]) for u, v in zip(us, vs)]) if len(us) else np.zeros((0, 3, 3))
    focal = np.array([np.mean(np.diag(camera.matrix)[:2]) for camera in cameras])
    return us, vs, e, focal


def all_pair_costs(views: Sequence[View], spec: Association) -> np.ndarray:
    """(C, C, n, n) the mean symmetric epipolar distance in pixels of person i of view u and person
    j of view v at [u, v, i, j] for every pair of views u < v (n: the most persons a view has);
    _REFUSED where too few keypoints are shared (and for u >= v). One batched
    computation over all pairs (the persons padded): the per-pair loop cost more in numpy calls
    than in arithmetic."""
    c = len(views)
    sizes = [len(v.scores) for v in views]
    n = max(sizes, default=0)
    full = np.full((c, c, n, n), _REFUSED)
    if c < 2 or n == 0:
        return full
    picked = compared_keypoints(views[0].scores.shape[1])
    k = len(picked)
    x, y = np.zeros((c, n, k)), np.zeros((c, n, k))
    good = np.zeros((c, n, k), bool)
    for i, view in enumerate(views):
        points = view.normalised[:, picked]  # (N_i, K, 2)
        x[i, :sizes[i]], y[i, :sizes[i]] = points[..., 0], points[..., 1]
        good[i, :sizes[i]] = view.scores[:, picked] >= spec.min_score
    good &= np.isfinite(x + y)
    us, vs, e, focal = _pair_geometry(tuple(view.camera for view in views))
    xu, yu, xv, yv = x[us], y[us], x[vs], y[vs]  # (Q, n, K) each
    e = e[:, :, :, None, None]  # (Q, 3, 3, 1, 1)
    # the epipolar line in v of each point of u (E x_u) and in u of each point of v (E^T x_v), x = (x, y, 1)
    lv = [e[:, r, 0] * xu + e[:, r, 1] * yu + e[:, r, 2] for r in range(3)]  # 3 x (Q, n, K)
    lu = [e[:, 0, r] * xv + e[:, 1, r] * yv + e[:, 2, r] for r in range(3)]
    # x_v^T E x_u for every person i of u and j of v: (Q, n, n, K)
    algebraic = lv[0][:, :, None] * xv[:, None] + lv[1][:, :, None] * yv[:, None] + lv[2][:, :, None]
    with np.errstate(divide="ignore"):  # a point at the epipole has no line: not compared
        scale_v = 0.5 * focal[vs][:, None, None] / np.hypot(lv[0], lv[1])  # (Q, n, K) px per unit in v
        scale_u = 0.5 * focal[us][:, None, None] / np.hypot(lu[0], lu[1])
    good_u = good[us] & np.isfinite(scale_v)
    good_v = good[vs] & np.isfinite(scale_u)
    distance = np.abs(algebraic) * (scale_v[:, :, None] + scale_u[:, None])  # (Q, n, n, K) pixels
    both = good_u[:, :, None] & good_v[:, None]
    count = both.sum(axis=-1)
    mean = np.where(both, distance, 0.0).sum(axis=-1) / np.maximum(count, 1)
    full[us, vs] = np.where(count >= spec.min_common, mean, _REFUSED)  # (Q, n, n); padding: never a member
    return full


def associate(views: Sequence[View], spec: Association = Association()) -> list[dict[int, int]]:
    """Group the persons of the views: a list of groups, each {view index: person index}, in the
    order they were formed (groups of one camera included: the caller reports them as single-view)."""
    groups: list[dict[int, int]] = []
    costs = all_pair_costs(views, spec)  # (C, C, n, n)
    c = len(views)
    members = np.zeros((0, c), np.intp)  # (G, C): each group's person in each view, -1 for none
    for v, view in enumerate(views):
        n = len(view.scores)
        if n == 0:
            continue
        if groups:
            # each group's members' costs to this view's persons: (G, C, n), refused where no member
            rows = costs[np.arange(c), v][np.arange(c)[None], np.maximum(members, 0)][..., :n]
            known = (members >= 0)[:, :, None] & (rows < _REFUSED)  # a member too little seen does not veto
            counted = known.sum(axis=1)  # (G, n)
            mean = np.where(known, rows, 0.0).sum(axis=1) / np.maximum(counted, 1)
            table = np.where(counted > 0, mean, _REFUSED)  # (G, n)
            picked, cols = assign(table)
            accepted = table[picked, cols] <= spec.max_epipolar_px
            picked, cols = picked[accepted], cols[accepted]
            members[picked, v] = cols
            for g, j in zip(picked.tolist(), cols.tolist()):
                groups[g][v] = j
            taken = set(cols.tolist())
            new = [j for j in range(n) if j not in taken]
        else:
            new = list(range(n))
        groups.extend({v: j} for j in new)
        added = np.full((len(new), c), -1, np.intp)
        added[:, v] = new
        members = np.concatenate([members, added])
    return groups
