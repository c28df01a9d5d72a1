"""Our pose path vs the reference path (transformers 5.23) on the same random medium-size model, CPU.

Both paths go image + boxes -> keypoints in image pixels: ours is ``PoseEstimator.predict``; the
reference is ``Sapiens2ImageProcessor`` + ``Sapiens2ForPoseEstimation`` + ``post_process_pose_estimation``.
Same weights (the reference model saved with ``save_pretrained`` and loaded by our loader), same
inputs, same precision, warm-up excluded. Prints a table and the ratio; ``--json`` writes all numbers.

    .venv/bin/python bench/bench_pose_cpu.py [--persons 1 2 4] [--iters 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stages.sapiens2.estimators import PoseEstimator  # noqa: E402

MEDIUM = dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=8, num_attention_heads=6,
              num_key_value_attention_heads=3, num_first_full_attention_layers=2, num_last_full_attention_layers=2,
              num_register_tokens=8, image_size=[512, 384], num_labels=308,
              head_config=dict(upsample_out_channels=[256, 256], conv_out_channels=[256, 256]))


def timed(fn, iters: int, warmup: int = 2) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000.0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--persons", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--json", help="write the full numbers here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import transformers
    from transformers import Sapiens2ImageProcessor

    torch.manual_seed(0)
    ref = transformers.Sapiens2ForPoseEstimation(transformers.Sapiens2Config(**MEDIUM)).eval()
    proc = Sapiens2ImageProcessor(size={"height": 512, "width": 384})
    rng = np.random.default_rng(0)
    image = rng.integers(0, 255, (720, 1280, 3), dtype=np.uint8)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ref.save_pretrained(tmp)
        ours = PoseEstimator(tmp, device="cpu", dtype="float32")
        for n in args.persons:
            x1 = rng.uniform(0, 900, n)
            y1 = rng.uniform(0, 300, n)
            boxes = np.stack([x1, y1, x1 + 300, y1 + 400], -1).astype(np.float32)
            xywh = [[[float(a), float(b), float(c - a), float(d - b)] for a, b, c, d in boxes]]

            def reference() -> None:
                with torch.inference_mode():
                    inputs = proc(image, boxes=xywh, return_tensors="pt")
                    out = ref(inputs["pixel_values"])
                    proc.post_process_pose_estimation(out, boxes=xywh)

            t_ours = timed(lambda: ours.predict(image, boxes), args.iters)
            t_ref = timed(reference, args.iters)
            rows.append({"persons": n, "ours_ms": t_ours, "reference_ms": t_ref,
                         "ours_p50": statistics.median(t_ours), "reference_p50": statistics.median(t_ref)})
    print(f"pose path, random medium config (D=384 L=8 H=6, 512x384 input), CPU float32, "
          f"{args.threads} threads, torch {torch.__version__}")
    print(f"{'persons':>7} {'ours p50 ms':>12} {'reference p50 ms':>17} {'speed-up':>9}")
    for r in rows:
        print(f"{r['persons']:>7} {r['ours_p50']:>12.1f} {r['reference_p50']:>17.1f} "
              f"{r['reference_p50'] / r['ours_p50']:>8.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"config": MEDIUM, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
