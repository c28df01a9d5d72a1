"""Argument helpers the commands share: the run flags, generated from RunConfig's fields (``run`` and
``batch`` take them), the config they make with the YAML file, a failure as one line, and SIGTERM as
a Ctrl-C with the status of a terminated process.

Subcommand modules import these, never the entry point (pipeline.cli.main), so that command-line parsing
goes one way: the entry point assembles the commands, the commands use this module.
"""

from __future__ import annotations

import argparse
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for annotations: the helpers import pipeline.cli.config when they are called
    from pipeline.cli.config import RunConfig


class Terminated(KeyboardInterrupt):
    """SIGTERM: stopped as by Ctrl-C, with the exit status of a terminated process (the entry point
    prints ``error: terminated`` and exits 143)."""

    exit_code = 143


def raise_terminated(signum: int, frame: Any) -> None:
    """A SIGTERM handler: raise Terminated where the main thread is, as Ctrl-C raises KeyboardInterrupt."""
    raise Terminated("terminated")


def _flag_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """argparse type from a config parser: its ValueError becomes argparse's one-line usage error."""
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = parse.__name__.removeprefix("parse_")
    return convert


def add_run_args(p: argparse.ArgumentParser) -> None:
    """One flag per RunConfig field, generated from the field's type and metadata (see pipeline.cli.config).

    Booleans get ``--x`` and ``--no-x``; dicts and lists of parsed items are repeatable; every flag
    defaults to None, so a flag left out overrides nothing in the YAML file.
    """
    from pipeline.cli.config import FIELDS, HINTS

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


def overrides_from(args: argparse.Namespace) -> dict[str, Any]:
    """The RunConfig keys given on the command line (repeatable KEY=VALUE flags collected into dicts)."""
    from pipeline.cli.config import FIELDS, HINTS

    values = {k: v for k, v in vars(args).items() if k in FIELDS and v is not None}
    for key, value in values.items():
        if typing.get_origin(HINTS[key]) is dict:
            values[key] = dict(value)
    return values


def run_config(args: argparse.Namespace) -> RunConfig:
    """The RunConfig of a command's ``--config`` file and run flags (a flag wins over the file)."""
    from pipeline.cli.config import load_config

    return load_config(args.config, overrides_from(args))


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text
