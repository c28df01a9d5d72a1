"""Triangulation by consensus: many keypoints of many persons from calibrated views, all points at once
(numpy, no loop over points). Each point (``triangulate``; other docstrings name these steps):

1. Weighted linear triangulation (``stages.mocap.dlt``) of the undistorted keypoints, each view weighted
   by its score (0 under ``min_score`` or where the camera does not see the person).
2. A view agrees with a set's point when it reprojects within ``max_error_px`` of what it saw (in its
   pixels, through its distortion), in front of it, both from the point of the whole set and from the
   point of the set's other views (less what their own noise and geometry explain, each view with its
   own focal length and depth: a rig of 720p and 1080p cameras differs twofold in both). The
   detectors' noise is measured on the step itself (``noise_of``).
3. A point whose views all agree is solved from all of them. Any other takes the largest consensus
   that a pair of its views at least ``min_angle_deg`` apart proposes (ties: the lowest RMS error),
   drops the view to blame while one disagrees, and lets the views that agree with the result join.
4. A view outvoted on more than ``suspect_share`` of a person's points is suspect for that person: its
   other points are solved again with it never in a consensus, agreeing only where the other views
   place the point on their own; a point that rests on a suspect view and one other is invalid.
5. A point is valid when at least ``min_views`` views remain, all agreeing, two of them at least
   ``min_angle_deg`` apart, and the step's noise leaves it within ``max_uncertainty_mm`` (the RMS
   error that noise gives it through its views' geometry: ``_Solver.within_bound``): views that
   agree tell nothing of how far along their rays the point lies, and two of wide lenses whose
   rays meet at a small angle place it loosely however well they agree (docs/MOCAP.md, "When a
   point is valid"). An invalid point is zeros with valid=False, error 0 and views 0: nothing made
   up, nothing non-finite.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .camera import Camera, CameraSet
from .dlt import inverse_form, normal_blocks, solve_normals, view_normals
from .noise import noise_of
from .points import Points3D, Triangulation


@dataclass
class _Fit:
    """Sets of views, their points and how each view agrees (``_Solver.fit``); (C, N) arrays are one
    row per view."""

    chosen: np.ndarray  # (C, N) the views of each set
    xyz: np.ndarray  # (3, N)
    solvable: np.ndarray  # (N,)
    errors: np.ndarray  # (C, N) squared px against the set's point
    front: np.ndarray  # (C, N)
    surprise: np.ndarray | None  # (C, N) a view's left-out error squared over its expected square
    without: np.ndarray  # (C, 3, N) the point of the set's views other than each
    agree: np.ndarray  # (C, N) the views of the set that agree
    sure: np.ndarray  # (C, N) the views of the set that the others place within the threshold as it is
    spread: np.ndarray  # (N,) the trace of the inverse of the 3x3 part of the set's normal equations
    depth: np.ndarray  # (C, N) the point's depth in each view (float32)

    def put(self, rows: np.ndarray, part: _Fit) -> None:
        """Take ``part``'s sets for the points ``rows``."""
        for name in ("chosen", "xyz", "errors", "front", "agree", "sure", "surprise", "spread", "depth"):
            if getattr(self, name) is not None:
                getattr(self, name)[..., rows] = getattr(part, name)
        self.without[:, :, rows] = part.without
        self.solvable[rows] = part.solvable


