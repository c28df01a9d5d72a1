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

from sapiens2_client.cli import OneLineParser

from .cliargs import add_run_args, one_line, overrides_from

SUBCOMMANDS = ("run", "weights", "subscribe", "keys", "broker", "view", "control", "fleet", "batch", "bridge")
log = logging.getLogger("sapiens2_stream")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="sapiens2-stream", description="Real-time Sapiens2 video pipeline")
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
    from .cluster.commands import add_cluster_commands

    add_cluster_commands(sub)
    return parser


def cmd_make_tiny(args: argparse.Namespace) -> int:
    from stages.sapiens2.tiny import make_tiny

    folder = make_tiny(args.folder, args.task, seed=args.seed)
    print(f"wrote tiny RANDOM-WEIGHT {args.task} checkpoint to {folder} (for tests and offline runs)")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from .config import load_config
    from .preflight import preflight, unused_settings

    cfg = load_config(args.config, overrides_from(args))
    logging.getLogger().setLevel(cfg.log_level.upper())
    preflight(cfg)  # before torch and the pipeline are imported: bad input costs half a second, not eight
    for note in unused_settings(cfg):
        log.warning(note)
    from .app import run_pipeline

    stop = threading.Event()

    def request_stop(signum, _frame) -> None:
        # Never abandon the shutdown: an interrupted encoder flush would leave a broken recording.
        # (Shutdown is bounded: every join has a timeout. SIGKILL still ends it at once, and even
        # then the recording keeps all but its last fragment.)
        if stop.is_set():
            log.warning("%s received again: still finishing the outputs, this takes a moment",
                        signal.Signals(signum).name)
            return
        log.warning("%s received: finishing and closing outputs", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    try:
        return run_pipeline(cfg, stop)
    finally:
        # The outputs are finished: a late signal (a held Ctrl-C) must not kill the exit with it.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C while the command still imports or parses: one line, not a traceback
        print("error: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help"):
        argv = ["run", *argv]
    from .cluster.fleet_cli import fleet_argv

    argv = fleet_argv(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    for noisy in ("httpx", "huggingface_hub", "ultralytics"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # named by the command's own parser, whose --help lists its flags (argparse names the top one)
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
        commands.get(getattr(args, "command", None) or "", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if not hasattr(args, "func"):
        build_parser().print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt as exc:  # Ctrl-C (130), or SIGTERM where a command turns it into this (143)
        print(f"error: {'terminated' if getattr(exc, 'exit_code', 130) == 143 else 'interrupted'}", file=sys.stderr)
        return getattr(exc, "exit_code", 130)
    except Exception as exc:  # every user-facing failure ends as one line
        log.debug("failure", exc_info=True)
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
