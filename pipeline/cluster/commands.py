"""CLI commands of the cluster side: ``fleet``, ``batch`` and ``bridge``.

``add_parser(subparsers)`` registers them; each module imports Ray and Redis only when its
command runs, so the plain install's CLI works (and says what to install) without the extra.
"""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``fleet`` (fleet_cli), ``batch`` (archive) and ``bridge`` (streams)."""
    from . import archive, fleet_cli, streams

    fleet_cli.add_parser(subparsers)
    archive.add_parser(subparsers)
    streams.add_parser(subparsers)


def expand_shorthand(argv: list[str]) -> list[str]:
    """``fleet FLEET.yaml ...`` is ``fleet up FLEET.yaml ...``."""
    from .fleet_cli import fleet_argv

    return fleet_argv(argv)