class _Solver:
    """One call's points, one column each: their views' normal equations (9, C, N), pixels u, v,
    weights and what the views offer (C, N)."""

    def __init__(self, views: CameraSet, parts: np.ndarray, weights: np.ndarray, u: np.ndarray, v: np.ndarray,
                 offered: np.ndarray, spec: Triangulation) -> None:
        self.views, self.parts, self.weights, self.u, self.v, self.offered, self.spec = \
            views, parts, weights, u, v, offered, spec
        self.u32, self.v32 = u.astype(np.float32), v.astype(np.float32)
        self.c = len(views.cameras)
        self.limit = spec.max_error_px ** 2
        self.measured: tuple[np.ndarray, np.ndarray] | None = None  # the first fit's squared errors and sets
        self._noise: float | None = None
        self.centres = views.cached("centres", lambda: np.stack([c.centre for c in views.cameras]).T[:, :, None])
        self.centres32 = views.cached("centres32", lambda: self.centres.astype(np.float32))  # (3, C, 1)
        self.focal = views.cached("focal", lambda: np.array([[(c.matrix[0, 0] + c.matrix[1, 1]) / 2]
                                                             for c in views.cameras]))  # (C, 1) px
        self.most_w2f2 = float(np.max(weights, initial=0.0) ** 2 / np.min(self.focal) ** 2)  # the largest w^2 / f^2
        self.rotations = views.rotations.reshape(-1, 3, 3)  # (C, 3, 3): rows r1, r2, r3
        self.pairs = views.cached("pairs", lambda: np.triu_indices(self.c, 1))  # (Q,) each: the pairs of views
        self.max_cos2 = float(np.cos(np.radians(spec.min_angle_deg)) ** 2) if spec.min_angle_deg else 1.0

    @property
    def noise(self) -> float:
        """The step's pixel noise (``noise_of`` the first fit's errors), measured when first asked for."""
        if self._noise is None:
            self._noise = self.spec.max_error_px / 10 if self.measured is None else \
                noise_of(*self.measured, self.spec.max_error_px)
        return self._noise

    def errors(self, xyz: np.ndarray, rows: np.ndarray | slice) -> tuple[np.ndarray, np.ndarray]:
        """Points (3, N) of the points ``rows`` -> each view's squared pixel error and in_front (C, N)."""
        u, v, front = self.views.project_rows(xyz)
        du, dv = u - self.u[:, rows], v - self.v[:, rows]
        return du * du + dv * dv, front

    def fit(self, chosen: np.ndarray, rows: np.ndarray | slice = slice(None), strict: np.ndarray | None = None,
            first: bool = False) -> _Fit:
        """The point of each set ``chosen`` (C, N) of the points ``rows`` and how its views agree with
        it (module docstring, step 2); ``strict`` (C, N): the suspect views (step 4). ``first``: the
        sets are what the views offer (their step's noise is measured on these errors)."""
        c, limit = self.c, self.limit
        inside = self.parts if first else np.where(chosen, self.parts[:, :, rows], 0.0)  # (9, C, T)
        t = inside.shape[2]
        # The set's equations and, beside them, the set's without each view: one solve for all
        systems = _buffer(self.views, "systems", (9, c + 1, t))
        total = systems[:, c]  # (9, T)
        np.copyto(total, inside[:, 0])
        for i in range(1, c):
            total += inside[:, i]
        np.subtract(total[:, None], inside, out=systems[:, :c])
        points, ok, spread = solve_normals(systems, trace=True)  # (3, C + 1, T), (C + 1, T), (C + 1, T)
        xyz, solvable, others = points[:, c], ok[c], points[:, :c].swapaxes(0, 1)  # (3, T), (T,), (C, 3, T)
        # ... and one projection: the set's point in every view, each view's left-out point in that view
        both = _buffer(self.views, "both", (c, 3, 2 * t), np.float32)  # pixel errors to 1e-4 px: float32 will do
        both[:, :, :t] = xyz
        both[:, :, t:] = others
        u, v, front_both, cam = self.views.project_each(both)  # (C, 2T) each, cam (C, 3, 2T)
        du = u.reshape(c, 2, t) - (self.u32 if first else self.u32[:, rows])[:, None]
        dv = v.reshape(c, 2, t) - (self.v32 if first else self.v32[:, rows])[:, None]
        both_errors = du * du
        both_errors += dv * dv  # (C, 2, T)
        errors, squared = both_errors[:, 0], both_errors[:, 1]  # (C, T) each: against the set's, the left-out point
        front, front_out = front_both[:, :t], front_both[:, t:]
        if first:
            self.measured = (errors, chosen)
        count = chosen.sum(axis=0)
        checked = chosen & ok[:c] & (count >= 3)
        over = squared > limit
        # What the others' own noise explains of a view's left-out error: their point's covariance (as
        # ``within_bound`` has it, of their equations) projected into the view (Jacobian (f / z) (j1,
        # j2), j1 and j2 the rows r1 - x r3, r2 - y r3 of its rotation at the left-out point's
        # normalised coordinates x, y, z its depth there): k (f / z)^2 (j1 A^-1 j1^T + j2 A^-1 j2^T)
        # squared pixels. Needed only where a view is over the threshold, and to choose which view to
        # drop (not ``first``).
        expected = np.zeros((c, t)) if not first else None
        within = ~over
        need = checked & over if first else checked
        if need.any():
            at = np.nonzero(need)
            out = cam[:, :, t:]  # (C, 3, T) the left-out points in their view's coordinates
            inverse_z = 1.0 / np.where(out[:, 2][at] > 1e-9, out[:, 2][at], 1.0)
            x, y = out[:, 0][at] * inverse_z, out[:, 1][at] * inverse_z
            r = self.rotations[at[0]]  # (M, 3, 3)
            j1 = tuple(r[:, 0, i] - x * r[:, 2, i] for i in range(3))
            j2 = tuple(r[:, 1, i] - y * r[:, 2, i] for i in range(3))
            w2 = np.where(chosen, self.weights[:, rows] ** 2, 0.0)  # (C, T)
            scaled = w2 * (cam[:, 2, :t] / self.focal) ** 2  # w_c^2 (z_c / f_c)^2 at the set's point
            rest, rest_scaled = w2.sum(axis=0) - w2, np.sum(w2 * scaled, axis=0) - w2 * scaled
            mean = rest_scaled[at] / np.where(rest[at] > 0, rest[at], 1.0)
            view_scale = (self.focal[at[0], 0] * inverse_z) ** 2  # (f / z)^2 of the view
            seen = self.noise ** 2 * mean * view_scale * inverse_form(systems[:, at[0], at[1]], [j1, j2])  # (M,) px^2
            if expected is not None:
                expected[at] = seen
            allowed = 9 * seen if strict is None else np.where(strict[at], 0.0, 9 * seen)  # three deviations
            within[at] = squared[at] - allowed <= limit
        left_ok = ~checked | (front_out & within)
        if strict is not None:  # checked by others that place the point on their own, or out
            alone = ~self.wide(xyz, chosen, without=True)
            left_ok &= ~(chosen & strict & (~checked | alone))
        agree = chosen & front & (errors <= limit) & left_ok & solvable
        surprise = None
        if not first:
            noise2 = self.noise ** 2
            surprise = np.where(checked, squared / (expected + noise2), errors / noise2)
            surprise = np.where(front_out | ~checked, surprise, np.inf)
        sure = agree & checked & front_out & ~over
        return _Fit(chosen.copy(), xyz, solvable, errors, front, surprise, others, agree, sure, spread[c],
                    cam[:, 2, :t])

    def wide(self, xyz: np.ndarray, used: np.ndarray, without: bool = False) -> np.ndarray:
        """(N,) whether two used views' rays to the points (3, N) are ``min_angle_deg`` apart or more;
        ``without``: (C, N) the same without each view. (The angle's cosine against the rays' lengths:
        no square root, no division.)"""
        qa, qb = self.pairs
        apart = used[qa] & used[qb]  # (Q, N)
        if self.max_cos2 < 1:  # in float32: the angle to 1e-6 degrees
            xyz = xyz.astype(np.float32)
            x, y, z = (xyz[i] - self.centres32[i] for i in range(3))  # (C, N) each: the rays
            length2 = x * x
            length2 += y * y
            length2 += z * z
            dot = x[qa] * x[qb]
            dot += y[qa] * y[qb]
            dot += z[qa] * z[qb]  # (Q, N)
            dot *= dot
            bound = length2[qa] * length2[qb]
            bound *= self.max_cos2
            apart &= dot <= bound
        if without:
            return np.stack([apart[(qa != c) & (qb != c)].any(axis=0) for c in range(self.c)])
        return apart.any(axis=0)

    def within_bound(self, fit: _Fit, valid: np.ndarray) -> np.ndarray:
        """``valid`` (N,) less the points whose expected error is over ``max_uncertainty_mm`` (module
        docstring, step 5). A set's point has the covariance k A^-1 about (A the 3x3 part of its
        normal equations): each view c adds the equations w_c z_c (x_c - x) of its normalised
        coordinates x_c, whose noise is the step's pixel noise / f_c (z_c the point's depth in the
        view, f_c its focal length), so k is noise^2 times the mean over the views of w_c^2 (z_c /
        f_c)^2, weighted by their share w_c^2 of A; the trace of k A^-1 is the expected squared
        error, summed over the axes. k is at most noise^2 times the largest weight^2 (z / f)^2: most
        points are within the bound by that alone, and only the others are computed."""
        bound = (self.spec.max_uncertainty_mm / 1000 / self.noise) ** 2  # m^2 per px^2 of noise
        if not np.isfinite(bound):
            return valid
        most = np.max(np.abs(fit.depth), axis=0).astype(np.float64)  # (N,)
        most *= most
        most *= fit.spread * self.most_w2f2
        check = np.flatnonzero(valid & ~(most <= bound))
        if check.size:
            w2 = np.where(fit.chosen[:, check], self.weights[:, check] ** 2, 0.0)  # (C, M)
            scaled = w2 * (fit.depth[:, check] / self.focal) ** 2
            k = np.sum(w2 * scaled, axis=0) / np.maximum(w2.sum(axis=0), 1e-30)
            valid[check] &= k * fit.spread[check] <= bound
        return valid

    def valid(self, fit: _Fit, angle: bool = True) -> np.ndarray:
        """(N,) points of enough views, every one agreeing, two of them ``min_angle_deg`` apart."""
        count = fit.chosen.sum(axis=0)
        valid = (count >= self.spec.min_views) & ~np.any(fit.chosen & ~fit.agree, axis=0) & fit.solvable
        if angle:
            valid &= self.wide(fit.xyz, fit.chosen)
        return valid

    def consensus(self, rows: np.ndarray, suspect: np.ndarray | None = None) -> _Fit:
        """The views that agree most on each of the points ``rows`` (module docstring, step 3; with
        ``suspect`` (C, N), step 4)."""
        offered, limit = self.offered[:, rows], self.limit
        strict = None if suspect is None else suspect[:, rows]
        c, t = offered.shape
        pairable = offered if strict is None else offered & ~strict
        qa, qb = self.pairs
        q, point = np.nonzero(pairable[qa] & pairable[qb])  # (R,) each: a pair and a point it proposes for
        a, b = qa[q], qb[q]
        candidate, ok = solve_normals(self.parts[:, a, rows[point]] + self.parts[:, b, rows[point]])  # (3, R), (R,)
        err, front = self.errors(candidate, rows[point])  # (C, R) squared
        ray_a, ray_b = candidate - self.centres[:, a, 0], candidate - self.centres[:, b, 0]  # (3, R)
        dot = np.sum(ray_a * ray_b, axis=0)
        ok &= dot * dot <= self.max_cos2 * np.sum(ray_a ** 2, axis=0) * np.sum(ray_b ** 2, axis=0)
        inliers = offered[:, point] & front & (err <= limit) & ok  # (C, R)
        n = inliers.sum(axis=0)
        mean = np.sum(np.where(inliers, err, 0.0), axis=0) / np.maximum(n, 1)
        if strict is not None:
            n = n - (inliers & strict[:, point]).sum(axis=0)  # a suspect view that agrees does not vote
        order = np.lexsort((mean, -n, point))  # each point's best candidate first: the most views, the lowest error
        first = np.ones(len(order), bool)
        first[1:] = point[order][1:] != point[order][:-1]
        best = order[first]
        chosen = np.zeros((c, t), bool)
        chosen[:, point[best]] = inliers[:, best]
        dropped = np.zeros((c, t), bool)
        fit = self.fit(chosen, rows, strict)
        for _ in range(2 * c):  # each round drops one view of some points, or lets agreeing views join
            size = chosen.sum(axis=0)
            drop = np.flatnonzero(np.any(chosen & ~fit.agree, axis=0) & (size > 2))
            if drop.size:
                worst = self._worst(fit, rows, drop)
                chosen[worst, drop] = False
                dropped[worst, drop] = True
                changed = drop
            else:
                join = offered & ~chosen & ~dropped & fit.front & (fit.errors <= limit) & fit.solvable & (size >= 2)
                if strict is not None:
                    join &= ~strict
                changed = np.flatnonzero(join.any(axis=0))
                if not changed.size:
                    break
                chosen |= join
            # only the points whose sets changed are solved again
            fit.put(changed, self.fit(chosen[:, changed], rows[changed],
                                      None if strict is None else strict[:, changed]))
        return fit

    def _worst(self, fit: _Fit, rows: np.ndarray, drop: np.ndarray) -> np.ndarray:
        """The view to drop from each set ``drop`` (indices into ``rows``): of four or more views, the
        one without which the others agree best (the least sum of squared errors against their own
        point); of three, the one the other two place the most unexpectedly far (removing any one of
        three leaves a pair, and a pair always agrees)."""
        c, d = self.c, len(drop)
        sets = fit.chosen[:, drop]  # (C, D)
        # every view's left-out point in every camera, in one projection: (camera, left out, D)
        u, v, front = self.views.project_rows(fit.without[:, :, drop].swapaxes(0, 1).reshape(3, c * d))
        du = u.reshape(c, c, d) - self.u[:, rows[drop]][:, None]
        dv = v.reshape(c, c, d) - self.v[:, rows[drop]][:, None]
        squared = np.where(front.reshape(c, c, d), du * du + dv * dv, np.inf)
        others = sets[:, None, :] & ~np.eye(c, dtype=bool)[:, :, None]  # (camera, left out, D)
        rest = np.sum(np.where(others, squared, 0.0), axis=0)  # (C, D)
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
    p, c, k = scores.shape
    rows = np.empty((5, c, p, k))
    rows[:2], rows[2:4] = np.moveaxis(pixels, (3, 1), (0, 1)), np.moveaxis(normalised, (3, 1), (0, 1))
    rows[4] = np.moveaxis(scores, 1, 0)
    return triangulate_rows(cameras, rows, spec)


