"""Weighted linear triangulation (DLT) of many points from many views, in closed form
(``stages.mocap.triangulate`` chooses the views)."""

from __future__ import annotations

import numpy as np

# OpenBLAS runs a GEMM of m x n x k over 262,144 on every core (interface/gemm.c): for products this
# small the other threads spin more than they help (8 persons x 8 cameras: twice the CPU time for the
# same wall time), and the cores belong to the pipeline. The product is made in chunks under that size.
_ONE_THREAD_MNK = 262_144
_NORMAL = [0, 1, 2, 5, 6, 10, 3, 7, 11]  # of a row-major 4x4 normal matrix: m00 m01 m02 m11 m12 m22 m03 m13 m23


def normal_blocks(extrinsics: np.ndarray) -> np.ndarray:
    """The constant part of every view's normal equations, (9, 4C): the entries of the symmetric
    4x4 matrices that the 3x3 solve reads (see ``solve_dlt``)."""
    blocks = []
    for e in extrinsics:  # e: (3, 4) = [R | t]; rows r1, r2, r3
        r1, r2, r3 = e
        blocks += [np.outer(r3, r3), -(np.outer(r3, r1) + np.outer(r1, r3)), -(np.outer(r3, r2) + np.outer(r2, r3)),
                   np.outer(r1, r1) + np.outer(r2, r2)]
    c = len(extrinsics)
    full = np.stack(blocks).reshape(c, 4, 16).transpose(1, 0, 2).reshape(4 * c, 16)
    return np.ascontiguousarray(full[:, _NORMAL].T)


def solve_dlt(blocks: np.ndarray, normalised: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weighted linear triangulation. blocks: ``normal_blocks`` of the C views; normalised (N, C, 2);
    weights (N, C) -> points (N, 3) and whether each system was solvable (N,).

    Each view gives two equations (x P3 - P1) . [X, 1] = 0 and (y P3 - P2) . [X, 1] = 0, scaled by
    its weight w. Their normal matrix sum_c w^2 [(x r3 - r1)(x r3 - r1)^T + (y r3 - r2)(y r3 - r2)^T]
    is, per view, w^2 (x^2 + y^2) r3 r3^T - w^2 x (r3 r1^T + r1 r3^T) - w^2 y (r3 r2^T + r2 r3^T)
    + w^2 (r1 r1^T + r2 r2^T): four constant 4x4 matrices weighted by four numbers per point, so the
    entries every point's solve needs are a GEMM of (9, 4C) by (4C, N) (in chunks that OpenBLAS runs
    on one thread), one contiguous row per entry. Its 3x3 system is solved in closed form (the
    adjugate): no per-point LAPACK call."""
    w2 = weights * weights  # (N, C)
    x, y = normalised[..., 0], normalised[..., 1]  # (N, C)
    coefficients = np.concatenate([w2 * (x * x + y * y), w2 * x, w2 * y, w2], axis=1)  # (N, 4C)
    m = np.empty((len(blocks), len(coefficients)))
    step = max(1, _ONE_THREAD_MNK // (blocks.size or 1))
    for start in range(0, len(coefficients), step):
        np.matmul(blocks, coefficients[start:start + step].T, out=m[:, start:start + step])
    m00, m01, m02, m11, m12, m22, m03, m13, m23 = m  # (N,) each
    # the adjugate of the symmetric 3x3 part; the right-hand side is -(m03, m13, m23)
    c00, c01, c02 = m11 * m22 - m12 * m12, m02 * m12 - m01 * m22, m01 * m12 - m02 * m11
    c11, c12, c22 = m00 * m22 - m02 * m02, m01 * m02 - m00 * m12, m00 * m11 - m01 * m01
    det = m00 * c00 + m01 * c01 + m02 * c02
    scale = m00 + m11 + m22  # singular relative to the system's own size (trace^3)
    ok = np.abs(det) > 1e-12 * scale ** 3
    minus_inverse = np.where(ok, -1.0 / np.where(ok, det, 1.0), 0.0)
    points = np.empty((len(det), 3))
    points[:, 0] = (c00 * m03 + c01 * m13 + c02 * m23) * minus_inverse
    points[:, 1] = (c01 * m03 + c11 * m13 + c12 * m23) * minus_inverse
    points[:, 2] = (c02 * m03 + c12 * m13 + c22 * m23) * minus_inverse
    return points, ok
