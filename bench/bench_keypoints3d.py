"""The 3D keypoint step (stages.keypoints3d.lift) on its own: its cost, and which sampling is steadier.

Cost: 8 persons x 308 keypoints sampled from a 1080p pointmap (1080 x 1920 x 3 float32) with a
1080p segmentation map deciding what is on a person, as the engine calls it (one frame), for the
bilinear sample (window 1) and the median of 3x3, 5x5 windows; p50/p95 per call. On CUDA the
time is device time (CUDA events) and the target is 1 ms for 8 persons; on the CPU it is reported.

Steadiness (synthetic: there are no real weights offline): a clip of a person-shaped surface that
moves smoothly in front of the camera, rendered as a pointmap with what real predictions have:
per-pixel noise, sparse outliers and holes (NaN) along the silhouette; the 2D keypoints are the true
projections with pixel jitter. For each window it reports the error against the true 3D points
(RMS, and p95) and the frame-to-frame jitter (RMS of the second difference of each trajectory,
which a still or smoothly moving point keeps near zero).

    .venv/bin/python -m bench.bench_keypoints3d [--device cuda] [--iters 200] [--json out.json]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from bench.harness import add_common_args, dump_json, machine_info, measure, table, wait_quiet
from stages.device import resolve_device
from stages.keypoints3d import Lift, lift

K = 308


def cost(device: torch.device, persons: int, windows: list[int], iters: int, warmup: int,
         height: int = 1080, width: int = 1920) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    points = (torch.randn(height, width, 3, generator=g) + torch.tensor([0.0, 0.0, 3.0])).to(device)
    seg = (torch.rand(height, width, generator=g) > 0.3).to(torch.uint8).to(device)
    xy = (torch.rand(persons, K, 2, generator=g) * torch.tensor([width - 1.0, height - 1.0])).to(device)
    scores = torch.rand(persons, K, generator=g).to(device)
    rows = []
    for window in windows:
        rule = Lift(window=window, threshold=0.3)
        stats = measure(lambda: lift(points, xy, scores, rule, seg=seg), iters=iters, warmup=warmup, device=device)
        rows.append({"window": window, "persons": persons, "p50_ms": stats.p50, "p95_ms": stats.p95,
                     "mean_ms": stats.mean})
    return rows


def _clip(frames: int, height: int, width: int, seed: int = 0):
    """Yield (noisy pointmap (H, W, 3), seg (H, W), jittered xy (1, K, 2), true xyz (1, K, 3)) per frame.

    The person is a smooth surface (depth 3 m with a bump) whose pixels project with focal f; it
    sways sideways and back and forth. Noise: 1 cm per pixel, 0.5% outliers of +-0.4 m, holes in
    a band along the silhouette edge; keypoints jitter by 1 px (sd).
    """
    rng = np.random.default_rng(seed)
    f = 1.2 * width
    cx, cy = width / 2, height / 2
    angle, radius = rng.uniform(0, 2 * np.pi, K), np.sqrt(rng.uniform(0, 1, K))  # uniform over the ellipse
    anchors = np.stack([0.3 * radius * np.cos(angle), 0.9 * radius * np.sin(angle)], -1)  # on the body, metres
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float64)
    for t in range(frames):
        ox, oz = 0.3 * np.sin(t / 15.0), 3.0 + 0.2 * np.sin(t / 23.0)
        def body(u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            """The body's surface seen at pixels (u, v): its point (..., 3), and whether it covers them."""
            bx, by = (u - cx) * oz / f - ox, (v - cy) * oz / f  # an ellipse around (ox, 0) at depth oz
            r2 = (bx / 0.3) ** 2 + (by / 0.9) ** 2
            depth = oz - 0.15 * np.sqrt(np.clip(1 - r2, 0, 1))  # with a bump towards the camera
            return np.stack([(u - cx) * depth / f, (v - cy) * depth / f, depth], -1), r2 <= 1.0

        surface, inside = body(xs, ys)
        wall = np.stack([(xs - cx) * 6.0 / f, (ys - cy) * 6.0 / f, np.full_like(xs, 6.0)], -1)  # behind, at 6 m
        truth = np.where(inside[..., None], surface, wall)
        bx, by = (xs - cx) * oz / f - ox, (ys - cy) * oz / f
        noisy = truth + rng.normal(0, 0.01, truth.shape)
        wild = rng.random((height, width)) < 0.005
        noisy[wild] += rng.choice([-0.4, 0.4], (int(wild.sum()), 1))
        edge = inside & ~((bx / 0.27) ** 2 + (by / 0.87) ** 2 <= 1.0)
        noisy[edge & (rng.random((height, width)) < 0.3)] = np.nan
        # keypoints: anchors on the body (some at its edge, as hands and elbows are), projected, then
        # jittered; the truth is the body's own surface point at the true pixel
        u = f * (anchors[:, 0] + ox) / oz + cx
        v = f * anchors[:, 1] / oz + cy
        true_xyz = body(u, v)[0][None].astype(np.float32)  # (1, K, 3)
        xy = np.stack([u, v], -1)[None] + rng.normal(0, 1.0, (1, K, 2))
        yield noisy.astype(np.float32), inside.astype(np.uint8), xy.astype(np.float32), true_xyz


