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
import sys

from sapiens2_client.cli import OneLineParser

from . import commands
from .cliargs import one_line

SUBCOMMANDS = ("run", "weights", "subscribe", "keys", "broker", "view", "control", "fleet", "batch", "bridge")
log = logging.getLogger("sapiens2_stream")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="sapiens2-stream", description="Real-time Sapiens2 video pipeline")
    sub = parser.add_subparsers(dest="command")
    commands.add_parser(sub)
    from .net.commands import add_net_commands

    add_net_commands(sub)
    from .cluster.commands import add_cluster_commands

    add_cluster_commands(sub)
    return parser


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
