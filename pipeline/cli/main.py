"""``sapiens2-stream``: the entry point. It assembles the subcommands and defines none of them.

    sapiens2-stream --source webcam                      # run (default command)
    sapiens2-stream --config configs/full.yaml --record out.mp4
    sapiens2-stream subscribe --endpoint tcp://127.0.0.1:5555 --topic keypoints

Every module named in COMMAND_MODULES registers its subcommands with ``add_parser(subparsers)``
(handlers ``func(args) -> int``) and may define ``expand_shorthand(argv) -> argv`` for a short form of
its command line; command modules never import this one (how to add one: docs/ARCHITECTURE.md, "Where
to add"). User-facing failures print one ``error: ...`` line and exit non-zero.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from types import ModuleType

from pipeline.cli.args import one_line
from sapiens2_client.cli import OneLineParser

# The modules that register subcommands, in the order --help lists them (the registry).
COMMAND_MODULES = (
    "pipeline.cli.commands",  # run (the default), weights
    "pipeline.net.commands",  # subscribe, keys, broker, view, control
    "pipeline.cluster.commands",  # fleet, batch, bridge
    "pipeline.mocap.commands",  # calibrate, triangulate, export-world
)
DEFAULT_COMMAND = "run"  # what a command line that names no command runs
log = logging.getLogger("sapiens2_stream")


def command_modules() -> list[ModuleType]:
    """The registered command modules, imported (each keeps its own heavy imports inside its handlers)."""
    return [importlib.import_module(name) for name in COMMAND_MODULES]


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: every registered module's subcommands."""
    parser = OneLineParser(prog="sapiens2-stream", description="Real-time Sapiens2 video pipeline")
    sub = parser.add_subparsers(dest="command")
    for module in command_modules():
        module.add_parser(sub)
    return parser


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The top-level commands of ``parser`` by name."""
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def main(argv: list[str] | None = None) -> int:
    try:
        code = _main(argv)
    except KeyboardInterrupt:  # Ctrl-C while the command still imports or parses: one line, not a traceback
        print("error: interrupted", file=sys.stderr)
        code = 130
    compiled = sys.modules.get("stages.sapiens2.compiled")  # imported only where a command can compile
    if compiled is not None:
        compiled.leave(code)  # a compile under way: the process ends there, with this code
    return code


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Ultralytics' own INFO lines are not this run's (a fresh machine gets three, with an emoji, about the
    # settings file it makes on first import); set before it is imported: it reads this then.
    os.environ.setdefault("YOLO_VERBOSE", "False")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    for noisy in ("httpx", "huggingface_hub", "ultralytics"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    parser = build_parser()
    commands = subcommands(parser)
    if not argv or argv[0] not in commands and argv[0] not in ("-h", "--help"):
        argv = [DEFAULT_COMMAND, *argv]
    for module in command_modules():  # imported by build_parser already
        expand = getattr(module, "expand_shorthand", None)
        argv = expand(argv) if expand is not None else argv
    args, extra = parser.parse_known_args(argv)
    if extra:  # named by the command's own parser, whose --help lists its flags (argparse names the top one)
        commands.get(getattr(args, "command", None) or "", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if not hasattr(args, "func"):
        parser.print_help()
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
