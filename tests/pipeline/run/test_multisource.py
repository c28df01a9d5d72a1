"""Many sources, one process, one batch: per-source outputs, failures of one source, fairness, the
batched forwards, and adding/removing sources of a running pipeline over its control endpoint."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.run.build import Stages
from pipeline.run.engine import FrameEngine
from pipeline.run.runner import Runner
from pipeline.sources import Source
from pipeline.sources.demo import SyntheticCamera
from stages.detect import FullFrameDetector
from stages.sapiens2 import load_model
from stages.sapiens2.estimators import estimator_for
from stages.sapiens2.tiny import make_tiny
from stages.types import Detections, Frame, StreamInfo
from tests.cliutil import (
    CLI,
    OFFLINE,
    assert_one_clear_error,
    decode_video,
    make_video,
    read_jsonl,
    run_cli,
    run_cli_cases,
)

pytestmark = pytest.mark.timeout(300)
POSE = ["--tasks", "pose", *OFFLINE]


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("clips")
    return {"a": make_video(folder / "a.mp4", n=24), "b": make_video(folder / "b.mp4", n=17, w=256, h=192)}


def test_two_files_two_recordings_two_keypoint_files_batched(tiny: Path, cli_env: dict[str, str], tmp_path: Path,
                                                            clips: dict[str, Path]) -> None:
    ran = run_cli(["--source", f"a={clips['a']}", "--source", f"b={clips['b']}", *POSE, "--record",
                   tmp_path / "out" / "{source}.mp4", "--save-keypoints", tmp_path / "out" / "{source}.jsonl"],
                  cli_env, tmp_path)
    assert ran.rc == 0, ran.stderr
    for name, frames, size in (("a", 24, (320, 240)), ("b", 17, (256, 192))):
        video = decode_video(tmp_path / "out" / f"{name}.mp4")
        assert video.count == frames and (video.width, video.height) == size
        records = read_jsonl(tmp_path / "out" / f"{name}.jsonl")
        assert [r["frame"] for r in records] == list(range(frames)) and "source" not in records[0]
    assert "2 sources in" in ran.stderr and "batched steps" in ran.stderr
    steps = int(ran.stderr.split(" batched steps")[0].split()[-1])
    assert steps < 24 + 17, "every step held one frame: nothing was batched"
    assert "  a: 24 frames" in ran.stderr and "  b: 17 frames" in ran.stderr  # the summary per source


def test_one_keypoint_file_for_several_sources_tags_each_line(tiny: Path, cli_env: dict[str, str], tmp_path: Path,
                                                             clips: dict[str, Path]) -> None:
    kp = tmp_path / "all.jsonl"
    ran = run_cli(["--source", str(clips["a"]), "--source", str(clips["b"]), *POSE, "--save-keypoints", kp],
                  cli_env, tmp_path)
    assert ran.rc == 0, ran.stderr
    records = read_jsonl(kp)
    by_source = {s: [r["frame"] for r in records if r["source"] == s] for s in ("cam0", "cam1")}  # unnamed: camN
    assert by_source == {"cam0": list(range(24)), "cam1": list(range(17))}


@pytest.mark.parametrize("damage", ["corrupt", "truncated"])
def test_a_bad_source_is_reported_and_the_others_finish(tiny: Path, cli_env: dict[str, str], tmp_path: Path,
                                                       clips: dict[str, Path], damage: str) -> None:
    bad = tmp_path / "bad.mp4"
    if damage == "corrupt":
        bad.write_bytes(b"\x00" * 5000)
    else:
        make_video(bad, n=30, faststart=True)
        data = bad.read_bytes()
        bad.write_bytes(data[: len(data) * 2 // 3])
    ran = run_cli(["--source", f"good={clips['a']}", "--source", f"bad={bad}", *POSE, "--save-keypoints",
                   tmp_path / "{source}.jsonl"], cli_env, tmp_path)
    last = assert_one_clear_error(ran, "1 of 2 sources failed", "bad")
    assert "good" not in last.split("failed:")[1]
    assert [r["frame"] for r in read_jsonl(tmp_path / "good.jsonl")] == list(range(24))  # completed
    if damage == "truncated":  # it opened and failed later: its own file says so last, with why
        last_line = read_jsonl(tmp_path / "bad.jsonl")[-1]
        assert last_line["event"] == "failed" and last_line["reason"]


def test_when_no_source_opens_the_run_is_one_line_before_any_model(cli_env: dict[str, str], tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / f"{name}.mp4").write_bytes(b"\x00" * 5000)  # there (preflight passes), but no video
    ran = run_cli(["--source", f"a={tmp_path / 'a.mp4'}", "--source", f"b={tmp_path / 'b.mp4'}", *POSE,
                   "--save-keypoints", tmp_path / "{source}.jsonl"], cli_env, tmp_path)
    assert_one_clear_error(ran, "none of the 2 sources opened", "a.mp4")
    assert "loaded " not in ran.stderr and not list(tmp_path.glob("*.jsonl"))


BAD_SOURCE_LISTS = [
    (["--source", "x=demo", "--source", "x=demo"], ["--source 'x=demo' and --source 'x=demo'", "both named 'x'"]),
    (["--source", "cam1=demo", "--source", "demo"], ["both named 'cam1'", "unnamed sources are cam0, cam1"]),
    (["--source", "=demo"], ["name is empty"]),
    (["--source", "a.b=demo"], ["source id 'a.b'", "letters, digits"]),  # not "no such file 'a.b=demo'"
    (["--source", "demo", "--source", "demo", "--record", "out.mp4"], ["{source}"]),
    (["--source", "demo", "--source", "demo", "--record", "out/{sourc}.mp4"], ["{sourc}", "not a placeholder"]),
    (["--source", "demo", "--source", "demo", "--source-id", "one"], ["--source-id", "NAME=SPEC"]),
]
BAD_SOURCES_ENTRIES = {
    "unknown key": ("  - {id: a, uri: demo}\n  - {id: b, uri: demo, fps: 30}\n", ["sources[1]", "fps"]),
    "stall timeout 0": ("  - {id: a, uri: demo, stall_timeout_s: 0}\n  - {id: b, uri: demo}\n",
                        ["sources[0]", "stall_timeout_s", "positive"]),
    "repeated id": ("  - {id: a, uri: demo}\n  - {id: a, uri: demo}\n", ["sources[0] and sources[1]", "both named 'a'"]),
    "empty": (" []\n", ["sources: the list is empty"]),  # not the default webcam
    "a plain entry": ("  - demo\n", ["sources[0]: expected a mapping with id and uri, got 'demo'"]),
    "not a list": (" demo\n", ["sources[0]: expected a mapping with id and uri, got 'demo'"]),
}


@pytest.fixture(scope="module")
def refusals(cli_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The runs of both lists below through the CLI's main in one interpreter, each in a folder of its own."""
    cases = {}
    for i, (args, _) in enumerate(BAD_SOURCE_LISTS):
        cases[i] = ([*args, *POSE], tmp_path_factory.mktemp("bad-sources"))
    for name, (entries, _) in BAD_SOURCES_ENTRIES.items():
        folder = tmp_path_factory.mktemp("bad-entries")
        config = folder / "cams.yaml"
        config.write_text("sources:" + ("\n" if entries.startswith("  - ") else "") + entries)
        cases[name] = (["--config", config, *POSE], folder)
    return run_cli_cases(cases, cli_env)