def triangulate_rows(cameras: Sequence[Camera] | CameraSet, rows: np.ndarray,
                     spec: Triangulation = Triangulation()) -> Points3D:
    """``triangulate`` of keypoints laid out as one row per view: rows (5, C, P, K) float64 of the
    pixels' u, v, the normalised x, y and the scores (what the world step stacks them as)."""
    views = cameras if isinstance(cameras, CameraSet) else CameraSet(cameras)
    _, c, p, k = rows.shape
    u, v, x, y, score = rows.reshape(5, c, p * k)  # (C, N) each: one column per point
    # one test of a sum for five: a sum is finite exactly when its terms are (float32 keypoints and
    # their undistortion cannot overflow a float64 sum)
    finite = np.isfinite(u + v + x + y + score)
    offered = score >= spec.min_score  # (C, N)
    if not finite.all():
        u, v, x, y, score = (np.where(finite, a, 0.0) for a in (u, v, x, y, score))
        offered &= finite
    weights = np.where(offered, score, 0.0)
    blocks = views.cached("view_blocks", lambda: normal_blocks(np.stack([c.extrinsic for c in views.cameras])))
    parts = view_normals(blocks, x, y, weights, _buffer(views, "parts", (9, c, p * k)))  # (9, C, N)
    solver = _Solver(views, parts, weights, u, v, offered, spec)
    # Every point from all its views (whole arrays: no gather, no scatter); the points whose views do
    # not all agree look for their consensus, a few at a time.
    fit = solver.fit(offered, first=True)
    count = offered.sum(axis=0)
    enough = count >= spec.min_views
    disagree = np.any(offered ^ fit.agree, axis=0)  # (the views that agree are offered ones)
    todo = np.flatnonzero(enough & (disagree | ~fit.solvable))
    if todo.size:
        fit.put(todo, solver.consensus(todo))
        valid = solver.valid(fit, angle=False)
    else:
        valid = enough & ~disagree & fit.solvable
    # Then the points of the views a person's other points caught wrong, with those views suspect.
    suspect = _suspects(offered, count, fit.chosen, valid, p, spec.suspect_share)  # (C, N)
    if suspect is not None:
        # (not the points where such a view is left out already, nor where the others check it as they would)
        doubt = suspect & fit.chosen & ~fit.sure
        rows = np.flatnonzero((suspect & fit.sure).any(axis=0))
        if rows.size:
            alone = ~solver.wide(fit.xyz[:, rows], fit.chosen[:, rows], without=True)  # (C, R)
            doubt[:, rows] |= suspect[:, rows] & fit.sure[:, rows] & alone
        again = np.flatnonzero(doubt.any(axis=0) & enough)
        if again.size:
            fit.put(again, solver.consensus(again, suspect))
            todo = np.union1d(todo, again)
    if todo.size:
        valid = solver.valid(fit, angle=False)
    valid &= solver.wide(fit.xyz, fit.chosen)
    valid = solver.within_bound(fit, valid)
    used = fit.chosen & valid
    count = used.sum(axis=0)
    rms = np.sqrt(np.sum(np.where(used, fit.errors, 0.0), axis=0) / np.maximum(count, 1))
    return Points3D(np.where(valid, fit.xyz, 0.0).T.reshape(p, k, 3).astype(np.float32), valid.reshape(p, k),
                    rms.reshape(p, k).astype(np.float32), count.reshape(p, k).astype(np.uint8),
                    used.reshape(c, p, k).swapaxes(0, 1))


