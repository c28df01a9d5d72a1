"""``sapiens2-stream``: run the pipeline, make tiny checkpoints, subscribe, make keys, run a broker.

    sapiens2-stream --source webcam                      # run (default command)
    sapiens2-stream --config configs/full.yaml --record out.mp4
    sapiens2-stream weights make-tiny DIR --task pose
    sapiens2-stream subscribe --endpoint tcp://127.0.0.1:5555 --topic keypoints

User-facing failures print one ``error: ...`` line and exit non-zero.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from typing import Any

SUBCOMMANDS = ("run", "weights", "subscribe", "keys", "broker")
log = logging.getLogger("sapiens2_stream")


def _size(text: str) -> list[int]:
    try:
        h, w = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected HEIGHTxWIDTH like 1024x768, got {text!r}") from None
    return [h, w]


def _checkpoint(text: str) -> tuple[str, str]:
    task, sep, source = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected TASK=SOURCE like pose=./my-ckpt, got {text!r}")
    return task, source


def _auto_bool(text: str) -> bool | str:
    value = {"on": True, "true": True, "off": False, "false": False, "auto": "auto"}.get(text.lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"expected auto, on or off, got {text!r}")
    return value


def add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML config file; flags override its values")
    a = p.add_argument
    a("--source", help="webcam, webcam:N, /dev/videoN, a video file, rtsp/http/udp URL, image, folder, glob, demo")
    a("--source-id", help="name of this stream in topics and files (default from the source)")
    a("--realtime", action="store_const", const=True, help="pace a file at its own frame rate (live policy)")
    a("--stall-timeout", dest="stall_timeout_s", type=float, help="seconds without frames before reopening")
    a("--max-frames", type=int, help="stop after this many frames")
    a("--tasks", help="comma list of pose,seg,matting,normal,pointmap")
    a("--model-size", choices=["0.4b", "0.8b", "1b", "5b"])
    a("--checkpoint", dest="checkpoints", action="append", type=_checkpoint, metavar="TASK=SOURCE",
      help="checkpoint folder, .safetensors file or hub id for a task (repeatable)")
    a("--fallback-tiny", action="store_const", const=True,
      help="when weights cannot be had, run tiny RANDOM-weight checkpoints (outputs meaningless)")
    a("--device", help="auto, cpu, cuda, cuda:N")
    a("--dtype", choices=["auto", "float32", "bfloat16", "float16"])
    a("--pose-input", type=_size, help="pose input HxW (multiple of 16), default 1024x768")
    a("--dense-input", type=_size, help="seg/matting/normal/pointmap input HxW")
    a("--flip-test", action="store_const", const=True, help="average with mirrored crops (2x pose cost)")
    a("--no-fuse-qkv", dest="fuse_qkv", action="store_const", const=False, help="keep q/k/v GEMMs separate")
    a("--attention", choices=["auto", "flash", "efficient", "cudnn", "math"],
      help="SDPA kernels for attention (default auto; CUDA-only choices fall back to auto elsewhere)")
    a("--channels-last", type=_auto_bool, metavar="{auto,on,off}",
      help="decode heads in channels_last memory format (auto: on for CUDA)")
    a("--compile", choices=["off", "default", "reduce-overhead", "max-autotune"],
      help="torch.compile the models (reduce-overhead: CUDA graphs); compiles at start-up, logged")
    a("--no-pose-buckets", dest="pose_buckets", action="store_const", const=False,
      help="run pose on exactly the person count instead of padding to batch buckets 1/2/4/8/16")
    a("--no-pinned-memory", dest="pinned_memory", action="store_const", const=False,
      help="copy frames and results through pageable memory (blocking) instead of pinned buffers")
    a("--detector", choices=["yolo", "full-frame"])
    a("--detector-model", help="YOLO weights (.pt) or architecture (.yaml, random weights)")
    a("--det-conf", type=float)
    a("--max-persons", type=int)
    a("--track", action="store_const", const=True, help="stable person ids (Ultralytics ByteTrack)")
    a("--detect-every", type=int, help="run the detector every N frames, carry boxes in between")
    a("--kpt-threshold", type=float)
    a("--smooth", action="store_const", const=True, help="One-Euro smoothing per track id")
    a("--record", help="write the annotated video here (.mp4)")
    a("--save-keypoints", help="write one JSON line per frame here (.jsonl)")
    a("--publish", help="ZeroMQ endpoint to publish on, e.g. tcp://127.0.0.1:5555")
    a("--curve-dir", help="CURVE keys folder from `sapiens2-stream keys` (encrypt + authenticate)")
    a("--jpeg-quality", type=int)
    a("--gpu-jpeg", dest="gpu_jpeg", action="store_const", const=True,
      help="JPEG-encode published frames on the GPU (nvJPEG) when CUDA is present, CPU otherwise")
    a("--no-gpu-jpeg", dest="gpu_jpeg", action="store_const", const=False)
    a("--record-codec", choices=["libx264", "h264", "mpeg4", "h264_nvenc", "hevc_nvenc"],
      help="recording encoder; *_nvenc use the GPU's encoder and fall back to libx264, then mpeg4")
    a("--matte-mode", choices=["composite", "replace"], help="how the matte puts people on the background")
    a("--matte-background", help="R,G,B colour or an image file behind the person (with matting)")
    a("--show", action="store_const", const=True, help="preview window")
    a("--no-progress", dest="progress", action="store_const", const=False)
    a("--log-level", choices=["debug", "info", "warning", "error"])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sapiens2-stream", description="Real-time Sapiens2 video pipeline")
    sub = parser.add_subparsers(dest="command")
    run = sub.add_parser("run", help="run the pipeline (default when no command is given)")
    add_run_args(run)
    run.set_defaults(func=cmd_run)
    weights = sub.add_parser("weights", help="checkpoint tools")
    wsub = weights.add_subparsers(dest="weights_command", required=True)
    tiny = wsub.add_parser("make-tiny", help="write a small random-init checkpoint in the published layout")
    tiny.add_argument("folder")
    tiny.add_argument("--task", required=True, choices=["pose", "seg", "matting", "normal", "pointmap"])
    tiny.add_argument("--seed", type=int, default=0)
    tiny.set_defaults(func=cmd_make_tiny)
    from .net.commands import add_net_commands

    add_net_commands(sub)
    return parser


def overrides_from(args: argparse.Namespace) -> dict[str, Any]:
    skip = {"config", "command", "func"}
    values = {k: v for k, v in vars(args).items() if k not in skip and v is not None}
    if "checkpoints" in values:
        values["checkpoints"] = dict(values["checkpoints"])
    return values


def cmd_make_tiny(args: argparse.Namespace) -> int:
    from stages.sapiens2.tiny import make_tiny

    folder = make_tiny(args.folder, args.task, seed=args.seed)
    print(f"wrote tiny RANDOM-WEIGHT {args.task} checkpoint to {folder} (for tests and offline runs)")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from .app import run_pipeline
    from .config import load_config

    cfg = load_config(args.config, overrides_from(args))
    logging.getLogger().setLevel(cfg.log_level.upper())
    stop = threading.Event()

    def request_stop(signum, _frame) -> None:
        if stop.is_set():
            raise KeyboardInterrupt  # second signal: stop waiting for a clean finish
        log.warning("%s received: finishing and closing outputs", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    return run_pipeline(cfg, stop)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help"):
        argv = ["run", *argv]
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    for noisy in ("httpx", "huggingface_hub", "ultralytics"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    args = build_parser().parse_args(argv)
    if not hasattr(args, "func"):
        build_parser().print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # every user-facing failure ends as one line
        log.debug("failure", exc_info=True)
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 1


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text


if __name__ == "__main__":
    sys.exit(main())
