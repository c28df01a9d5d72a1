"""Triangulation by consensus: many keypoints of many persons from calibrated views, all points at once
(numpy, no loop over points). Each point (``triangulate``; other docstrings name these steps):

1. Weighted linear triangulation (``stages.mocap.dlt``) of the undistorted keypoints, each view weighted
   by its score (0 under ``min_score`` or where the camera does not see the person).
2. A view agrees with a set's point when it reprojects within ``max_error_px`` of what it saw (in its
   pixels, through its distortion), in front of it, both from the point of the whole set and from the
   point of the set's other views (less what their own noise and geometry explain; the detectors'
   noise is measured on the step itself: ``noise_of``).
3. A point whose views all agree is solved from all of them. Any other takes the largest consensus
   that a pair of its views at least ``min_angle_deg`` apart proposes (ties: the lowest RMS error),
   drops the view to blame while one disagrees, and lets the views that agree with the result join.
4. A view outvoted on more than ``suspect_share`` of a person's points is suspect for that person: its
   other points are solved again with it never in a consensus, agreeing only where the other views
   place the point on their own; a point that rests on a suspect view and one other is invalid.
5. A point is valid when at least ``min_views`` views remain, all agreeing, two of them at least
   ``min_angle_deg`` apart. An invalid point is zeros with valid=False, error 0 and views 0: nothing
   made up, nothing non-finite.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .camera import Camera, CameraSet
from .dlt import inverse_form, normal_blocks, solve_normals, view_normals


@dataclass(frozen=True)
class Triangulation:
    """min_score: a view's keypoint counts from this score; max_error_px: a view over this
    reprojection error does not agree; min_views: views a valid point needs (2 or more);
    min_angle_deg: the widest angle between two of a valid point's views (and of a pair that
    proposes a point); suspect_share: the share of a person's points on which the others may
    outvote a view before it is suspect for that person."""

    min_score: float = 0.3
    max_error_px: float = 15.0
    min_views: int = 2
    min_angle_deg: float = 15.0
    suspect_share: float = 0.02

    def __post_init__(self) -> None:
        if self.min_views < 2:
            raise ValueError(f"min_views must be at least 2 (one view has no depth), got {self.min_views}")
        if not self.max_error_px > 0:
            raise ValueError(f"max_error_px must be positive, got {self.max_error_px}")
        if not 0 <= self.min_angle_deg < 90:
            raise ValueError(f"min_angle_deg must be within 0 and 90, got {self.min_angle_deg}")
        if not 0 <= self.suspect_share <= 1:
            raise ValueError(f"suspect_share must be within 0 and 1, got {self.suspect_share}")


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


def noise_of(errors: np.ndarray, used: np.ndarray, max_error_px: float) -> float:
    """The detectors' pixel noise as a step's points show it: the median, over the points of three
    or more views all within ``max_error_px``, of their squared errors' sum per degree of freedom
    (two per view, less three); errors and used (C, N). ``max_error_px`` / 10 when no point has such
    views; at least 0.1 px."""
    count = used.sum(axis=0)
    squares = np.where(used, errors * errors, 0.0)  # (C, N)
    clean = (count >= 3) & (squares.max(axis=0) <= max_error_px ** 2)
    if not clean.any():
        return max_error_px / 10
    return max(float(np.sqrt(np.median(squares.sum(axis=0)[clean] / (2 * count[clean] - 3)))), 0.1)


@dataclass
class _Fit:
    """Sets of views, their points and how each view agrees (``_Solver.fit``); (C, N) arrays are one
    row per view."""

    chosen: np.ndarray  # (C, N) the views of each set
    xyz: np.ndarray  # (3, N)
    solvable: np.ndarray  # (N,)
    errors: np.ndarray  # (C, N) px against the set's point
    front: np.ndarray  # (C, N)
    surprise: np.ndarray | None  # (C, N) a view's left-out error squared over its expected square
    without: np.ndarray  # (C, 3, N) the point of the set's views other than each
    agree: np.ndarray  # (C, N) the views of the set that agree
    sure: np.ndarray  # (C, N) the views of the set that the others place within the threshold as it is

    def put(self, rows: np.ndarray, part: _Fit) -> None:
        """Take ``part``'s sets for the points ``rows``."""
        for name in ("chosen", "xyz", "errors", "front", "agree", "sure"):
            getattr(self, name)[:, rows] = getattr(part, name)
        self.solvable[rows] = part.solvable


