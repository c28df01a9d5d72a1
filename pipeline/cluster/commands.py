"""CLI commands of the cluster side: ``fleet``, ``batch`` and ``bridge``.

``add_cluster_commands(subparsers)`` registers them; each module imports Ray and Redis only when
its command runs, so the plain install's CLI works (and says what to install) without the extra.
"""

from __future__ import annotations

import argparse


def add_cluster_commands(subparsers: argparse._SubParsersAction) -> None:
    from . import archive, fleet_cli, streams

    fleet_cli.add_parser(subparsers)
    archive.add_parser(subparsers)
    streams.add_parser(subparsers)