def steadiness(windows: list[int], frames: int, height: int, width: int) -> list[dict]:
    clip = list(_clip(frames, height, width))
    rows = []
    for window in windows:
        rule = Lift(window=window, threshold=0.0)
        track, valid_all, truth_all = [], [], []
        for points, seg, xy, truth in clip:
            xyz, valid, _, _ = lift(torch.from_numpy(points), torch.from_numpy(xy), torch.ones(1, K), rule,
                                    seg=torch.from_numpy(seg))
            track.append(xyz.numpy()[0])
            valid_all.append(valid.numpy()[0])
            truth_all.append(truth[0])
        xyz, ok, truth = np.stack(track), np.stack(valid_all), np.stack(truth_all)  # (T, K, 3), (T, K)
        err = np.linalg.norm(xyz - truth, axis=-1)[ok]
        second = xyz[2:] - 2 * xyz[1:-1] + xyz[:-2]  # (T-2, K, 3)
        ok2 = ok[2:] & ok[1:-1] & ok[:-2]
        truth2 = truth[2:] - 2 * truth[1:-1] + truth[:-2]
        jitter = np.linalg.norm(second - truth2, axis=-1)[ok2]
        rows.append({"window": window, "valid_%": float(100.0 * ok.mean()),
                     "err_rms_cm": float(100 * np.sqrt((err**2).mean())),
                     "err_p95_cm": float(100 * np.percentile(err, 95)),
                     "jitter_rms_cm": float(100 * np.sqrt((jitter**2).mean()))})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(ap, iters=200, warmup=10)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--persons", type=int, default=8)
    ap.add_argument("--windows", type=int, nargs="+", default=[1, 3, 5])
    ap.add_argument("--frames", type=int, default=90, help="frames of the synthetic steadiness clip")
    ap.add_argument("--no-steadiness", action="store_true", help="only the cost (the device run)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.wait_quiet:
        wait_quiet(args.wait_quiet)
    device = resolve_device(args.device)
    out = {"machine": machine_info(device), "cost": cost(device, args.persons, args.windows, args.iters,
                                                         args.warmup)}
    print(f"3D step, {args.persons} persons x {K} keypoints, 1080p pointmap + seg, on {device}:")
    print(table(out["cost"], ["window", "persons", "p50_ms", "p95_ms", "mean_ms"], ".3f"))
    if device.type == "cuda":
        worst = max(r["p50_ms"] for r in out["cost"] if r["window"] == 1)
        print(f"target: under 1 ms for {args.persons} persons (window 1): {'met' if worst < 1.0 else 'MISSED'}")
    if not args.no_steadiness:
        out["steadiness"] = steadiness(args.windows, args.frames, 270, 480)
        print(f"\nsteadiness on a synthetic {args.frames}-frame clip (480x270, 1 cm noise, 0.5% outliers, edge holes, "
              "1 px keypoint jitter):")
        print(table(out["steadiness"], ["window", "valid_%", "err_rms_cm", "err_p95_cm", "jitter_rms_cm"], ".2f"))
    if args.json:
        dump_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