class _Solver:
    """One call's points, one column each: their views' normal equations (9, C, N), pixels u, v,
    weights and what the views offer (C, N)."""

    def __init__(self, views: CameraSet, parts: np.ndarray, weights: np.ndarray, u: np.ndarray, v: np.ndarray,
                 offered: np.ndarray, spec: Triangulation) -> None:
        self.views, self.parts, self.weights, self.u, self.v, self.offered, self.spec = \
            views, parts, weights, u, v, offered, spec
        self.noise = spec.max_error_px / 10
        self.centres = views.cached("centres", lambda: np.stack([c.centre for c in views.cameras]).T[:, :, None])
        self.rotations = views.rotations.reshape(-1, 3, 3)[:, :, :, None]  # (C, 3, 3, 1): rows r1, r2, r3
        self.min_sine = float(np.sin(np.radians(spec.min_angle_deg)))

    def errors(self, xyz: np.ndarray, rows: np.ndarray | slice) -> tuple[np.ndarray, np.ndarray]:
        """Points (3, N) of the points ``rows`` -> each view's pixel error and in_front (C, N)."""
        u, v, front = self.views.project_rows(xyz)
        du, dv = u - self.u[:, rows], v - self.v[:, rows]
        return np.sqrt(du * du + dv * dv), front

    def fit(self, chosen: np.ndarray, rows: np.ndarray | slice = slice(None), strict: np.ndarray | None = None,
            first: bool = False) -> _Fit:
        """The point of each set ``chosen`` (C, N) of the points ``rows`` and how its views agree with
        it (module docstring, step 2); ``strict`` (C, N): the suspect views (step 4). ``first``: the
        sets are what the views offer, and the step's noise is measured on their errors."""
        parts, spec = self.parts[:, :, rows], self.spec
        inside = parts if first else np.where(chosen, parts, 0.0)  # (9, C, N)
        total = inside.sum(axis=1)  # (9, N)
        xyz, solvable = solve_normals(total)  # (3, N), (N,)
        errors, front = self.errors(xyz, rows)
        if first:
            self.noise = noise_of(errors, chosen, spec.max_error_px)
        # each view left out: nine (C, N) entries (a (9, C, N) array, 355 kB at 4 x 4, would be given back
        # to the system and faulted in again at every step, as ``_scratch`` says)
        left = [total[i] - inside[i] for i in range(9)]
        others, ok = solve_normals(left)  # (3, C, N), (C, N)
        others = others.swapaxes(0, 1)  # (C, 3, N)
        u, v, front_out, cam = self.views.project_each(others)
        du, dv = u - self.u[:, rows], v - self.v[:, rows]
        squared = du * du + dv * dv  # (C, N)
        checked = chosen & ok & (chosen.sum(axis=0) >= 3)
        limit = spec.max_error_px ** 2
        # What the others' own noise explains: their point's covariance is noise^2 w^2 (z / f)^2 A^-1
        # (A the 3x3 part of their normal equations, w^2 their mean squared score, z / f taken alike
        # for the views), so its projection into the view spreads by noise^2 w^2 (j1 A^-1 j1^T +
        # j2 A^-1 j2^T) squared pixels, j1 and j2 the rows r1 - x r3, r2 - y r3 of the view's rotation
        # at the point's normalised coordinates (x, y): the Jacobian of its projection. Needed only
        # where a view is over the threshold, and to choose which view to drop (not ``first``).
        expected = np.zeros(squared.shape)
        need = checked & (squared > limit) if first else checked
        if need.any():
            at = np.nonzero(need)
            inverse_z = 1.0 / np.where(cam[:, 2][at] > 1e-9, cam[:, 2][at], 1.0)
            x, y = cam[:, 0][at] * inverse_z, cam[:, 1][at] * inverse_z
            r = self.rotations[at[0], :, :, 0]  # (M, 3, 3)
            j1 = tuple(r[:, 0, i] - x * r[:, 2, i] for i in range(3))
            j2 = tuple(r[:, 1, i] - y * r[:, 2, i] for i in range(3))
            w2 = np.where(chosen, self.weights[:, rows] ** 2, 0.0)  # (C, N)
            rest, rest4 = w2.sum(axis=0) - w2, np.sum(w2 * w2, axis=0) - w2 * w2
            mean_w2 = rest4[at] / np.where(rest[at] > 0, rest[at], 1.0)
            expected[at] = self.noise ** 2 * mean_w2 * inverse_form([entry[at] for entry in left], [j1, j2])
        allowed = 9 * expected if strict is None else np.where(strict, 0.0, 9 * expected)  # three deviations
        left_ok = ~checked | (front_out & (squared - allowed <= limit))
        if strict is not None:  # checked by others that place the point on their own, or out
            alone = self.widest(xyz, chosen, without=True) < self.min_sine
            left_ok &= ~(chosen & strict & (~checked | alone))
        agree = chosen & front & (errors <= spec.max_error_px) & left_ok & solvable
        surprise = None
        if not first:
            surprise = np.where(checked, squared / (expected + self.noise ** 2), errors * errors / self.noise ** 2)
            surprise = np.where(front_out | ~checked, surprise, np.inf)
        sure = agree & checked & front_out & (squared <= limit)
        return _Fit(chosen.copy(), xyz, solvable, errors, front, surprise, others, agree, sure)

    def widest(self, xyz: np.ndarray, used: np.ndarray, without: bool = False) -> np.ndarray:
        """(N,) the sine of the widest angle between two used views' rays to the points (3, N) (0
        without two); ``without``: (C, N) the same without each view."""
        x, y, z = (xyz[i] - self.centres[i] for i in range(3))  # (C, N) each: the rays
        length2 = x * x + y * y + z * z
        qa, qb = np.triu_indices(len(length2), 1)
        dot = x[qa] * x[qb] + y[qa] * y[qb] + z[qa] * z[qb]  # (Q, N)
        sine2 = 1.0 - dot * dot / np.maximum(length2[qa] * length2[qb], 1e-24)
        sine2 = np.where(used[qa] & used[qb], sine2, 0.0)
        if without:
            sine2 = np.stack([np.max(sine2[(qa != c) & (qb != c)], axis=0, initial=0.0) for c in range(len(length2))])
        else:
            sine2 = np.max(sine2, axis=0, initial=0.0)
        return np.sqrt(np.maximum(sine2, 0.0))

    def valid(self, fit: _Fit, angle: bool = True) -> np.ndarray:
        """(N,) points of enough views, every one agreeing, two of them ``min_angle_deg`` apart."""
        count = fit.chosen.sum(axis=0)
        valid = (count >= self.spec.min_views) & ~np.any(fit.chosen & ~fit.agree, axis=0) & fit.solvable
        if angle:
            valid &= self.widest(fit.xyz, fit.chosen) >= self.min_sine
        return valid

    def consensus(self, rows: np.ndarray, suspect: np.ndarray | None = None) -> _Fit:
        """The views that agree most on each of the points ``rows`` (module docstring, step 3; with
        ``suspect`` (C, N), step 4)."""
        offered, spec = self.offered[:, rows], self.spec
        strict = None if suspect is None else suspect[:, rows]
        c, t = offered.shape
        pairable = offered if strict is None else offered & ~strict
        qa, qb = np.triu_indices(c, 1)  # (Q,) each: the pairs of views
        q, point = np.nonzero(pairable[qa] & pairable[qb])  # (R,) each: a pair and a point it proposes for
        a, b = qa[q], qb[q]
        candidate, ok = solve_normals(self.parts[:, a, rows[point]] + self.parts[:, b, rows[point]])  # (3, R), (R,)
        err, front = self.errors(candidate, rows[point])  # (C, R)
        ray_a, ray_b = candidate - self.centres[:, a, 0], candidate - self.centres[:, b, 0]  # (3, R)
        dot = np.sum(ray_a * ray_b, axis=0)
        ok &= dot * dot <= (1.0 - self.min_sine ** 2) * np.sum(ray_a ** 2, axis=0) * np.sum(ray_b ** 2, axis=0)
        inliers = offered[:, point] & front & (err <= spec.max_error_px) & ok  # (C, R)
        n = inliers.sum(axis=0)
        rms = np.sqrt(np.sum(np.where(inliers, err * err, 0.0), axis=0) / np.maximum(n, 1))
        if strict is not None:
            n = n - (inliers & strict[:, point]).sum(axis=0)  # a suspect view that agrees does not vote
        order = np.lexsort((rms, -n, point))  # each point's best candidate first: the most views, the lowest error
        first = np.ones(len(order), bool)
        first[1:] = point[order][1:] != point[order][:-1]
        best = order[first]
        chosen = np.zeros((c, t), bool)
        chosen[:, point[best]] = inliers[:, best]
        dropped = np.zeros((c, t), bool)
        for round_ in range(2 * c + 1):  # each round drops one view of some points, or lets agreeing views join
            fit = self.fit(chosen, rows, strict)
            if round_ == 2 * c:
                break
            size = chosen.sum(axis=0)
            drop = np.flatnonzero(np.any(chosen & ~fit.agree, axis=0) & (size > 2))
            if drop.size:
                worst = self._worst(fit, rows, drop)
                chosen[worst, drop] = False
                dropped[worst, drop] = True
                continue
            join = offered & ~chosen & ~dropped & fit.front & (fit.errors <= spec.max_error_px) & fit.solvable & \
                (size >= 2)
            if strict is not None:
                join &= ~strict
            if not join.any():
                break
            chosen |= join
        return fit

    def _worst(self, fit: _Fit, rows: np.ndarray, drop: np.ndarray) -> np.ndarray:
        """The view to drop from each set ``drop`` (indices into ``rows``): of four or more views, the
        one without which the others agree best (the least sum of squared errors against their own
        point); of three, the one the other two place the most unexpectedly far (removing any one of
        three leaves a pair, and a pair always agrees)."""
        sets = fit.chosen[:, drop]  # (C, D)
        rest = np.empty(sets.shape)
        for c in range(len(sets)):  # the point of the views other than c, in every camera
            err, front = self.errors(fit.without[c][:, drop], rows[drop])  # (C, D)
            others = sets.copy()
            others[c] = False
            rest[c] = np.sum(np.where(others, np.where(front, err, np.inf) ** 2, 0.0), axis=0)
        surprise = np.where(fit.front[:, drop], fit.surprise[:, drop], np.inf)
        badness = np.where(sets.sum(axis=0) >= 4, -rest, surprise)
        return np.argmax(np.where(sets, badness, -np.inf), axis=0)


