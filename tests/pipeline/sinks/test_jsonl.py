"""KeypointWriter: one strict-JSON line per frame, flushed as written."""

from __future__ import annotations

import json
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from pipeline.sinks.jsonl import JsonlError, KeypointWriter
from stages.types import Detections, Frame, FrameResult, Keypoints, StreamInfo

pytestmark = pytest.mark.timeout(30)


def make_result(index: int, persons: int, *, with_pose: bool = True, random_weights: bool = False) -> FrameResult:
    image = np.zeros((720, 1280, 3), np.uint8)
    frame = Frame(index, image, 512 * index, Fraction(1, 15360), 1_700_000_000_000_000_000 + index)
    boxes = np.array([[10 + p, 20, 110 + p, 320] for p in range(persons)], np.float32).reshape(-1, 4)
    detections = Detections(boxes, np.full(persons, 0.9, np.float32), np.arange(persons) + 7)
    keypoints = None
    if with_pose:
        xy = np.random.default_rng(index).uniform(0, 700, (persons, 308, 2)).astype(np.float32)
        keypoints = Keypoints(xy, np.full((persons, 308), 0.5, np.float32))
    return FrameResult(frame, detections, keypoints, random_weights=random_weights)


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_one_line_per_frame_with_the_documented_fields(tmp_path: Path) -> None:
    path = tmp_path / "kp.jsonl"
    writer = KeypointWriter(path)
    writer.open(StreamInfo("cam0", 1280, 720, 30.0, Fraction(1, 15360), live=False, random_weights=True))
    results = [make_result(0, 2), make_result(1, 0), make_result(2, 1, with_pose=False)]
    for r in results:
        writer.write(r)
    writer.close()
    writer.close()  # idempotent
    lines = read_lines(path)
    assert [line["frame"] for line in lines] == [0, 1, 2]
    first = lines[0]
    assert set(first) == {"frame", "pts", "time_base", "capture_ns", "width", "height", "random_weights", "persons"}
    assert (first["pts"], first["time_base"], first["width"], first["height"]) == (0, "1/15360", 1280, 720)
    assert first["capture_ns"] == 1_700_000_000_000_000_000 and first["random_weights"] is True
    person = first["persons"][1]
    assert person["id"] == 8 and person["box"] == [11.0, 20.0, 111.0, 320.0] and person["score"] == 0.9
    assert len(person["keypoints"]) == 308 and all(len(k) == 3 for k in person["keypoints"])
    expected = results[0].keypoints.xy[1, 5]
    assert person["keypoints"][5] == pytest.approx([expected[0], expected[1], 0.5], abs=1e-3)
    assert lines[1]["persons"] == [] and lines[1]["pts"] == 512
    assert lines[2]["persons"][0]["keypoints"] is None


def test_non_finite_values_become_null_and_no_time_base(tmp_path: Path) -> None:
    result = make_result(0, 1)
    result.keypoints.xy[0, 3, 0] = np.nan
    result.keypoints.scores[0, 4] = np.inf
    result.frame.pts, result.frame.time_base = None, None
    path = tmp_path / "kp.jsonl"
    with_writer = KeypointWriter(path)
    with_writer.write(result)  # works without open() too
    with_writer.close()
    line = read_lines(path)[0]
    assert line["pts"] is None and line["time_base"] is None
    assert line["persons"][0]["keypoints"][3][0] is None and line["persons"][0]["keypoints"][4][2] is None


def test_lines_are_flushed_so_a_killed_process_leaves_parsable_output(tmp_path: Path) -> None:
    path = tmp_path / "kp.jsonl"
    script = f"""
import os, sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[3])!r})
from tests.pipeline.sinks.test_jsonl import make_result
from pipeline.sinks.jsonl import KeypointWriter
writer = KeypointWriter({str(path)!r})
for i in range(5):
    writer.write(make_result(i, 1))
os._exit(9)  # die without closing or flushing anything
"""
    proc = subprocess.run([sys.executable, "-c", script], timeout=60, capture_output=True, text=True)
    assert proc.returncode == 9, proc.stderr
    assert [line["frame"] for line in read_lines(path)] == [0, 1, 2, 3, 4]


def test_write_after_close_and_unwritable_path(tmp_path: Path) -> None:
    writer = KeypointWriter(tmp_path / "kp.jsonl")
    writer.close()
    with pytest.raises(JsonlError, match="after close"):
        writer.write(make_result(0, 0))
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(JsonlError, match="cannot create"):
        KeypointWriter(blocker / "kp.jsonl").open(StreamInfo("s", 1, 1, None, None, live=True))