@pytest.mark.parametrize("case", range(len(BAD_SOURCE_LISTS)))
def test_bad_source_lists_are_one_line(refusals: dict, case: int) -> None:
    ran = refusals[case]
    assert_one_clear_error(ran, *BAD_SOURCE_LISTS[case][1])
    assert "loaded " not in ran.stderr


@pytest.mark.parametrize("case", list(BAD_SOURCES_ENTRIES))
def test_a_bad_sources_entry_is_one_line_naming_it(refusals: dict, case: str) -> None:
    ran = refusals[case]
    assert_one_clear_error(ran, "cams.yaml", *BAD_SOURCES_ENTRIES[case][1])
    assert "loaded " not in ran.stderr


def test_yaml_sources_with_their_own_settings(tiny: Path, cli_env: dict[str, str], tmp_path: Path,
                                              clips: dict[str, Path]) -> None:
    config = tmp_path / "cams.yaml"
    config.write_text(f"sources:\n  - {{id: door, uri: '{clips['a']}'}}\n"
                      f"  - {{id: hall, uri: '{clips['b']}', realtime: true, stall_timeout_s: 3}}\n")
    ran = run_cli(["--config", config, *POSE, "--save-keypoints", tmp_path / "{source}.jsonl"], cli_env, tmp_path)
    assert ran.rc == 0, ran.stderr
    assert len(read_jsonl(tmp_path / "door.jsonl")) == 24  # a file: every frame
    hall = read_jsonl(tmp_path / "hall.jsonl")
    assert 1 <= len(hall) <= 17  # realtime: paced and live, frames may be dropped


