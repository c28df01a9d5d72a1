"""``sapiens2-stream calibrate board``: the ChArUco board that ``calibrate`` expects, to print.

    sapiens2-stream calibrate board --board 5x7 --square 0.04 --marker 0.03 --out board.pdf

The same board flags as ``calibrate`` (squares, square and marker sides in metres, dictionary,
legacy layout) give the same board: OpenCV's picture of it, at true size for ``--dpi``, with a
white margin, in black and white. A PNG carries its resolution (print it at 100%); a PDF's page
is the board's size, so a printer at "actual size" prints it true. Printers scale a little: measure a printed square
and marker and give ``calibrate`` what you measured.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from sapiens2_client.cli import positive

from stages.errors import ConfigError

from pipeline.mocap.calibrate import add_board_flags, board_of

log = logging.getLogger(__name__)
INCH_M = 0.0254
A4_M = (0.210, 0.297)


def add_board_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``calibrate-board`` (``calibrate board`` on the command line: ``expand_shorthand``)."""
    p = subparsers.add_parser("calibrate-board", help="write the ChArUco board calibrate expects, to print (PNG or "
                                                      "PDF); also written 'calibrate board'")
    add_board_flags(p)
    p.add_argument("--out", default="board.pdf", help="the picture to write: .png or .pdf (default board.pdf)")
    p.add_argument("--dpi", type=positive(int), default=300, help="printer dots per inch (default 300)")
    p.add_argument("--margin", type=float, default=0.005, help="white margin around the squares, metres (default "
                                                               "0.005: a 5x7 board of 4 cm squares fits on A4)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.set_defaults(func=cmd_board)


def cmd_board(args: argparse.Namespace) -> int:
    """Write the board picture and say what it is."""
    import numpy as np
    from PIL import Image

    board = board_of(args)
    out = Path(args.out)
    kind = out.suffix.lower()
    if kind not in (".png", ".pdf"):
        raise ConfigError(f"--out {out}: write a .png or a .pdf")
    if out.exists() and not args.overwrite:
        raise ConfigError(f"--out {out} exists; pass --overwrite to replace it, or write elsewhere")
    if not out.parent.is_dir():
        raise ConfigError(f"--out {out}: the folder {out.parent} does not exist")
    margin = args.margin
    if margin < 0:
        raise ConfigError(f"--margin: must be 0 or more metres, got {margin:g}")
    per_square = round(board.square_m / INCH_M * args.dpi)  # whole pixels per square...
    if per_square < 40:
        raise ConfigError(f"--dpi {args.dpi}: a square of {board.square_m:g} m would be {per_square} px, too few "
                          "for its marker's bits; raise --dpi")
    dpi = per_square * INCH_M / board.square_m  # ...and the resolution that makes them exactly a square's side
    squares = board.image(per_square)  # (H, W) uint8
    picture = np.pad(squares, round(margin / INCH_M * dpi), constant_values=255)
    height_m, width_m = (n / dpi * INCH_M for n in picture.shape)
    image = Image.fromarray(picture).convert("1")  # black and white: lossless (CCITT in the PDF), no JPEG edges
    part = out.with_name(out.name + ".part")
    if kind == ".png":
        image.save(part, format="PNG", dpi=(dpi, dpi))
    else:
        image.save(part, format="PDF", resolution=dpi)
    part.replace(out)
    fits = any(width_m <= a + 1e-9 and height_m <= b + 1e-9 for a, b in (A4_M, A4_M[::-1]))
    page = "" if fits else "; larger than an A4 page: print it on a larger sheet or make the squares smaller"
    print(f"wrote {out} (ChArUco board of {board.describe()}: {100 * width_m:.1f} x {100 * height_m:.1f} cm with its "
          f"margin at {dpi:.0f} dpi{page}). Print it at 100% (actual size, no fit to page), glue it flat, measure a "
          "square and a marker and give calibrate those: --board "
          f"{board.squares_x}x{board.squares_y} --square MEASURED --marker MEASURED")
    return 0
