"""The pipeline's own commands: ``run`` (the default when no command is given) and ``weights``.

``add_parser(subparsers)`` registers them. The pipeline, torch and the models are imported only
when ``run`` has checked its input (preflight), so a bad flag costs half a second, not eight.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading

from pipeline.cli.args import add_run_args, overrides_from, run_config
from stages.tasks import TASKS

log = logging.getLogger("sapiens2_stream")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``run`` (one flag per RunConfig field) and ``weights make-tiny``."""
    run = subparsers.add_parser("run", help="run the pipeline (default when no command is given)")
    add_run_args(run)
    run.set_defaults(func=cmd_run)
    weights = subparsers.add_parser("weights", help="checkpoint tools")
    wsub = weights.add_subparsers(dest="weights_command", required=True)
    tiny = wsub.add_parser("make-tiny", help="write a small random-init checkpoint in the published layout")
    tiny.add_argument("folder")
    tiny.add_argument("--task", required=True, choices=list(TASKS))
    tiny.add_argument("--seed", type=int, default=0)
    tiny.set_defaults(func=cmd_make_tiny)


def cmd_make_tiny(args: argparse.Namespace) -> int:
    from stages.sapiens2.tiny import make_tiny

    folder = make_tiny(args.folder, args.task, seed=args.seed)
    print(f"wrote tiny RANDOM-WEIGHT {args.task} checkpoint to {folder} (for tests and offline runs)")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from pipeline.cli.config import ConfigError, blame_flags
    from pipeline.cli.preflight import check_run, unused_settings

    cfg = run_config(args)
    logging.getLogger().setLevel(cfg.log_level.upper())
    try:
        checked = check_run(cfg)  # before torch and the pipeline are imported: bad input costs half a second
    except ConfigError as exc:
        raise ConfigError(blame_flags(str(exc), overrides_from(args), args.config)) from None
    for note in unused_settings(cfg):
        log.warning(note)
    from pipeline.run.app import run_pipeline

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
        return run_pipeline(cfg, stop, checked)
    finally:
        # The outputs are finished: a late signal (a held Ctrl-C) must not kill the exit with it.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
