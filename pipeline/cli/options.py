"""Field helpers of the run configuration: ``option`` (a field with what its flag needs) and the
parsers of flag values. Apart from pipeline/cli/config.py so that other modules can declare config
fields (pipeline/mocap/options.py) without importing the config back."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from dataclasses import field
from typing import Any


def option(default: Any = dataclasses.MISSING, help: str = "", *, flag: str | None = None,
           choices: typing.Sequence[str] | None = None, parse: Callable[[str], Any] | None = None,
           metavar: str | None = None, cli: bool = True, factory: Callable[[], Any] | None = None,
           split: bool = True) -> Any:
    """A RunConfig field with what its command-line flag needs.

    flag: the flag's name without dashes (default: the key with ``-`` for ``_``); parse: turns the
    flag's text into the value (repeatable flags are collected by the field's type); cli=False:
    YAML only; split=False: a list whose items may hold commas (a string is one item), and whose
    flag is repeatable.
    """
    meta = {"help": help, "flag": flag, "choices": choices, "parse": parse, "metavar": metavar, "cli": cli,
            "split": split}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def parse_size(text: str) -> list[int]:
    """``1024x768`` -> [1024, 768] (height, width)."""
    try:
        h, w = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"expected HEIGHTxWIDTH like 1024x768, got {text!r}") from None
    return [h, w]


def parse_checkpoint(text: str) -> tuple[str, str]:
    """``pose=./my-ckpt`` -> ("pose", "./my-ckpt")."""
    task, sep, source = text.partition("=")
    if not sep or not task or not source:
        raise ValueError(f"expected TASK=SOURCE like pose=./my-ckpt, got {text!r}")
    return task, source


def parse_auto_bool(text: str) -> bool | str:
    """``auto`` (the device decides; stored as None), ``on``/``off`` -> True/False."""
    table = {"on": True, "true": True, "off": False, "false": False, "auto": "auto"}
    if text.lower() not in table:
        raise ValueError(f"expected auto, on or off, got {text!r}")
    return table[text.lower()]