def _buffer(views: CameraSet, name: str, shape: tuple[int, ...], dtype: type = np.float64) -> np.ndarray:
    """A contiguous array of ``shape`` kept with the CameraSet from step to step (its
    capacity grows): a fresh one each step (the normal equations: 355 kB at 4 persons x 4 cameras)
    made glibc give its heap back to the system at the end of the step and fault it in again at the
    next, some 120 page faults a step. A CameraSet is one world step's, used by one thread; what a
    buffer holds is used within the call that fills it."""
    kept = views.cached("buffers", dict)
    size = math.prod(shape)
    flat = kept.get(name)
    if flat is None or flat.size < size:
        kept[name] = flat = np.empty(max(size, 0 if flat is None else 2 * flat.size), dtype)
    return flat[:size].reshape(shape)


def _suspects(offered: np.ndarray, count: np.ndarray, used: np.ndarray, valid: np.ndarray, persons: int,
              share: float) -> np.ndarray | None:
    """(C, N): the views a point is offered by that are suspect for its person: outvoted on more than
    ``share`` of the person's valid points of three or more views (module docstring, step 4); None
    when no view is; ``count`` (N,) the views each point is offered by."""
    c, n = used.shape
    k = n // max(persons, 1)
    checkable = offered & (valid & (count >= 3))  # (C, N)
    outvoted = (checkable & ~used).reshape(c, persons, k).sum(axis=2)  # (C, P)
    suspect = outvoted > share * checkable.reshape(c, persons, k).sum(axis=2)
    if not suspect.any():
        return None
    return offered & np.repeat(suspect, k, axis=1)