# -- the engine batches ----------------------------------------------------------------------
class People:
    random_weights = False

    def __init__(self) -> None:
        self.batches: list[int] = []

    def detect_batch(self, images: list[np.ndarray]) -> list[Detections]:
        self.batches.append(len(images))
        return [Detections(np.array([[4, 4, 40, 44], [20, 10, 60, 46]][: 1 + i % 2], np.float32),
                           np.ones(1 + i % 2, np.float32), np.arange(1 + i % 2)) for i in range(len(images))]


def test_one_forward_per_stage_for_a_whole_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    estimators = {task: estimator_for(task)(load_model(make_tiny(tmp_path / task, task, image_size=(64, 48)),
                                                    device="cpu")) for task in ("pose", "seg")}
    batches: dict[str, list[int]] = {"pose": [], "seg": []}
    for task, est in estimators.items():
        real = est.forward
        monkeypatch.setattr(est, "forward", lambda x, real=real, task=task: (batches[task].append(len(x)),
                                                                               real(x))[1])
    detector = People()
    engine = FrameEngine(Stages(torch.device("cpu"), detector, estimators))
    frames = [Frame(0, np.zeros((48 + 8 * i, 64, 3), np.uint8), 0, None, 0, f"cam{i}") for i in range(3)]
    results = engine.finish_batch(engine.submit_batch(frames), False)
    assert detector.batches == [3]  # one detector batch
    assert batches["seg"] == [3]  # one dense forward over the three frames (of different sizes)
    assert batches["pose"] == [4]  # one pose forward: 1 + 2 + 1 persons, padded to the bucket of 4
    assert [len(r.keypoints) for r in results] == [1, 2, 1]
    assert [r.seg.shape for r in results] == [(48, 64), (56, 64), (64, 64)]
    assert [r.frame.source_id for r in results] == ["cam0", "cam1", "cam2"]


class _FileLike:
    """A source of ``n`` frames, then ``end`` (SourceEnded or a SourceError); ``gate``, when given, holds
    it halfway until set."""

    frames_dropped = reopens = 0

    def __init__(self, sid: str, n: int, end: Exception, gate: threading.Event | None = None) -> None:
        self.source_id = self.health = sid
        self.info = StreamInfo(sid, 16, 16, 30.0, Fraction(1, 30), live=False)
        self.queue = [Frame(i, np.zeros((16, 16, 3), np.uint8), i, Fraction(1, 30), time.time_ns(), sid)
                      for i in range(n)]
        self.n, self.end, self.gate = n, end, gate

    def read(self, timeout: float):
        if not self.queue:
            raise self.end
        if self.gate is not None and len(self.queue) == self.n // 2:
            self.gate.wait(10)
        return self.queue.pop(0)

    def stop(self) -> None:
        pass


class _Collect:
    """A sink that keeps what it is handed: results, events, closed sources."""

    def __init__(self) -> None:
        self.results, self.calls = [], []

    def open(self, info) -> None:
        pass

    def write(self, result) -> None:
        self.results.append(result)

    def event(self, record) -> None:
        self.calls.append(("event", record))

    def close_source(self, source_id) -> None:
        self.calls.append(("close_source", source_id))

    def close(self) -> None:
        pass


def test_a_stalled_source_never_holds_the_others_up() -> None:
    """A camera that hangs keeps its slot empty; the file's frames go on being processed meanwhile."""
    from pipeline.sources import SourceEnded

    live = SyntheticCamera(fps=100.0)
    camera = Source(live.open, label="cam", source_id="cam", live=True, reconnect=True, stall_timeout_s=30.0)
    file = _FileLike("file", 60, SourceEnded("end"), gate=threading.Event())
    sink = _Collect()
    engine = FrameEngine(Stages(torch.device("cpu"), FullFrameDetector()))
    runner = Runner([camera.start(), file], engine, [sink], None, False)
    thread = threading.Thread(target=runner.run)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while sum(r.frame.source_id == "cam" for r in sink.results) < 5:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        live.stall()
        file.gate.set()
        while len([r for r in sink.results if r.frame.source_id == "file"]) < 60:
            assert time.monotonic() < deadline, "the file stopped while the camera hung"
            time.sleep(0.01)
    finally:
        runner.stop.set()
        live.resume()
        thread.join(30)
    assert [r.frame.index for r in sink.results if r.frame.source_id == "file"] == list(range(60))


