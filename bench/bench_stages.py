"""Per-stage latency and throughput of our Sapiens2 stages vs the reference path, same run, same weights.

For pose (1/2/4 persons), segmentation, matting, normals and pointmaps (``--tasks``; the default is
pose, seg and matting), on one random frame:

* ours.device   preprocess + infer + postprocess on device tensors (the pipeline's path)
* ours.infer    the model forward alone, on prepared input
* ours.predict  numpy image in, numpy result out
* ref.model     ``Sapiens2For*`` forward alone, on the processor's pixel values
* ref.full      ``Sapiens2ImageProcessor`` (on the same device) + model + ``post_process_*``, results on host
* engine        all three stages through ``FrameEngine`` (submit + finish of one frame; 2 persons) vs the
                three reference paths in sequence; throughput of the engine with one frame in flight

The reference model is built at the chosen config with random init, saved with ``save_pretrained``
and loaded by our loader, so both paths run the same weights at the same precision (float32 on the
CPU, bfloat16 by default on CUDA). Warm-up is excluded; device-only rows use CUDA events on a GPU.

    .venv/bin/python -m bench.bench_stages --config medium --iters 10 [--tasks pose seg matting]
        [--tasks pose seg matting normal pointmap] [--persons 1 2 4] [--dtype bfloat16]
        [--frame 1080 1920] [--json out.json]
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from bench.harness import (
    Stats,
    add_common_args,
    dump_json,
    load_average,
    machine_info,
    measure_interleaved,
    table,
    wait_quiet,
)
from pipeline.run.build import Stages
from pipeline.run.engine import FrameEngine
from stages.device import resolve_device
from stages.sapiens2.estimators import estimator_for
from stages.types import Detections, Frame

REF_CLASS = {"pose": "Sapiens2ForPoseEstimation", "seg": "Sapiens2ForSemanticSegmentation",
             "matting": "Sapiens2ForImageMatting", "normal": "Sapiens2ForNormalEstimation",
             "pointmap": "Sapiens2ForPointmapEstimation"}
NUM_LABELS = {"pose": 308, "seg": 29, "matting": 4, "normal": 3, "pointmap": 3}
PADDED = ("normal", "pointmap")  # aspect kept, padded input (the reference processor's do_pad=True)


def _heads(pose: tuple[list[int], list[int]], dense_up: list[int], dense_conv: list[int],
           scale: tuple[list[int], list[int]]) -> dict[str, dict]:
    shuffle = dict(upsample_out_channels=dense_up, conv_out_channels=dense_conv, use_pixel_shuffle=True,
                   upsample_kernel_size=3, conv_kernel_size=3)
    return {
        "pose": dict(upsample_out_channels=pose[0], conv_out_channels=pose[1]),
        "seg": dict(upsample_out_channels=dense_up, conv_out_channels=dense_conv),
        "matting": shuffle,
        "normal": shuffle,
        "pointmap": dict(shuffle, scale_conv_out_channels=scale[0], scale_conv_kernel_size=3,
                         scale_final_hidden_sizes=scale[1]),
    }


# Backbone (transformers Sapiens2Config kwargs) and per-task heads of each benchmark config.
CONFIGS: dict[str, dict[str, Any]] = {
    "tiny": dict(arch=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                           num_key_value_attention_heads=2, num_first_full_attention_layers=1,
                           num_last_full_attention_layers=1, num_register_tokens=2, image_size=[256, 192]),
                 heads=_heads(([32, 32], [32, 32]), [32, 32, 16, 16], [16, 16], ([16, 16], [16, 8]))),
    "medium": dict(arch=dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=8, num_attention_heads=6,
                             num_key_value_attention_heads=3, num_first_full_attention_layers=2,
                             num_last_full_attention_layers=2, num_register_tokens=8, image_size=[512, 384]),
                   heads=_heads(([256, 256], [256, 256]), [256, 128, 64, 32], [32, 32], ([64, 32, 16], [64, 32]))),
    # The published 0.4B backbone and heads (matting is published only at 1B; this is its head on 0.4B;
    # the normal/pointmap heads are our loader's assumed layout, stages.sapiens2.config.default_head).
    "0.4b": dict(arch=dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                           num_key_value_attention_heads=8, num_first_full_attention_layers=8,
                           num_last_full_attention_layers=8, num_register_tokens=8, image_size=[1024, 768]),
                 heads=_heads(([768, 768], [768, 768]), [512, 256, 128, 64], [64, 64],
                              ([256, 128, 64], [128, 64]))),
}


class FixedDetector:
    """Returns the same boxes every frame: the bench measures Sapiens2 stages, not the detector."""

    random_weights = True

    def __init__(self, boxes: np.ndarray) -> None:
        n = len(boxes)
        self.detections = Detections(boxes, np.ones(n, np.float32), np.arange(n, dtype=np.int64))

    def detect(self, image_rgb: np.ndarray) -> Detections:
        return self.detections

    def detect_batch(self, images_rgb: list[np.ndarray]) -> list[Detections]:
        return [self.detections for _ in images_rgb]


def make_boxes(n: int, frame_hw: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """n person-like xyxy boxes (about 0.4 x 0.55 of the frame) inside the frame."""
    h, w = frame_hw
    bw, bh = 0.23 * w, 0.55 * h
    x1 = rng.uniform(0, w - bw, n)
    y1 = rng.uniform(0, h - bh, n)
    return np.stack([x1, y1, x1 + bw, y1 + bh], -1).astype(np.float32)  # (N, 4)


def build_pair(task: str, config: str, folder: Path, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """Reference model (random init) and our estimator loaded from its save_pretrained folder."""
    import transformers

    transformers.utils.logging.disable_progress_bar()
    spec = CONFIGS[config]
    torch.manual_seed(seed)
    cfg = transformers.Sapiens2Config(**spec["arch"], num_labels=NUM_LABELS[task], head_config=spec["heads"][task])
    cls = getattr(transformers, REF_CLASS[task])
    ref = None
    if device.type != "cpu":
        # Random init on the device: seconds instead of the ~15 s per 0.4B model it costs on the CPU.
        try:
            with torch.device(device):
                ref = cls(cfg)
        except (RuntimeError, TypeError, ValueError) as exc:
            print(f"  reference {task}: init on {device} failed ({type(exc).__name__}: {exc}); on the CPU", flush=True)
            ref = None
    ref = (ref if ref is not None else cls(cfg)).eval()
    ref.save_pretrained(folder)
    ours = estimator_for(task)(str(folder), device=device, dtype=dtype)
    ref = ref.to(device=device, dtype=dtype)
    return ref, ours


def to_host(tree: Any) -> Any:
    """Copy every tensor in a nested list/dict result to the host (the reference's results end on device)."""
    if isinstance(tree, torch.Tensor):
        return tree.cpu()
    if isinstance(tree, dict) or hasattr(tree, "items"):
        return {k: to_host(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [to_host(v) for v in tree]
    return tree


class Bench:
    def __init__(self, args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> None:
        self.args, self.device, self.dtype = args, device, dtype
        self.rows: list[dict[str, Any]] = []
        self.stats: dict[str, Stats] = {}
        self.busy_before: list[float | None] = []  # outside CPU load seen before each group (--wait-quiet)

    def run(self, fns: dict[str, Callable[[], object]], items: int = 1, wall: bool = False) -> None:
        """Time the paths interleaved (ours and the reference share any outside load alike).

        wall=True uses perf_counter even on CUDA (paths that end with results on the host).
        """
        if self.args.wait_quiet > 0:  # before every group: other jobs on a shared box come and go
            busy = wait_quiet(self.args.wait_quiet)
            self.busy_before.append(busy)
        with torch.inference_mode():
            stats = measure_interleaved(fns, self.args.iters, self.args.warmup, "cpu" if wall else self.device, items)
        for key, s in stats.items():
            self.stats[key] = s
            print(f"  {key:<28} p50 {s.p50:9.2f} ms  p95 {s.p95:9.2f} ms", flush=True)

    def row(self, stage: str, what: str, ours: str, ref: str | None) -> None:
        o = self.stats[ours]
        r = self.stats[ref] if ref else None
        self.rows.append({"stage": stage, "path": what, "ours p50": o.p50, "ours p95": o.p95,
                          "ours /s": o.throughput, "ref p50": r.p50 if r else None, "ref p95": r.p95 if r else None,
                          "ref /s": r.throughput if r else None, "ours/ref": o.p50 / r.p50 if r else None})


def bench_pose(b: Bench, ref, ours, proc, image: np.ndarray, rng: np.random.Generator) -> None:
    image_t = ours.image_tensor(image)
    for n in b.args.persons:
        boxes = make_boxes(n, image.shape[:2], rng)
        boxes_t = torch.as_tensor(boxes, device=b.device)
        xywh = [[[float(x1), float(y1), float(x2 - x1), float(y2 - y1)] for x1, y1, x2, y2 in boxes]]
        crops = ours.preprocess(image_t, boxes_t)
        pixels = proc(image, boxes=xywh, return_tensors="pt", device=b.device)["pixel_values"].to(b.dtype)

        def device_path() -> None:
            ours.postprocess(ours.infer(ours.preprocess(image_t, boxes_t), n), boxes_t)

        def reference() -> None:
            px = proc(image, boxes=xywh, return_tensors="pt", device=b.device)["pixel_values"].to(b.dtype)
            to_host(proc.post_process_pose_estimation(ref(px), boxes=xywh))

        tag = f"pose.b{n}"
        b.run({f"{tag}.ours.infer": lambda: ours.infer(crops, n), f"{tag}.ref.model": lambda: ref(pixels)}, n)
        b.run({f"{tag}.ours.device": device_path}, n)
        b.run({f"{tag}.ours.predict": lambda: ours.predict(image, boxes), f"{tag}.ref.full": reference}, n, wall=True)
        b.row(f"pose x{n}", "model", f"{tag}.ours.infer", f"{tag}.ref.model")
        b.row(f"pose x{n}", "device pre+model+post", f"{tag}.ours.device", None)
        b.row(f"pose x{n}", "image -> host result", f"{tag}.ours.predict", f"{tag}.ref.full")


@functools.lru_cache(maxsize=8)
def _padded_processor(height: int, width: int):
    from transformers import Sapiens2ImageProcessor

    return Sapiens2ImageProcessor(size={"height": height, "width": width}, do_pad=True)


def dense_processor(task: str, proc):
    """The reference processor for a full-frame task: normals and pointmaps keep the aspect and pad."""
    return _padded_processor(proc.size.height, proc.size.width) if task in PADDED else proc


def dense_reference(task: str, ref, proc, image: np.ndarray, device: torch.device, dtype: torch.dtype) -> Any:
    """The reference path of a full-frame task: processor + model + post-processing, results on the host."""
    hw = tuple(image.shape[:2])
    proc = dense_processor(task, proc)
    out = ref(proc(image, return_tensors="pt", device=device)["pixel_values"].to(dtype))
    if task == "seg":
        return to_host(proc.post_process_semantic_segmentation(out, target_sizes=[hw]))
    if task == "matting":
        return to_host(proc.post_process_image_matting(out, target_sizes=[hw]))
    if task == "normal":
        return to_host(proc.post_process_normal_estimation(out, source_sizes=[hw]))
    return to_host(proc.post_process_pointmap_estimation(out, source_sizes=[hw]))


def bench_dense(b: Bench, task: str, ref, ours, proc, image: np.ndarray) -> None:
    image_t = ours.image_tensor(image)
    hw = tuple(image.shape[:2])
    pixels_ours = ours.preprocess(image_t)
    pixels = dense_processor(task, proc)(image, return_tensors="pt", device=b.device)["pixel_values"].to(b.dtype)

    def device_path() -> None:
        ours.postprocess(ours.infer(ours.preprocess(image_t)), hw)

    def reference() -> None:
        dense_reference(task, ref, proc, image, b.device, b.dtype)

    b.run({f"{task}.ours.infer": lambda: ours.infer(pixels_ours), f"{task}.ref.model": lambda: ref(pixels)})
    b.run({f"{task}.ours.device": device_path})
    b.run({f"{task}.ours.predict": lambda: ours.predict(image), f"{task}.ref.full": reference}, wall=True)
    b.row(task, "model", f"{task}.ours.infer", f"{task}.ref.model")
    b.row(task, "device pre+model+post", f"{task}.ours.device", None)
    b.row(task, "image -> host result", f"{task}.ours.predict", f"{task}.ref.full")


def bench_engine(b: Bench, pairs: dict, proc, image: np.ndarray, rng: np.random.Generator) -> None:
    """All loaded stages through FrameEngine vs the reference paths one after another."""
    n = 2
    boxes = make_boxes(n, image.shape[:2], rng)
    xywh = [[[float(x1), float(y1), float(x2 - x1), float(y2 - y1)] for x1, y1, x2, y2 in boxes]]
    stages = Stages(b.device, FixedDetector(boxes), {t: ours for t, (_, ours) in pairs.items()}, True)
    engine = FrameEngine(stages, overlap=True)
    counter = iter(range(1 << 30))

    def frame() -> Frame:
        return Frame(next(counter), image, None, None, time.time_ns())

    def one() -> None:
        engine.finish(engine.submit(frame()), True)

    in_flight: list = []

    def pipelined() -> None:  # steady state of the runner: submit frame t, then finish frame t-1
        pending = engine.submit(frame())
        if in_flight:
            engine.finish(in_flight.pop(), True)
        in_flight.append(pending)

    def reference() -> None:
        for task, (ref, _) in pairs.items():
            if task == "pose":
                px = proc(image, boxes=xywh, return_tensors="pt", device=b.device)["pixel_values"].to(b.dtype)
                to_host(proc.post_process_pose_estimation(ref(px), boxes=xywh))
            else:
                dense_reference(task, ref, proc, image, b.device, b.dtype)

    label = "+".join(pairs)
    b.run({"engine.ours.latency": one, "engine.ref.sequential": reference}, wall=True)
    b.run({"engine.ours.pipelined": pipelined}, wall=True)
    if in_flight:
        engine.finish(in_flight.pop(), True)
    b.row(f"frame ({label}, pose x{n})", "latency, 1 frame", "engine.ours.latency", "engine.ref.sequential")
    b.row(f"frame ({label}, pose x{n})", "throughput, 1 in flight", "engine.ours.pipelined", "engine.ref.sequential")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", choices=sorted(CONFIGS), default="medium")
    ap.add_argument("--tasks", nargs="+", choices=sorted(REF_CLASS), default=["pose", "seg", "matting"])
    ap.add_argument("--persons", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: bf16 on CUDA, fp32 on CPU)")
    ap.add_argument("--frame", type=int, nargs=2, default=[1080, 1920], metavar=("H", "W"))
    add_common_args(ap, iters=10, warmup=2)
    ap.add_argument("--no-engine", action="store_true", help="skip the whole-frame FrameEngine row")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    from transformers import Sapiens2ImageProcessor

    h_in, w_in = CONFIGS[args.config]["arch"]["image_size"]
    proc = Sapiens2ImageProcessor(size={"height": h_in, "width": w_in})
    rng = np.random.default_rng(0)
    image = rng.integers(0, 255, (*args.frame, 3), dtype=np.uint8)
    b = Bench(args, device, dtype)
    head = (f"Sapiens2 stages, RANDOM weights, config {args.config} (D={CONFIGS[args.config]['arch']['hidden_size']} "
            f"L={CONFIGS[args.config]['arch']['num_hidden_layers']}, input {h_in}x{w_in}), frame "
            f"{args.frame[0]}x{args.frame[1]}, {device.type} {str(dtype).replace('torch.', '')}, "
            f"{torch.get_num_threads()} torch threads, torch {torch.__version__}, "
            f"iters {args.iters} (+{args.warmup} warm-up), ours and reference interleaved")
    print(head, flush=True)
    load_at_start = load_average()
    pairs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for task in args.tasks:
            ref, ours = build_pair(task, args.config, Path(tmp) / task, device, dtype)
            pairs[task] = (ref, ours)
            with torch.inference_mode():
                if task == "pose":
                    bench_pose(b, ref, ours, proc, image, rng)
                else:
                    bench_dense(b, task, ref, ours, proc, image)
        if not args.no_engine:
            with torch.inference_mode():
                bench_engine(b, pairs, proc, image, rng)
    load = (load_at_start, load_average())
    print()
    print(head)
    print(f"1-min load average at start / end: {load[0]} / {load[1]} (2 cores; above ~{torch.get_num_threads()} means "
          "other jobs shared the CPU)")
    print(table(b.rows))
    if b.busy_before:
        print("CPU busy with other work just before each group: "
              + ", ".join("?" if x is None else f"{x:.0%}" for x in b.busy_before))
    print("ours/ref < 1 means ours is faster; /s = items per second (persons for pose, frames otherwise)")
    if args.json:
        dump_json(args.json, {"header": head, "config": args.config, "arch": CONFIGS[args.config],
                              "device": str(device), "dtype": str(dtype), "frame": args.frame,
                              "iters": args.iters, "warmup": args.warmup, "machine": machine_info(device),
                              "load_average_1m": load,
                              "busy_before_groups": b.busy_before,
                              "rows": b.rows, "stats": b.stats})
    return 0


if __name__ == "__main__":
    sys.exit(main())
