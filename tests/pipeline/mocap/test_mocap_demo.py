"""Motion capture without cameras, as a new user meets it: the README's walkthrough run as written
(``demo-rig`` -> ``calibrate`` -> ``triangulate`` -> TRC and CSV -> ``calibrate board``) as real
subprocesses, its results held against the demo's truth; the printable board read back by the
detector ``calibrate`` uses; the refusals."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from stages.mocap.camera import read_rig
from stages.mocap.charuco import Board, detect
from tests.cliutil import CLI, REPO, assert_one_clear_error, run_cli
from tests.pipeline.mocap.test_mocap_cli import read_trc

pytestmark = pytest.mark.timeout(600)
README = REPO / "README.md"


def walkthrough() -> list[list[str]]:
    """The commands of the README's block under "Try it without cameras", as argv lists."""
    text = README.read_text(encoding="utf-8")
    section = text.split("### Try it without cameras", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL).group(1)
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        argv = shlex.split(line, comments=True)
        if argv:
            commands.append(argv)
    return commands


def _world(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def take(offline_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """The README's walkthrough run as written in a fresh folder: (that folder, each command's stdout)."""
    folder = tmp_path_factory.mktemp("walkthrough")
    commands = walkthrough()
    assert [c[1] for c in commands] == ["demo-rig", "calibrate", "triangulate", "calibrate"], commands
    outputs = []
    for argv in commands:
        assert argv[0] == ".venv/bin/sapiens2-stream", argv
        ran = run_cli(argv[1:], offline_env, folder, timeout=400)
        assert ran.rc == 0, f"{shlex.join(argv)}\n{ran.stderr}"
        outputs.append(ran.stdout)
    return folder, outputs


def test_the_readme_walkthrough_runs_as_written_and_recovers_the_truth(take: tuple[Path, list[str]]) -> None:
    tmp_path, outputs = take
    rig_dir = tmp_path / "out" / "rig"
    # demo-rig tells what comes next: the same commands (as sapiens2-stream)
    assert "sapiens2-stream calibrate --source cam1=out/rig/board/cam1.mp4" in outputs[0], outputs[0]
    # the calibration: every camera under half a pixel, within about a centimetre of the truth
    for line in (line for line in outputs[1].splitlines() if line.startswith("cam")):
        assert float(line.split("reprojection error ")[1].split(" px")[0]) < 0.5, line
    got, truth = read_rig(rig_dir / "calib.toml"), read_rig(rig_dir / "truth.toml")
    assert got.names == truth.names == ["cam1", "cam2", "cam3", "cam4"]
    for name in truth.names:
        assert np.linalg.norm(got[name].centre - truth[name].centre) < 0.03, (name, got[name].centre)
        assert got[name].matrix[0, 0] == pytest.approx(truth[name].matrix[0, 0], rel=0.01)
    # the skeletons: millimetres from the truth, in the truth's world (the floor board's)
    world, real = _world(rig_dir / "world.jsonl"), _world(rig_dir / "truth.jsonl")
    assert len(world) == len(real) == 90 and all(len(r["persons"]) == 2 for r in world)
    errors = []
    for step, true in zip(world, real):
        people = [np.array(p["keypoints"], float) for p in true["persons"]]
        for person in step["persons"]:
            points = np.array([[np.nan] * 3 if v is None else v for v in person["keypoints"]], float)
            ok = np.isfinite(points[:, 0])
            assert ok.mean() > 0.95
            errors.append(min((np.linalg.norm(points[ok] - x[ok], axis=1) for x in people), key=np.median))
    e = np.concatenate(errors)
    assert np.median(e) < 0.006 and np.percentile(e, 95) < 0.015, (np.median(e), np.percentile(e, 95))
    # TRC: one file per person, Y up: the ankles near the floor, the nose some 1.6 m above it
    trcs = sorted(rig_dir.glob("walk_P*.trc"))
    assert [p.name for p in trcs] == ["walk_P0.trc", "walk_P1.trc"]
    for trc in trcs:
        header, rows = read_trc(trc)
        names = header[3][2::3]
        y = np.array([[float(v) if v else np.nan for v in row[3::3]] for row in rows])  # (T, K) the Y columns
        assert np.nanmedian(y[:, names.index("left_ankle")]) == pytest.approx(0.08, abs=0.02)
        assert np.nanmedian(y[:, names.index("nose")]) == pytest.approx(1.62, abs=0.05)
    assert (rig_dir / "walk.csv").read_text().count("\n") == 1 + 180
    # the board to print: A4, the board calibrate expects
    assert "wrote out/board.pdf (ChArUco board of 5x7 squares of 0.04 m" in outputs[3]
    assert (tmp_path / "out" / "board.pdf").read_bytes().startswith(b"%PDF")


DOC = REPO / "docs" / "MOCAP.md"


def _section(title: str) -> str:
    """The text of MOCAP.md's section ``## title`` (to the next ``## ``)."""
    return DOC.read_text(encoding="utf-8").split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def _tables(section: str) -> list[list[list[str]]]:
    """The Markdown tables of a section: each a list of rows, each a list of cells (header and rule left out)."""
    tables, rows = [], []
    for line in section.splitlines() + [""]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
        elif rows:
            tables.append([r for r in rows[2:]])
            rows = []
    return tables


def _names(table: list[list[str]]) -> set[str]:
    """The backticked names of a table's first column."""
    return {name for row in table for name in re.findall(r"`([^`]+)`", row[0])}


def _fenced(section: str, language: str) -> str:
    return re.search(rf"```{language}\n(.*?)```", section, re.DOTALL).group(1)


def test_the_documented_files_are_the_files_written(take: tuple[Path, list[str]], offline_env: dict[str, str]) -> None:
    """docs/MOCAP.md and what the commands write, field by field: the calibration file, the world
    JSONL (and its example), the TRC's header and markers, the CSV's columns, the NumPy keys with
    their dtypes and ranks, and every format's invalid points as its table says."""
    import tomllib

    from pipeline.mocap.world import world_record
    from stages.mocap.fuse import WorldFrame

    folder, _ = take
    rig_dir = folder / "out" / "rig"
    # calibration file
    section = _section("Calibration file")
    camera_keys, meta_keys = (_names(t) for t in _tables(section))
    written = tomllib.loads((rig_dir / "calib.toml").read_text())
    for name in (k for k in written if k != "metadata"):
        assert set(written[name]) == camera_keys, name
    assert set(written["metadata"]) == meta_keys
    example = tomllib.loads(_fenced(section, "toml"))
    assert set(example["cam_01"]) == camera_keys and set(example["metadata"]) == meta_keys
    # world JSONL
    section = _section("World JSONL")
    step_keys, person_keys, single_keys = (_names(t) for t in _tables(section))
    world = _world(rig_dir / "world.jsonl")
    assert all(set(r) == step_keys and all(set(p) == person_keys for p in r["persons"]) for r in world)
    frame = WorldFrame(0, 0, 0.0, ["a", "b"], {"a": 0}, np.zeros((0, 3, 3), np.float32), np.zeros((0, 3), bool),
                       np.zeros((0, 3), np.float32), np.zeros((0, 3), np.uint8), np.zeros(0, np.int64),
                       np.zeros((0, 2), np.int32), np.array([[1, 2]], np.int32))
    assert [set(entry) for entry in world_record(frame)["single_view"]] == [single_keys]
    example = json.loads(_fenced(section, "json"))
    assert set(example) == step_keys and set(example["persons"][0]) == person_keys
    assert set(example["single_view"][0]) == single_keys
    # TRC
    section = _section("TRC")
    header, rows = read_trc(rig_dir / "walk_P0.trc")
    shown = _fenced(section, "text").splitlines()
    assert shown[0].split("\t")[:3] == header[0][:3] and shown[1].split("\t") == header[1]
    assert shown[3].split("\t")[:2] == header[3][:2] and shown[4].split("\t")[2:5] == header[4][2:5]
    markers = header[3][2::3]
    listed = re.findall(r"`(\w+)`", section.split("- **Markers**", 1)[1].split("- **Rows**", 1)[0])
    assert listed[:15] == markers[:15] and len(markers) == 308
    for name, number in re.findall(r"`(\w+)` (?:is marker )?(\d+)", section):
        assert markers[int(number) - 1] == name
    # CSV
    section = _section("CSV")
    columns = _names(_tables(section)[0])
    written = (rig_dir / "walk.csv").read_text().splitlines()
    head = written[0].split(",")
    assert head[:3] == ["step", "time_s", "person"] and {"step", "time_s", "person"} < columns
    assert head[3:] == [f"{n}_{axis}" for n in markers for axis in "xyz"]
    assert {"<name>_x", "<name>_y", "<name>_z"} < columns and _fenced(section, "text").startswith(",".join(head[:9]))
    # NumPy
    ran = run_cli(["export-world", "out/rig/world.jsonl", "--npz", "out/rig/walk.npz"], offline_env, folder)
    assert ran.rc == 0, ran.stderr
    arrays = np.load(rig_dir / "walk.npz")
    table = _tables(_section("NumPy"))[0]
    assert {row[0].strip("`") for row in table} == set(arrays.files)
    for key, dtype, shape, _ in table:
        array = arrays[key.strip("`")]
        assert (array.dtype.kind == "U") if dtype == "str" else (array.dtype == np.dtype(dtype)), key
        assert array.ndim == shape.count(",") + 1 - shape.endswith(",)"), (key, shape, array.shape)
    # invalid points, as "How an invalid point appears" says, in every file of one take
    invalid = [(s, p, k) for s, r in enumerate(world) for p, person in enumerate(r["persons"])
               for k, v in enumerate(person["keypoints"]) if v is None]
    assert invalid, "the take has no invalid point to look at"
    ids = list(arrays["ids"])
    csv_rows = {(int(r.split(",")[0]), int(r.split(",")[2])): r.split(",") for r in written[1:]}
    trc = {pid: read_trc(rig_dir / f"walk_P{pid}.trc")[1] for pid in ids}
    for s, p, k in invalid:
        person = world[s]["persons"][p]
        assert person["error_px"][k] is None and person["views"][k] == 0
        column = ids.index(person["id"])
        assert np.isnan(arrays["xyz"][s, column, k]).all() and not arrays["valid"][s, column, k]
        assert arrays["error_px"][s, column, k] == 0 and arrays["views"][s, column, k] == 0
        assert csv_rows[(world[s]["step"], person["id"])][3 + 3 * k: 6 + 3 * k] == ["", "", ""]
        assert trc[person["id"]][s][2 + 3 * k: 5 + 3 * k] == ["", "", ""]


def test_the_printable_board_is_the_board_calibrate_detects_at_true_size(offline_env: dict[str, str],
                                                                         tmp_path: Path) -> None:
    """A PNG at 300 dpi and a PDF whose page is the board's size: every inner corner found by the
    detector calibrate uses (also at a third of the resolution, as a camera sees a print), in its
    place; the PNG carries its dpi, the PDF's page is the board and margin in points."""
    board = Board(6, 8, 0.03, 0.022, "DICT_5X5_100")
    flags = ["--board", "6x8", "--square", "0.03", "--marker", "0.022", "--dictionary", "DICT_5X5_100"]
    ran = run_cli(["calibrate", "board", *flags, "--out", "board.png", "--margin", "0.01"], offline_env, tmp_path)
    assert ran.rc == 0, ran.stderr
    assert ran.stdout.startswith("wrote board.png (ChArUco board of 6x8 squares of 0.03 m, markers 0.022 m, "
                                 "DICT_5X5_100: 20.0 x 26.0 cm with its margin at 300 dpi)"), ran.stdout
    square = round(0.03 / 0.0254 * 300)  # whole pixels per square at 300 dpi, and the resolution that makes
    px_per_m = square / 0.03  # them 3 cm exactly
    with Image.open(tmp_path / "board.png") as png:
        assert png.size == (round(0.20 * px_per_m), round(0.26 * px_per_m))
        assert png.info["dpi"] == pytest.approx((px_per_m * 0.0254,) * 2, abs=0.01)
    image = cv2.imread(str(tmp_path / "board.png"), cv2.IMREAD_GRAYSCALE)
    found = detect(board, image)
    assert len(found) == 35  # (6 - 1) x (8 - 1) inner corners
    expected = (board.corners[found.ids, :2] + 0.01) * px_per_m - 0.5  # board frame -> pixel centres
    assert np.abs(found.corners - expected).max() < 1.0
    assert len(detect(board, cv2.resize(image, None, fx=1 / 3, fy=1 / 3, interpolation=cv2.INTER_AREA))) == 35
    ran = run_cli(["calibrate", "board", *flags, "--out", "board.pdf", "--margin", "0.01"], offline_env, tmp_path)
    assert ran.rc == 0, ran.stderr
    pdf = (tmp_path / "board.pdf").read_bytes()
    box = [float(v) for v in re.search(rb"/MediaBox\s*\[\s*([\d.\s]+)\]", pdf).group(1).split()]
    assert box[:2] == [0, 0] and box[2:] == pytest.approx([0.20 / 0.0254 * 72, 0.26 / 0.0254 * 72], abs=0.5)


@pytest.mark.parametrize("argv, needles", [
    (["calibrate", "board", "--board", "5x7", "--square", "0.04", "--marker", "0.03", "--out", "b.jpg"],
     ["b.jpg", ".png or a .pdf"]),
    (["calibrate", "board", "--board", "5by7", "--square", "0.04", "--marker", "0.03"], ["5by7", "COLUMNSxROWS"]),
    (["calibrate", "board", "--board", "5x7", "--square", "0.04", "--marker", "0.03", "--dpi", "20"],
     ["--dpi 20", "raise --dpi"]),
    (["calibrate", "board", "--board", "5x7", "--square", "0.04", "--marker", "0.03", "--out", "taken.pdf"],
     ["taken.pdf exists", "--overwrite"]),
    (["demo-rig", "taken"], ["taken already holds a take", "--overwrite"]),
    (["demo-rig", "taken.pdf"], ["taken.pdf is a file"]),
])
def test_bad_input_is_one_line(offline_env: dict[str, str], tmp_path: Path, argv: list[str], needles: list[str]) -> None:
    (tmp_path / "taken.pdf").write_bytes(b"%PDF-1.4 a board printed earlier")
    (tmp_path / "taken" / "keypoints").mkdir(parents=True)
    ran = run_cli(argv, offline_env, tmp_path)
    assert_one_clear_error(ran, *needles)
    assert (tmp_path / "taken.pdf").read_bytes() == b"%PDF-1.4 a board printed earlier"
    assert not list(tmp_path.glob("b.*")) and not (tmp_path / "taken" / "board").exists()


def test_the_cli_lists_the_board_and_the_demo() -> None:
    import subprocess

    out = subprocess.run([*CLI, "--help"], capture_output=True, text=True, timeout=60).stdout
    assert "calibrate-board" in out and "demo-rig" in out
