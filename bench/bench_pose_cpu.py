"""Our pose path vs the reference path (transformers 5.23) on the same random medium-size model, CPU.

Both paths go image + boxes -> keypoints in image pixels: ours is ``PoseEstimator.predict``; the
reference is ``Sapiens2ImageProcessor`` + ``Sapiens2ForPoseEstimation`` + ``post_process_pose_estimation``.
Same weights (the reference model saved with ``save_pretrained`` and loaded by our loader), same
inputs, same precision, warm-up excluded, the two paths interleaved call by call so outside load
hits both alike. Prints a table and the ratio; ``--json`` writes all numbers. ``bench_stages.py``
is the fuller version (model-only rows, seg, matting, GPU).

    .venv/bin/python -m bench.bench_pose_cpu [--persons 1 2 4] [--iters 5] [--json out.json]
    .venv/bin/python -m bench.bench_pose_cpu --config tiny --persons 1 --iters 1   # a smoke run: seconds
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from bench.bench_stages import CONFIGS, build_pair
from bench.harness import add_common_args, dump_json, load_average, machine_info, measure_interleaved, table, wait_quiet


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--persons", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--config", choices=sorted(CONFIGS), default="medium", help="the random model's size")
    add_common_args(ap, iters=5, warmup=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import Sapiens2ImageProcessor

    spec = CONFIGS[args.config]
    h_in, w_in = spec["arch"]["image_size"]
    proc = Sapiens2ImageProcessor(size={"height": h_in, "width": w_in})
    rng = np.random.default_rng(0)
    image = rng.integers(0, 255, (720, 1280, 3), dtype=np.uint8)
    rows, stats = [], {}
    load0 = load_average()
    with tempfile.TemporaryDirectory() as tmp:
        ref, ours = build_pair("pose", args.config, Path(tmp), torch.device("cpu"), torch.float32)
        for n in args.persons:
            x1 = rng.uniform(0, 900, n)
            y1 = rng.uniform(0, 300, n)
            boxes = np.stack([x1, y1, x1 + 300, y1 + 400], -1).astype(np.float32)
            xywh = [[[float(a), float(b), float(c - a), float(d - b)] for a, b, c, d in boxes]]

            def reference() -> None:
                inputs = proc(image, boxes=xywh, return_tensors="pt")
                proc.post_process_pose_estimation(ref(inputs["pixel_values"]), boxes=xywh)

            if args.wait_quiet > 0:  # other jobs on a shared box come and go: wait before each group
                wait_quiet(args.wait_quiet)
            with torch.inference_mode():
                s = measure_interleaved({"ours": lambda: ours.predict(image, boxes), "reference": reference},
                                        args.iters, args.warmup, "cpu", items=n)
            stats[n] = s
            rows.append({"persons": n, "ours p50 ms": s["ours"].p50, "ours p95 ms": s["ours"].p95,
                         "reference p50 ms": s["reference"].p50, "reference p95 ms": s["reference"].p95,
                         "speed-up": f"{s['reference'].p50 / s['ours'].p50:.2f}x"})
    arch = spec["arch"]
    print(f"pose path, random {args.config} config (D={arch['hidden_size']} L={arch['num_hidden_layers']} "
          f"H={arch['num_attention_heads']}, {h_in}x{w_in} input), 1280x720 image, CPU float32, "
          f"{args.threads} threads, torch {torch.__version__}, {args.iters} iters (+{args.warmup} warm-up), "
          f"interleaved; 1-min load {load0} -> {load_average()} on {machine_info()['cpus']} cores")
    print(table(rows, floatfmt=".1f"))
    if args.json:
        dump_json(args.json, {"config": spec, "config_name": args.config, "rows": rows, "stats": stats,
                              "machine": machine_info()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
