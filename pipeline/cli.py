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
import typing
from typing import Any

from sapiens2_client.cli import OneLineParser

SUBCOMMANDS = ("run", "weights", "subscribe", "keys", "broker", "view", "control", "fleet", "batch", "bridge")
log = logging.getLogger("sapiens2_stream")


def _flag_type(parse):
    """argparse type from a config parser: its ValueError becomes argparse's one-line usage error."""
    def convert(text: str):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = parse.__name__.removeprefix("parse_")
    return convert


def add_run_args(p: argparse.ArgumentParser) -> None:
    """One flag per RunConfig field, generated from the field's type and metadata (see pipeline.config).

    Booleans get ``--x`` and ``--no-x``; dicts and lists of parsed items are repeatable; every flag
    defaults to None, so a flag left out overrides nothing in the YAML file.
    """
    from .config import FIELDS, HINTS

    p.add_argument("--config", help="YAML config file; flags override its values")
    for name, f in FIELDS.items():
        meta = f.metadata
        if not meta.get("cli", True):
            continue
        flag = "--" + (meta.get("flag") or name.replace("_", "-"))
        kwargs: dict[str, Any] = {"dest": name, "help": _with_default(meta.get("help") or "", f), "default": None}
        hint = HINTS[name]
        if hint is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            if meta.get("parse") is not None:
                kwargs["type"] = _flag_type(meta["parse"])
            elif hint in (int, float, int | None, float | None):
                kwargs["type"] = next(t for t in (int, float) if t in typing.get_args(hint) or t is hint)
            if meta.get("choices"):
                kwargs["choices"] = meta["choices"]
            else:
                kwargs["metavar"] = meta.get("metavar") or flag[2:].replace("-", "_").upper()
            if typing.get_origin(hint) is dict or meta.get("split") is False:
                kwargs["action"] = "append"
        p.add_argument(flag, **kwargs)


def _with_default(text: str, f: Any) -> str | None:
    """A flag's help with the field's default (the flags themselves default to None: see above)."""
    import dataclasses

    value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    if value is None or value == [] or value == {} or isinstance(value, bool) and not value:
        return text or None
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value) and "HxW" in \
            (f.metadata.get("metavar") or ""):
        shown = f"{value[0]}x{value[1]}"
    elif isinstance(value, list):
        shown = ",".join(map(str, value))
    elif isinstance(value, bool):
        shown = "on"
    else:
        shown = str(value)
    return f"{text} (default: {shown})".replace("%", "%%").strip()


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


def overrides_from(args: argparse.Namespace) -> dict[str, Any]:
    """The RunConfig keys given on the command line (repeatable KEY=VALUE flags collected into dicts)."""
    from .config import FIELDS, HINTS

    values = {k: v for k, v in vars(args).items() if k in FIELDS and v is not None}
    for key, value in values.items():
        if typing.get_origin(HINTS[key]) is dict:
            values[key] = dict(value)
    return values


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


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text


if __name__ == "__main__":
    sys.exit(main())
