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

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from stages.metadata import load_metadata

from .camera import Camera

_REFUSED = 1e9


def compared_keypoints(num_keypoints: int) -> np.ndarray:
    """The keypoints two views are compared on: Sapiens2's body (wrists included), feet and extra
    points, every 4th hand point and every 8th face point, 70 of 308. Matching persons needs points
    spread over the body, not the face's density, and its cost grows with the points. Another
    keypoint count: all of them."""
    meta = load_metadata()
    if num_keypoints != meta.num_keypoints:
        return np.arange(num_keypoints)
    g = meta.groups
    picked = [g["body"], g["foot"], g["extra"], g["left_hand"][::4], g["right_hand"][::4], g["face"][::8]]
    return np.unique(np.concatenate(picked))


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


def all_pair_costs(views: Sequence[View], spec: Association) -> dict[tuple[int, int], np.ndarray]:
    """(u, v) -> (Nu, Nv) mean symmetric epipolar distance in pixels for every pair of views u < v;
    _REFUSED where too few keypoints are shared. One batched computation over all pairs (the
    persons padded to the most any view has): the per-pair loop cost more in numpy calls than in
    arithmetic."""
    c = len(views)
    sizes = [len(v.scores) for v in views]
    n = max(sizes, default=0)
    if c < 2 or n == 0:
        return {(u, v): np.zeros((sizes[u], sizes[v])) for u in range(c) for v in range(u + 1, c)}
    picked = compared_keypoints(views[0].scores.shape[1])
    k = len(picked)
    points = np.ones((c, n, k, 3))
    good = np.zeros((c, n, k), bool)
    for i, view in enumerate(views):
        points[i, :sizes[i], :, :2] = view.normalised[:, picked]
        good[i, :sizes[i]] = view.scores[:, picked] >= spec.min_score
    us, vs = np.triu_indices(c, 1)  # (Q,) the pairs
    e = np.stack([essential(views[u].camera, views[v].camera) for u, v in zip(us, vs)])  # (Q, 3, 3)
    focal = np.array([np.mean(np.diag(view.camera.matrix)[:2]) for view in views])
    pu, pv = points[us], points[vs]  # (Q, n, K, 3)
    # (plain matmuls of (n K, 3) by (3, 3) per pair and elementwise products: einsum's generic loop cost 10x)
    lines_v = (pu.reshape(len(us), n * k, 3) @ np.swapaxes(e, 1, 2)).reshape(pu.shape)  # lines in v of u's points
    lines_u = (pv.reshape(len(us), n * k, 3) @ e).reshape(pv.shape)  # (Q, n, K, 3): lines in u of v's points
    algebraic = sum(lines_v[:, :, None, :, i] * pv[:, None, :, :, i] for i in range(3))  # (Q, n, n, K): x_v^T E x_u
    norm_v = np.hypot(lines_v[..., 0], lines_v[..., 1])[:, :, None, :]  # (Q, n, 1, K)
    norm_u = np.hypot(lines_u[..., 0], lines_u[..., 1])[:, None, :, :]  # (Q, 1, n, K)
    with np.errstate(divide="ignore", invalid="ignore"):
        distance = 0.5 * np.abs(algebraic) * (focal[vs][:, None, None, None] / norm_v +
                                              focal[us][:, None, None, None] / norm_u)  # (Q, n, n, K) pixels
    both = good[us][:, :, None, :] & good[vs][:, None, :, :] & np.isfinite(distance)
    count = both.sum(axis=-1)
    mean = np.where(both, distance, 0.0).sum(axis=-1) / np.maximum(count, 1)
    cost = np.where(count >= spec.min_common, mean, _REFUSED)  # (Q, n, n)
    return {(int(u), int(v)): cost[q, :sizes[u], :sizes[v]] for q, (u, v) in enumerate(zip(us, vs))}


def associate(views: Sequence[View], spec: Association = Association()) -> list[dict[int, int]]:
    """Group the persons of the views: a list of groups, each {view index: person index}, in the
    order they were formed (groups of one camera included: the caller reports them as single-view)."""
    groups: list[dict[int, int]] = []
    costs = all_pair_costs(views, spec)
    for v, view in enumerate(views):
        n = len(view.scores)
        if n == 0:
            continue
        if groups:
            table = np.full((len(groups), n), _REFUSED)
            for g, group in enumerate(groups):
                rows = np.array([costs[u, v][i] for u, i in group.items()])  # (members, n)
                known = rows < _REFUSED  # a member too little seen to compare does not veto the others
                mean = np.where(known, rows, 0.0).sum(axis=0) / np.maximum(known.sum(axis=0), 1)
                table[g] = np.where(known.any(axis=0), mean, _REFUSED)
            rows, cols = assign(table)
            taken = set()
            for g, j in zip(rows, cols):
                if table[g, j] <= spec.max_epipolar_px:
                    groups[g][v] = int(j)
                    taken.add(int(j))
            groups.extend({v: j} for j in range(n) if j not in taken)
        else:
            groups.extend({v: j} for j in range(n))
    return groups
