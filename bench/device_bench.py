"""One-call GPU benchmark: correctness in bf16/fp16, model speed vs the bf16 peak, our path vs the
reference, end-to-end pipeline FPS and capture-to-publish latency, overlap gain, peak memory.

Runs within ~8 minutes on one H200 (see bench/device_run.sh for the call that installs the carried
wheels first). ``--smoke`` runs the same phases on tiny configs on the CPU, so the script itself
is tested where no GPU is. Results: a markdown report on stdout and in OUT/device_bench.md, all
numbers in OUT/device_bench.json.

    python bench/device_bench.py --out $OUT            # on the GPU machine
    python bench/device_bench.py --smoke --out /tmp/x  # anywhere, tiny configs on the CPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import measure  # noqa: E402
from stages.sapiens2.config import variant  # noqa: E402
from stages.sapiens2.model import Sapiens2  # noqa: E402
from stages.sapiens2.tiny import random_init, tiny_config, write_checkpoint  # noqa: E402
from stages.sapiens2.weights import load_model  # noqa: E402

H200_BF16_DENSE_TFLOPS = 989.5  # spec sheet; a large bf16 GEMM measures ~790 on this machine
REPORT: list[str] = []
RESULTS: dict = {}


def say(line: str = "") -> None:
    print(line, flush=True)
    REPORT.append(line)


def cuda_ms(fn, iters: int, warmup: int) -> list[float]:
    """Per-call milliseconds (CUDA events on a GPU, wall clock on the CPU), warm-up excluded."""
    return measure(fn, iters, warmup, "cuda" if torch.cuda.is_available() else "cpu").samples_ms


def backbone_macs(cfg, h: int, w: int) -> float:
    """Multiply-accumulates of one backbone forward at h x w (projections, attention, MLP, patch embed)."""
    tokens = (h // cfg.patch_size) * (w // cfg.patch_size) + cfg.num_prefix_tokens
    d, hd = cfg.hidden_size, cfg.head_dim
    total = (h // cfg.patch_size) * (w // cfg.patch_size) * 3 * cfg.patch_size ** 2 * d
    for kv in cfg.num_key_value_heads_per_layer:
        total += tokens * (2 * d * d + 2 * d * kv * hd)  # q, o, k, v projections
        total += 2 * tokens * tokens * d  # QK^T and AV
        total += tokens * 3 * d * cfg.intermediate_size  # SwiGLU
    return float(total)


def make_checkpoints(root: Path, smoke: bool) -> dict[str, Path]:
    out = {}
    for task, size in (("pose", "0.4b"), ("seg", "0.4b"), ("matting", "1b")):
        cfg = tiny_config(task) if smoke else variant(task, size, fuse_qkv=False)
        t0 = time.perf_counter()
        model = random_init(Sapiens2(cfg), seed=1)
        out[task] = write_checkpoint(model, root / task)
        say(f"- wrote random {task} {'tiny' if smoke else size} checkpoint in {time.perf_counter() - t0:.1f} s")
        del model
    return out


def phase_correctness(ckpts: dict[str, Path], device: torch.device, size: tuple[int, int]) -> None:
    say("\n## Correctness on the device (vs float32 on the same device)\n")
    say("| task | dtype | rel. L2 error | max abs err / max abs | finite |")
    say("|---|---|---|---|---|")
    RESULTS["correctness"] = []
    gen = torch.Generator().manual_seed(0)
    for task in ("pose", "seg", "matting"):
        x = torch.randn(2, 3, *size, generator=gen).to(device)
        ref, _ = load_model(ckpts[task], device=device, dtype="float32")(x)
        ref = ref.float()
        for dtype in ("bfloat16", "float16"):
            model = load_model(ckpts[task], device=device, dtype=dtype)
            with torch.inference_mode():
                out, _ = model(x)
            out = out.float()
            finite = bool(torch.isfinite(out).all())
            rel = float((out - ref).norm() / ref.norm())
            mx = float((out - ref).abs().max() / ref.abs().max())
            RESULTS["correctness"].append(dict(task=task, dtype=dtype, rel_l2=rel, max_rel=mx, finite=finite))
            say(f"| {task} | {dtype} | {rel:.2e} | {mx:.2e} | {finite} |")
            del model
        del ref
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def phase_forward(ckpts: dict[str, Path], device: torch.device, size: tuple[int, int], iters: int) -> None:
    say("\n## Model forward, bf16 (CUDA events, warm-up excluded)\n")
    model = load_model(ckpts["pose"], device=device, dtype="bfloat16" if device.type == "cuda" else "float32")
    macs = backbone_macs(model.cfg, *size)
    say(f"backbone: {macs / 1e12:.2f} T MAC per {size[0]}x{size[1]} forward (issue's figure for 0.4B: 1.26 T)")
    say("\n| persons | backbone ms p50 | TFLOP/s | % of bf16 dense peak | full pose forward ms p50 |")
    say("|---|---|---|---|---|")
    RESULTS["forward"] = []
    for batch in (1, 2, 4, 8):
        x = torch.randn(batch, 3, *size, device=device)
        with torch.inference_mode():
            bb = cuda_ms(lambda: model.backbone.forward_features(x), iters, 3)
            full = cuda_ms(lambda: model(x), iters, 2)
        p50 = statistics.median(bb)
        tflops = 2 * macs * batch / (p50 / 1000) / 1e12
        row = dict(batch=batch, backbone_ms=bb, full_ms=full, tflops=tflops,
                   peak_fraction=tflops / H200_BF16_DENSE_TFLOPS)
        RESULTS["forward"].append(row)
        say(f"| {batch} | {p50:.2f} | {tflops:.0f} | {100 * row['peak_fraction']:.0f}% | {statistics.median(full):.2f} |")
    del model


def phase_reference(ckpts: dict[str, Path], device: torch.device, size: tuple[int, int], iters: int) -> None:
    """Image + boxes -> keypoints: our PoseEstimator vs transformers' processor + model + post-processing."""
    import transformers
    from transformers import Sapiens2ImageProcessor

    from stages.sapiens2.estimators import PoseEstimator

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    say(f"\n## Pose path vs the reference (transformers {transformers.__version__}), {dtype}\n")
    ref = transformers.Sapiens2ForPoseEstimation.from_pretrained(str(ckpts["pose"]), dtype=dtype).to(device).eval()
    proc = Sapiens2ImageProcessor(size={"height": size[0], "width": size[1]})
    ours = PoseEstimator(ckpts["pose"], device=device, dtype=dtype, input_size=size)
    image = np.random.default_rng(0).integers(0, 255, (1080, 1920, 3), dtype=np.uint8)
    image_t = torch.from_numpy(image).permute(2, 0, 1).to(device)
    say("| persons | ours ms p50 | reference ms p50 | speed-up |")
    say("|---|---|---|---|")
    RESULTS["reference"] = []
    for n in (1, 4, 8):
        boxes = np.array([[100 + 200 * i, 100, 300 + 200 * i, 900] for i in range(n)], np.float32)
        xywh = [[[float(a), float(b), float(c - a), float(d - b)] for a, b, c, d in boxes]]

        def reference() -> None:
            with torch.inference_mode():
                inputs = proc(image_t, boxes=xywh, return_tensors="pt", device=device)
                out = ref(inputs["pixel_values"].to(device, dtype))
                proc.post_process_pose_estimation(out, boxes=xywh)

        t_ours = cuda_ms(lambda: ours.predict(image, boxes), iters, 2)
        t_ref = cuda_ms(reference, iters, 2)
        r = dict(persons=n, ours_ms=t_ours, reference_ms=t_ref)
        RESULTS["reference"].append(r)
        o, f = statistics.median(t_ours), statistics.median(t_ref)
        say(f"| {n} | {o:.1f} | {f:.1f} | {f / o:.2f}x |")
    del ref, ours