def test_a_source_failing_mid_run_is_told_to_the_sinks_and_stays_down_in_metrics() -> None:
    """Its sinks hear ``failed`` with the reason, then ``closed``; source_up stays at 0 (an alert sees it), while
    the source that ended normally leaves the metrics."""
    from pipeline.metrics import PipelineMetrics, _gauge_values
    from pipeline.sinks.metrics import MetricsSink
    from pipeline.sources import SourceEnded, SourceError

    metrics = PipelineMetrics()
    sink = _Collect()
    sources = [_FileLike("good", 12, SourceEnded("end")), _FileLike("bad", 5, SourceError("packet 6 is garbage"))]
    runner = Runner(sources, FrameEngine(Stages(torch.device("cpu"), FullFrameDetector())),
                    [sink, MetricsSink(metrics)], None, False)
    stats = runner.run()
    assert stats.failed == {"bad": "packet 6 is garbage"}
    assert len([r for r in sink.results if r.frame.source_id == "good"]) == 12
    about_bad = [(call, arg) for call, arg in sink.calls
                 if (arg if isinstance(arg, str) else arg["source_id"]) == "bad"]
    assert [call for call, _ in about_bad] == ["event", "close_source"]
    assert about_bad[0][1]["event"] == "failed" and about_bad[0][1]["reason"] == "packet 6 is garbage"
    assert {labels["source"]: value for labels, value in _gauge_values(metrics.source_up)} == {"bad": 0.0}


def test_a_long_run_keeps_a_bounded_latency_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """The summary's figures come from the last LATENCY_WINDOW frames: a camera running for days does not
    grow the process by a list entry per frame."""
    import pipeline.run.sinkthread as runner_module
    from pipeline.sources import SourceEnded

    monkeypatch.setattr(runner_module, "LATENCY_WINDOW", 5)
    sources = [_FileLike("a", 20, SourceEnded("end")), _FileLike("b", 12, SourceEnded("end"))]
    stats = Runner(sources, FrameEngine(Stages(torch.device("cpu"), FullFrameDetector())), [_Collect()], None,
                   False).run()
    assert stats.frames == 32 and stats.batched_frames == 32 and stats.steps >= 20
    assert len(stats.latency_ms) == 5
    assert {sid: (per.rate.total, len(per.latency_ms)) for sid, per in stats.per_source.items()} == \
        {"a": (20, 5), "b": (12, 5)}


# -- adding and removing sources while running ------------------------------------------------
def _control(endpoint: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "control", "--endpoint", endpoint, *args], capture_output=True, text=True, timeout=90)