def triangulate(cameras: Sequence[Camera] | CameraSet, pixels: np.ndarray, scores: np.ndarray,
                normalised: np.ndarray, spec: Triangulation = Triangulation()) -> Points3D:
    """Persons' keypoints seen by the cameras -> their 3D points (see the module docstring).

    cameras: the C views (a CameraSet keeps what they share between calls); pixels (P, C, K, 2) as
    detected (distorted); scores (P, C, K), 0 where a camera does not see the person; normalised
    (P, C, K, 2): ``pixels`` undistorted by each camera.
    """
    views = cameras if isinstance(cameras, CameraSet) else CameraSet(cameras)
    p, c, k = scores.shape
    # One column per point: (P, C, K, ...) -> (C, P*K, ...); one row per view
    pix = np.moveaxis(pixels, 0, 1).reshape(c, p * k, 2)
    nrm = np.moveaxis(normalised, 0, 1).reshape(c, p * k, 2)
    score = np.moveaxis(scores, 0, 1).reshape(c, p * k)
    # one test of a sum for five: a sum is finite exactly when its terms are (float32 keypoints and
    # their undistortion cannot overflow a float64 sum), and reductions over an axis of 2 are slow
    u, v = pix[..., 0], pix[..., 1]  # (C, N)
    finite = np.isfinite(u + v + nrm[..., 0] + nrm[..., 1] + score)
    offered = finite & (score >= spec.min_score)  # (C, N)
    u, v = np.where(finite, u, 0.0), np.where(finite, v, 0.0)
    weights = np.where(offered, score, 0.0)
    blocks = views.cached("view_blocks", lambda: normal_blocks(np.stack([c.extrinsic for c in views.cameras])))
    parts = view_normals(blocks, np.where(finite, nrm[..., 0], 0.0), np.where(finite, nrm[..., 1], 0.0), weights,
                         _scratch(views, p * k))  # (9, C, N)
    solver = _Solver(views, parts, weights, u, v, offered, spec)
    # Every point from all its views (whole arrays: no gather, no scatter); the points whose views do
    # not all agree look for their consensus, a few at a time.
    fit = solver.fit(offered, first=True)
    count = offered.sum(axis=0)
    todo = np.flatnonzero((count >= spec.min_views) & (np.any(offered & ~fit.agree, axis=0) | ~fit.solvable))
    if todo.size:
        fit.put(todo, solver.consensus(todo))
    # Then the points of the views a person's other points caught wrong, with those views suspect.
    suspect = _suspects(offered, fit.chosen, solver.valid(fit, angle=False), p, spec.suspect_share)  # (C, N)
    # (not the points where such a view is left out already, nor where the others check it as they would)
    doubt = suspect & fit.chosen & ~fit.sure
    rows = np.flatnonzero((suspect & fit.sure).any(axis=0))
    if rows.size:
        alone = solver.widest(fit.xyz[:, rows], fit.chosen[:, rows], without=True) < solver.min_sine  # (C, R)
        doubt[:, rows] |= suspect[:, rows] & fit.sure[:, rows] & alone
    todo = np.flatnonzero(doubt.any(axis=0) & (count >= spec.min_views))
    if todo.size:
        fit.put(todo, solver.consensus(todo, suspect))
    valid = solver.valid(fit)
    used = fit.chosen & valid
    count = used.sum(axis=0)
    rms = np.sqrt(np.sum(np.where(used, fit.errors ** 2, 0.0), axis=0) / np.maximum(count, 1))
    return Points3D(np.where(valid, fit.xyz, 0.0).T.reshape(p, k, 3).astype(np.float32), valid.reshape(p, k),
                    rms.reshape(p, k).astype(np.float32), count.reshape(p, k).astype(np.uint8),
                    used.reshape(c, p, k).swapaxes(0, 1))