class FixedBoxes:
    """Detector stand-in: N fixed person boxes (no YOLO weights on the device)."""

    random_weights = False

    def __init__(self, n: int, width: int, height: int) -> None:
        from stages.types import Detections

        step = width // (n + 1)
        boxes = np.array([[step * (i + 1) - 150, height * 0.1, step * (i + 1) + 150, height * 0.95]
                          for i in range(n)], np.float32)
        self.detections = Detections(boxes, np.full(n, 0.9, np.float32), np.arange(n))

    def detect(self, image: np.ndarray):
        return self.detections

    def carry(self, boxes) -> None:
        pass

    def reset(self) -> None:
        pass


class AlreadyOpen:
    """Sink wrapper for a publisher opened early (so a subscriber can join before frames flow)."""

    def __init__(self, sink) -> None:
        self.sink = sink

    def open(self, info) -> None:
        pass

    def write(self, result) -> None:
        self.sink.write(result)

    def close(self) -> None:
        self.sink.close()


def phase_pipeline(ckpts: dict[str, Path], device: torch.device, seconds: float, frame_size: tuple[int, int],
                   pose_size: tuple[int, int]) -> None:
    from pipeline.demo_source import SyntheticCamera
    from pipeline.engine import FrameEngine
    from pipeline.publisher import ZmqPublisher
    from pipeline.runner import Runner
    from pipeline.sources import Source
    from pipeline.stages_setup import Stages
    from pipeline.subscriber import ReceiveTimeout, Subscriber
    from stages.sapiens2.estimators import PoseEstimator, Segmenter

    say("\n## End to end: synthetic live 1080p camera -> pose+seg -> ZeroMQ publisher -> subscriber\n")
    say("| persons | overlap | FPS | capture->publish p50 ms | p95 ms | source drops | peak GPU GiB |")
    say("|---|---|---|---|---|---|---|")
    dtype = "bfloat16" if device.type == "cuda" else "float32"
    pose = PoseEstimator(ckpts["pose"], device=device, dtype=dtype, input_size=pose_size)
    seg = Segmenter(ckpts["seg"], device=device, dtype=dtype, input_size=pose_size)
    RESULTS["pipeline"] = []
    h, w = frame_size
    for persons, overlap in ((1, True), (1, False), (2, True), (4, True), (4, False)):
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        stages = Stages(device, FixedBoxes(persons, w, h), {"pose": pose, "seg": seg})
        camera = SyntheticCamera(width=w, height=h, fps=240.0)
        source = Source(camera.open, label="synthetic", source_id="bench", live=True)
        publisher = ZmqPublisher("tcp://127.0.0.1:*", sndhwm=64)
        latencies: list[float] = []
        stop = threading.Event()
        runner = Runner(source, FrameEngine(stages, overlap=overlap), [AlreadyOpen(publisher)], None, False, stop=stop,
                        pipelined=overlap)

        def listen() -> None:
            with Subscriber(publisher.endpoint, ["keypoints"]) as sub:
                while not stop.is_set():
                    try:
                        msg = sub.recv(timeout_s=0.2)
                    except ReceiveTimeout:
                        continue
                    latencies.append((time.time_ns() - msg.meta.capture_ns) / 1e6)

        listener = threading.Thread(target=listen, daemon=True)
        timer = threading.Timer(seconds, stop.set)
        source.open()
        publisher.open(source.info)  # bind now so the subscriber can join before frames flow
        listener.start()
        publisher.wait_for_subscriber("keypoints.bench", 5)
        timer.start()
        t0 = time.perf_counter()
        stats = runner.run()
        elapsed = time.perf_counter() - t0
        listener.join(2)
        if stats.error is not None:
            raise stats.error
        lat = latencies[len(latencies) // 10:]  # first 10% is warm-up
        row = dict(persons=persons, overlap=overlap, fps=stats.frames / elapsed,
                   p50_ms=float(np.percentile(lat, 50)) if lat else None,
                   p95_ms=float(np.percentile(lat, 95)) if lat else None, drops=source.frames_dropped,
                   peak_gib=torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else 0.0)
        RESULTS["pipeline"].append(row)
        say(f"| {persons} | {'yes' if overlap else 'no (serialised)'} | {row['fps']:.1f} | "
            f"{row['p50_ms'] or float('nan'):.1f} | {row['p95_ms'] or float('nan'):.1f} | {row['drops']} | "
            f"{row['peak_gib']:.2f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".", help="folder for device_bench.md / .json")
    ap.add_argument("--smoke", action="store_true", help="tiny configs on the CPU (tests the script)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=8.0, help="per end-to-end configuration")
    ap.add_argument("--phases", default="correctness,forward,reference,pipeline")
    args = ap.parse_args()
    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    size = (256, 192) if args.smoke else (1024, 768)
    frame = (240, 320) if args.smoke else (1080, 1920)
    iters = 3 if args.smoke else args.iters
    seconds = 3.0 if args.smoke else args.seconds
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU (smoke run)"
    say(f"# device_bench {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {name}, torch {torch.__version__}")
    phases = args.phases.split(",")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        ckpts = make_checkpoints(Path(tmp), args.smoke)
        if "correctness" in phases:
            phase_correctness(ckpts, device, size)
        if "forward" in phases:
            phase_forward(ckpts, device, size, iters)
        if "reference" in phases:
            phase_reference(ckpts, device, size, iters)
        if "pipeline" in phases:
            phase_pipeline(ckpts, device, seconds, frame, size)
    say(f"\ntotal {time.perf_counter() - started:.0f} s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "device_bench.md").write_text("\n".join(REPORT) + "\n")
    (out / "device_bench.json").write_text(json.dumps(RESULTS, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