@pytest.mark.slow
def test_control_endpoint_adds_lists_and_removes_sources(tiny: Path, cli_env: dict[str, str], tmp_path: Path,
                                                        clips: dict[str, Path]) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    from pipeline.net.control import request

    # Two minutes paced as live at 10 fps, small: the live source is there to be joined and left, and a
    # 320x240 one at 30 fps kept a core busy for the whole test.
    long_clip = make_video(tmp_path / "long-input.mp4", n=1200, w=96, h=64, fps=10)
    extra_clip = make_video(tmp_path / "extra-input.mp4", n=40, w=64, h=48)
    pipeline = subprocess.Popen([*CLI, "--source", f"live={long_clip}", "--realtime", *POSE, "--control", endpoint,
                                 "--record", tmp_path / "{source}.mp4", "--save-keypoints", tmp_path / "all.jsonl"],
                                env=cli_env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:  # the endpoint answers once the models loaded (asked here: a CLI per try costs a second)
            try:
                request(endpoint, {"cmd": "list"}, timeout_s=2)
                break
            except TimeoutError:
                assert pipeline.poll() is None and time.monotonic() < deadline, pipeline.communicate()[1]
        listed = _control(endpoint, "list")
        assert listed.returncode == 0, listed.stderr
        assert [json.loads(x)["id"] for x in listed.stdout.splitlines()] == ["live"]
        added = _control(endpoint, "add", f"extra={extra_clip}", "--no-realtime")  # a file: every frame
        assert added.returncode == 0 and json.loads(added.stdout)["id"] == "extra", added.stderr
        twice = _control(endpoint, "add", f"live={clips['b']}")
        assert twice.returncode != 0 and "running already" in twice.stderr
        missing = _control(endpoint, "add", f"nope={tmp_path / 'missing.mp4'}")
        assert missing.returncode != 0 and "no such file" in missing.stderr
        while not (tmp_path / "all.jsonl").exists() or \
                (tmp_path / "all.jsonl").read_text().count('"source":"extra","frame"') < 40:
            assert time.monotonic() < deadline, "the added file did not run to its end"
            time.sleep(0.1)
        while not decode_ok(tmp_path / "extra.mp4"):  # a file that ended: its recording is final, the run goes on
            assert time.monotonic() < deadline, "the ended source's recording was not finalised while running"
            time.sleep(0.2)
        again = _control(endpoint, "add", f"extra={clips['b']}")  # would overwrite extra.mp4
        assert again.returncode != 0 and "ran earlier in this run" in again.stderr, again.stderr
        for bad, why in ((f"={clips['b']}", "name is empty"), (f"{'x' * 100}={clips['b']}", "1-64")):
            refused = _control(endpoint, "add", bad)
            assert refused.returncode != 0 and why in refused.stderr, refused.stderr
        for message, why in (({"stall_timeout_s": float("nan")}, "positive number"),  # json.dumps writes NaN
                             ({"stall_timeout_s": float("inf")}, "positive number"),
                             ({"bogus": 1}, "unknown key 'bogus'")):
            reply = request(endpoint, {"cmd": "add", "source": f"x={clips['b']}", **message})
            assert not reply["ok"] and why in reply["error"], reply
        assert _control(endpoint, "remove", "live").returncode == 0
        gone = _control(endpoint, "remove", "live")
        assert gone.returncode != 0 and "no running source named 'live'\n" in gone.stderr, gone.stderr
        deadline = time.monotonic() + 60
        while not decode_ok(tmp_path / "live.mp4"):  # its recording is finished when it is removed
            assert time.monotonic() < deadline, "the removed source's recording was not finalised"
            time.sleep(0.2)
    finally:
        pipeline.send_signal(signal.SIGINT)
        try:
            _, err = pipeline.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            pipeline.kill()
            raise
    assert pipeline.returncode == 0, err
    records = read_jsonl(tmp_path / "all.jsonl")
    extra = [r["frame"] for r in records if r.get("source") == "extra" and "frame" in r]
    assert extra == list(range(40))  # the added file: every frame, in order
    assert decode_video(tmp_path / "extra.mp4").count == 40
    # the summary covers the sources that joined and left, with their drops and reopens
    assert re.search(r"  extra: 40 frames, .*, 0 dropped, 0 reopens", err), err
    assert re.search(r"  live: \d+ frames, .*, \d+ dropped, 0 reopens", err), err
    assert f"wrote {tmp_path / 'extra.mp4'} (40 frames)" in err and f"wrote {tmp_path / 'live.mp4'}" in err, err


def decode_ok(path: Path) -> bool:
    """The recording is final: a standard MP4 (index at the front, no fragments left) that decodes."""
    try:
        data = path.read_bytes()
        return data[4:8] == b"ftyp" and b"moov" in data[:4096] and b"moof" not in data and \
            decode_video(path).count > 0
    except Exception:  # not there yet
        return False


def test_a_source_added_to_a_random_weight_run_is_labelled_so(tmp_path: Path) -> None:
    """Sources that join later (control endpoint, fleets) carry the random-weights label as the first ones do."""
    from types import SimpleNamespace

    from pipeline.sources import open_source

    source = open_source(str(make_video(tmp_path / "late.mp4", n=4, w=64, h=48)), source_id="late")
    runner = Runner([], SimpleNamespace(sources={}), [], None, random_weights=True)
    adder = threading.Thread(target=runner.add_source, args=(source,))
    adder.start()
    try:
        deadline = time.monotonic() + 30
        while adder.is_alive():  # the runner's loop applies the change; here its one step, by hand
            assert time.monotonic() < deadline, "the add was never answered"
            runner._apply_changes(worker=None)
            adder.join(0.05)
        assert runner.infos["late"].random_weights and source.info.random_weights
    finally:
        source.stop()