def _scratch(views: CameraSet, n: int) -> np.ndarray:
    """A (9, C, n) array for the views' normal equations, kept with the CameraSet from step to step
    (its capacity grows): a fresh one each step (355 kB at 4 persons x 4 cameras) made glibc give
    its heap back to the system at the end of the step and fault it in again at the next, some 120
    page faults a step. A CameraSet is one world step's, used by one thread."""
    kept = views.cached("scratch", dict)
    c = len(views.cameras)
    if kept.get("array") is None or kept["array"].shape[2] < n:
        kept["array"] = np.empty((9, c, max(n, 2 * (0 if kept.get("array") is None else kept["array"].shape[2]))))
    return kept["array"][:, :, :n]


def _suspects(offered: np.ndarray, used: np.ndarray, valid: np.ndarray, persons: int, share: float) -> np.ndarray:
    """(C, N): the views a point is offered by that are suspect for its person: outvoted on more than
    ``share`` of the person's valid points of three or more views (module docstring, step 4)."""
    c, n = used.shape
    k = n // max(persons, 1)
    checkable = offered & (valid & (offered.sum(axis=0) >= 3))  # (C, N)
    outvoted = (checkable & ~used).reshape(c, persons, k).sum(axis=2)  # (C, P)
    suspect = outvoted > share * checkable.reshape(c, persons, k).sum(axis=2)
    return offered & np.repeat(suspect, k, axis=1)
