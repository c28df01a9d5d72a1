"""Weighted linear triangulation (DLT) of many points from many views, in closed form.

Each view c with weight w_c adds the equations w_c (x P3 - P1) X = 0 and w_c (y P3 - P2) X = 0
of its extrinsic P = [R | t] at the point's normalised image coordinates (x, y). Their normal
matrix w^2 [(x r3 - r1)(x r3 - r1)^T + (y r3 - r2)(y r3 - r2)^T] is w^2 (x^2 + y^2) r3 r3^T -
w^2 x (r3 r1^T + r1 r3^T) - w^2 y (r3 r2^T + r2 r3^T) + w^2 (r1 r1^T + r2 r2^T): four constant
4x4 matrices weighted by four numbers per point. So every view's part of every point's normal
equations is one GEMM (``view_normals``), any set of views is solved by adding their parts, and
the 3x3 system by its adjugate (``solve_normals``): no per-point LAPACK call. ``stages.mocap.
triangulate`` chooses the sets.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# OpenBLAS runs a GEMM of m x n x k over 262,144 on every core (interface/gemm.c): for products this
# small the other threads spin more than they help (8 persons x 8 cameras: twice the CPU time for the
# same wall time), and the cores belong to the pipeline. The product is made in chunks under that size.
_ONE_THREAD_MNK = 262_144
_NORMAL = [0, 1, 2, 5, 6, 10, 3, 7, 11]  # of a row-major 4x4 normal matrix: m00 m01 m02 m11 m12 m22 m03 m13 m23


def normal_blocks(extrinsics: np.ndarray) -> np.ndarray:
    """The constant part of every view's normal equations, (C, 9, 4): entry i (of the nine the 3x3
    solve reads: m00 m01 m02 m11 m12 m22 m03 m13 m23) of view c's j-th constant matrix."""
    blocks = []
    for e in extrinsics:  # e: (3, 4) = [R | t]; rows r1, r2, r3
        r1, r2, r3 = e
        parts = [np.outer(r3, r3), -(np.outer(r3, r1) + np.outer(r1, r3)), -(np.outer(r3, r2) + np.outer(r2, r3)),
                 np.outer(r1, r1) + np.outer(r2, r2)]
        blocks.append(np.stack([m.reshape(16)[_NORMAL] for m in parts], axis=1))  # (9, 4)
    return np.stack(blocks).reshape(len(extrinsics), 9, 4)


def view_normals(blocks: np.ndarray, x: np.ndarray, y: np.ndarray, weights: np.ndarray,
                 out: np.ndarray | None = None) -> np.ndarray:
    """Each view's part of every point's normal equations: blocks (``normal_blocks`` of the C views),
    normalised coordinates x, y and weights (C, N) -> (9, C, N) (into ``out`` when given), one row
    per entry and view: per view a GEMM of (9, 4) by (4, N), in chunks that OpenBLAS runs on one
    thread."""
    c, n = weights.shape
    w2 = weights * weights  # (C, N)
    coefficients = np.empty((c, 4, n))
    coefficients[:, 0], coefficients[:, 1], coefficients[:, 2], coefficients[:, 3] = w2 * (x * x + y * y), w2 * x, \
        w2 * y, w2
    m = np.empty((9, c, n)) if out is None else out
    by_view = m.transpose(1, 0, 2)  # (C, 9, N) view of the (9, C, N) result
    step = max(1, _ONE_THREAD_MNK // 36)
    for start in range(0, n, step):
        np.matmul(blocks, coefficients[:, :, start:start + step], out=by_view[:, :, start:start + step])
    return m


def _adjugate(m: np.ndarray) -> tuple[np.ndarray, ...]:
    """The symmetric 3x3 parts of normal equations (9, ...) -> their adjugate's six entries and det."""
    m00, m01, m02, m11, m12, m22 = m[:6]
    c00 = m11 * m22
    c00 -= m12 * m12
    c01 = m02 * m12
    c01 -= m01 * m22
    c02 = m01 * m12
    c02 -= m02 * m11
    c11 = m00 * m22
    c11 -= m02 * m02
    c12 = m01 * m02
    c12 -= m00 * m12
    c22 = m00 * m11
    c22 -= m01 * m01
    det = m00 * c00
    det += m01 * c01
    det += m02 * c02
    return c00, c01, c02, c11, c12, c22, det


def solve_normals(m: np.ndarray, trace: bool = False) -> tuple[np.ndarray, ...]:
    """Normal equations (9, ...) (``view_normals`` summed over a set of views) -> points (3, ...) and
    whether each system was solvable (...): not singular relative to its own size (trace^3); with
    ``trace``, also the trace of the inverse of each 3x3 part (...) (inf where not solvable): the
    point's variance, summed over its axes, per unit of its equations' noise variance."""
    c00, c01, c02, c11, c12, c22, det = _adjugate(m)
    m03, m13, m23 = m[6:]
    size = m[0] + m[3]
    size += m[5]
    cube = size * size
    cube *= size
    cube *= 1e-12
    ok = np.abs(det) > cube
    # the right-hand side is -(m03, m13, m23): each coordinate is -(row of the adjugate . rhs) / det
    minus_inverse = np.where(ok, det, 1.0)
    np.divide(-1.0, minus_inverse, out=minus_inverse)
    minus_inverse *= ok
    points = np.empty((3, *det.shape))
    for i, (a, b, c) in enumerate(((c00, c01, c02), (c01, c11, c12), (c02, c12, c22))):
        row = points[i]
        np.multiply(a, m03, out=row)
        row += b * m13
        row += c * m23
        row *= minus_inverse
    if not trace:
        return points, ok
    spread = c00 + c11
    spread += c22
    spread *= minus_inverse
    np.negative(spread, out=spread)
    spread[~(ok & (spread >= 0))] = np.inf
    return points, ok, spread


def inverse_form(m: np.ndarray, vectors: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> np.ndarray:
    """The sum of j A^-1 j^T over ``vectors`` j = (a, b, c) (each entry shaped like one of m) for the
    3x3 parts A of normal equations m (9, ...); inf where A is not positive definite."""
    c00, c01, c02, c11, c12, c22, det = _adjugate(m)
    form = sum(a * (c00 * a + 2 * (c01 * b + c02 * c)) + b * (c11 * b + 2 * c12 * c) + c22 * c * c
               for a, b, c in vectors)
    return np.where(det > 0, form / np.where(det > 0, det, 1.0), np.inf)


def solve_dlt(blocks: np.ndarray, normalised: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weighted linear triangulation of every point from all its views: normalised (N, C, 2), weights
    (N, C) -> points (N, 3) and whether each system was solvable (N,)."""
    x, y = normalised[..., 0].T, normalised[..., 1].T  # (C, N)
    points, ok = solve_normals(view_normals(blocks, x, y, weights.T).sum(axis=1))
    return points.T, ok
