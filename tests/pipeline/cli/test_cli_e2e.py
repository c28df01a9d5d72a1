"""End to end: the ``sapiens2-stream`` console script as a real subprocess, real PyAV files.

Everything runs offline on tiny RANDOM-weight checkpoints (made once per module under a private
``SAPIENS2_STREAM_CACHE``) with an empty Hugging Face cache, so no run can reach for the network
or for real weights. Every subprocess has a timeout; nothing here can hang.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from pipeline.cli.args import overrides_from
from pipeline.cli.config import ConfigError, load_config
from pipeline.cli.main import build_parser
from pipeline.run.runner import Runner
from pipeline.sources import Source
from pipeline.sources.demo import SyntheticCamera
from stages.types import Detections, Frame, FrameResult, Keypoints, StreamInfo
from tests.cliutil import (  # noqa: F401 - fixtures and helpers shared with the fault tests
    CLI,
    CONFIGS,
    NUM_KEYPOINTS,
    OFFLINE,
    RUN_TIMEOUT_S,
    Ran,
    assert_one_clear_error,
    assert_person_keypoints,
    decode_video,
    make_video,
    read_jsonl,
    run_cli,
    run_cli_cases,
    strictly_increasing,
)

pytestmark = pytest.mark.timeout(120)


# -- 1. demo source --------------------------------------------------------------------------
def test_demo_source_records_and_saves_keypoints(tiny: Path, cli_env: dict[str, str], tmp_path: Path) -> None:
    out_mp4, out_jsonl = tmp_path / "out.mp4", tmp_path / "out.jsonl"
    ran = run_cli(["--config", CONFIGS / "tiny.yaml", "--max-frames", 8, "--record", out_mp4,
                   "--save-keypoints", out_jsonl, "--no-progress"], cli_env, tmp_path)
    assert ran.rc == 0, ran.stderr
    assert "RANDOM" in ran.stderr
    assert "Traceback" not in ran.stderr

    video = decode_video(out_mp4)
    assert video.count == 8
    assert (video.width, video.height) == (1280, 720)
    assert strictly_increasing(video.pts)

    records = read_jsonl(out_jsonl)
    assert len(records) == 8
    assert strictly_increasing([r["frame"] for r in records])
    assert [r["frame"] for r in records] == list(range(8))  # ordered source: nothing dropped
    for record in records:
        assert record["random_weights"] is True
        assert (record["width"], record["height"]) == (1280, 720)
        assert_person_keypoints(record)


# -- 2. a generated video file ---------------------------------------------------------------
@pytest.fixture(scope="module")
def file_run(tiny: Path, cli_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One run over a 16-frame 320x240 file with pose+seg, no --max-frames."""
    folder = tmp_path_factory.mktemp("file-run")
    source = make_video(folder / "moving.mp4", n=16)
    out_mp4, out_jsonl = folder / "out.mp4", folder / "out.jsonl"
    ran = run_cli(["--source", source, "--tasks", "pose,seg", *OFFLINE, "--record", out_mp4,
                   "--save-keypoints", out_jsonl], cli_env, folder)
    with av.open(str(source)) as container:
        stream = container.streams.video[0]
        src_frames = list(container.decode(stream))
    return {"ran": ran, "mp4": out_mp4, "jsonl": out_jsonl,
            "src_pts": [int(f.pts) for f in src_frames],
            "src_times": [float(f.pts * f.time_base) for f in src_frames],
            "src_time_base": src_frames[0].time_base}


def test_video_file_every_frame_in_order(file_run: dict) -> None:
    ran = file_run["ran"]
    assert ran.rc == 0, ran.stderr
    assert "Traceback" not in ran.stderr
    assert len(file_run["src_pts"]) == 16

    video = decode_video(file_run["mp4"])
    assert video.count == 16
    assert (video.width, video.height) == (320, 240)
    assert strictly_increasing(video.times)
    # The recording keeps the source's clock (relative to its first frame).
    rec_rel = [t - video.times[0] for t in video.times]
    src_rel = [t - file_run["src_times"][0] for t in file_run["src_times"]]
    assert rec_rel == pytest.approx(src_rel, abs=2e-3)

    records = read_jsonl(file_run["jsonl"])
    assert len(records) == 16
    assert [r["frame"] for r in records] == list(range(16))
    assert [r["pts"] for r in records] == file_run["src_pts"]
    tb = file_run["src_time_base"]
    assert all(Fraction(r["time_base"]) == tb for r in records)
    for record in records:
        assert (record["width"], record["height"]) == (320, 240)
        assert record["random_weights"] is True
        assert_person_keypoints(record)


def test_video_file_keypoints_inside_frame(file_run: dict) -> None:
    assert file_run["ran"].rc == 0, file_run["ran"].stderr
    outside = []
    for record in read_jsonl(file_run["jsonl"]):
        w, h = record["width"], record["height"]
        for person in record["persons"]:
            xy = np.array([k[:2] for k in person["keypoints"]], dtype=np.float64)
            bad = (xy[:, 0] < 0) | (xy[:, 0] > w) | (xy[:, 1] < 0) | (xy[:, 1] > h)
            if bad.any():
                outside.append((record["frame"], int(bad.sum()), xy.min(0).round(1).tolist(),
                                xy.max(0).round(1).tolist()))
    assert not outside, f"keypoints outside [0,W]x[0,H] (frame, count, min xy, max xy): {outside[:4]}"


# -- 3. bad input: one clear line, non-zero, within seconds ----------------------------------
def test_missing_file(cli_env: dict[str, str], tmp_path: Path) -> None:
    """Refused before torch is imported (seconds on a slow machine): a torch that cannot import proves it."""
    fake = tmp_path / "no-torch" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('torch was imported before the source was checked')\n")
    env = {**cli_env, "PYTHONPATH": os.pathsep.join(filter(None, [str(fake.parent), cli_env.get("PYTHONPATH")]))}
    missing = tmp_path / "nope.mp4"
    for spec in (missing, f"loop:{missing}"):
        ran = run_cli(["--source", spec, "--tasks", "pose", *OFFLINE], env, tmp_path)
        assert_one_clear_error(ran, "no such file", str(missing))


def test_corrupt_file(tiny: Path, cli_env: dict[str, str], tmp_path: Path) -> None:
    bad = tmp_path / "random.mp4"
    bad.write_bytes(np.random.default_rng(0).integers(0, 256, 50_000, dtype=np.uint8).tobytes())
    out_mp4 = tmp_path / "out.mp4"
    ran = run_cli(["--source", bad, "--tasks", "pose", *OFFLINE, "--record", out_mp4], cli_env, tmp_path)
    assert_one_clear_error(ran, str(bad))
    assert not out_mp4.exists()


@pytest.mark.slow
def test_a_matroska_file_cut_short_is_an_error_and_a_whole_one_is_not(tiny: Path, cli_env: dict[str, str],
                                                                      tmp_path: Path) -> None:
    """Matroska states no frame count, only a duration: a file whose video ends well before it (a
    cut download) is an error naming both, not a run that exits 0 with a third of the frames."""
    whole = make_video(tmp_path / "whole.mkv", n=40, fps=10)
    cut = tmp_path / "cut.mkv"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 3])
    kp = tmp_path / "whole.jsonl"
    ran = run_cli(["--source", whole, "--tasks", "pose", *OFFLINE, "--save-keypoints", kp], cli_env, tmp_path)
    assert ran.rc == 0 and len(read_jsonl(kp)) == 40, ran.stderr
    ran = run_cli(["--source", cut, "--tasks", "pose", *OFFLINE], cli_env, tmp_path)
    assert_one_clear_error(ran, "cut.mkv", "of the 4.0 s it declares", "truncated")


@pytest.mark.parametrize("faststart", [False, True], ids=["index-at-end", "faststart"])
def test_truncated_file(tiny: Path, cli_env: dict[str, str], tmp_path: Path, faststart: bool) -> None:
    """Cut in half: either a clear error, or exit 0 with fewer frames; a recording, if any, plays.

    index-at-end: the mp4 index (moov) is in the lost half, so the file cannot be opened at all.
    faststart: the index survives, so the first ~half decodes and then the damage is reported.
    """
    n = 60
    path = make_video(tmp_path / "cut.mp4", n=n, faststart=faststart)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    out_mp4, out_jsonl = tmp_path / "out.mp4", tmp_path / "out.jsonl"
    ran = run_cli(["--source", path, "--tasks", "pose", *OFFLINE, "--record", out_mp4,
                   "--save-keypoints", out_jsonl], cli_env, tmp_path)
    assert "Traceback" not in ran.stderr
    assert "(stalled)" not in ran.stderr  # the decoder found the damage, not the stall watchdog's timeout
    if ran.rc == 0:
        video = decode_video(out_mp4)
        assert 1 <= video.count < n and strictly_increasing(video.pts)
        return
    last = assert_one_clear_error(ran, str(path))
    if not faststart:
        assert "cannot open" in last
        assert not out_mp4.exists()
        return
    # frames decoded before the damage were processed, recorded and the files finalised
    records = read_jsonl(out_jsonl)
    video = decode_video(out_mp4)
    assert 1 <= len(records) < n
    assert [r["frame"] for r in records] == list(range(len(records)))
    assert video.count == len(records) and strictly_increasing(video.pts)
    match = re.search(r"ended after (\d+) of (\d+) frames", last)
    if match:  # every frame the reader delivered made it out, the last one in flight included
        assert len(records) == int(match.group(1)), last


BAD_CONFIGS = {"unknown-key": ("sourcee: demo\n", ["sourcee", "unknown key"]),
               "wrong-type": ('max_frames: "ten"\n', ["max_frames", "expected int"]),
               "unknown-task": ("tasks: [pose, foo]\n", ["tasks", "foo"]),
               "bad-yaml": ("source: [demo\n", ["not valid yaml"])}


@pytest.fixture(scope="module")
def bad_config_runs(cli_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """``--config`` with each BAD_CONFIGS file, through the CLI's main in one interpreter."""
    cases = {}
    for name, (yaml_text, _) in BAD_CONFIGS.items():
        folder = tmp_path_factory.mktemp("bad-config")
        (folder / "bad.yaml").write_text(yaml_text)
        cases[name] = (["--config", folder / "bad.yaml", "--no-progress"], folder)
    return run_cli_cases(cases, cli_env)


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_bad_config_file(bad_config_runs: dict, case: str) -> None:
    assert_one_clear_error(bad_config_runs[case], *BAD_CONFIGS[case][1])


def test_unknown_task_flag(cli_env: dict[str, str], tmp_path: Path) -> None:
    ran = run_cli(["--source", "demo", "--tasks", "pose,foo", *OFFLINE], cli_env, tmp_path)
    last = assert_one_clear_error(ran, "tasks", "foo")
    assert "pose" in last  # lists the valid choices


def test_missing_hub_weights_without_fallback(tiny: Path, cli_env: dict[str, str], tmp_path: Path) -> None:
    source = make_video(tmp_path / "clip.mp4", n=4)
    ran = run_cli(["--source", source, "--tasks", "pose", "--detector", "full-frame", "--device", "cpu",
                   "--no-progress"], cli_env, tmp_path)
    last = assert_one_clear_error(ran, "facebook/sapiens2-pose")
    assert "hf download facebook/sapiens2-pose-0.4b" in last and "local checkpoint" in last, last
    assert "--fallback-tiny" in last, last  # the way to try it anyway is named
    assert "RANDOM" not in ran.stderr  # no silent fallback


def test_yolo_offline_without_fallback(tiny: Path, cli_env: dict[str, str], tmp_path: Path) -> None:
    source = make_video(tmp_path / "clip.mp4", n=4)
    ran = run_cli(["--source", source, "--tasks", "pose", "--checkpoint", f"pose={tiny / 'pose'}",
                   "--detector", "yolo", "--detector-model", "yolo11n.pt", "--device", "cpu", "--no-progress"],
                  cli_env, tmp_path)
    last = assert_one_clear_error(ran, "yolo11n.pt")
    assert "--detector-model" in last or "--detector full-frame" in last, last


# -- 4. signals: a clean stop that finalises the outputs -------------------------------------
@pytest.fixture(scope="module")
def long_video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_video(tmp_path_factory.mktemp("long") / "long.mp4", n=300)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_stops_cleanly(tiny: Path, cli_env: dict[str, str], tmp_path: Path, long_video: Path,
                              signum: signal.Signals) -> None:
    out_mp4, out_jsonl = tmp_path / "out.mp4", tmp_path / "out.jsonl"
    args = ["--source", long_video, "--tasks", "pose", *OFFLINE, "--realtime", "--record", out_mp4,
            "--save-keypoints", out_jsonl]
    with open(tmp_path / "stderr.txt", "w+") as err:
        proc = subprocess.Popen([*CLI, *map(str, args)], env=cli_env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                                stderr=err, text=True)
        try:
            deadline = time.monotonic() + RUN_TIMEOUT_S
            while time.monotonic() < deadline and proc.poll() is None:
                if out_jsonl.exists() and len(out_jsonl.read_text().splitlines()) >= 3:
                    break
                time.sleep(0.05)
            assert proc.poll() is None, "the run ended before it could be signalled"
            assert len(out_jsonl.read_text().splitlines()) >= 3, "no 3 frames within the deadline"
            proc.send_signal(signum)
            try:
                rc = proc.wait(timeout=60)  # a deadline, generous for a loaded machine: never a hang
            except subprocess.TimeoutExpired:
                pytest.fail(f"still running 60 s after {signum.name}")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        err.seek(0)
        stderr = err.read()
    # A requested stop is a clean finish: run_pipeline returns 0 after closing every output.
    assert rc == 0, f"rc={rc}\n{stderr}"
    assert f"{signum.name} received" in stderr
    assert "Traceback" not in stderr and "error:" not in stderr, stderr

    lines = out_jsonl.read_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line parses (no torn last line)
    assert len(records) >= 3
    assert strictly_increasing([r["frame"] for r in records])
    assert len(records) < 300  # it really stopped early
    video = decode_video(out_mp4)
    assert video.count >= 3
    assert strictly_increasing(video.pts)
    assert video.count == len(records)  # both sinks saw every finished frame
    assert (video.width, video.height) == (320, 240)


# -- 5. live source, slow consumer, through the Runner ---------------------------------------
class SlowEngine:
    """Stands in for FrameEngine: 50 ms of 'device work' per frame, one full-frame person."""

    def __init__(self, delay_s: float = 0.05) -> None:
        self.delay_s = delay_s
        self.submitted: list[int] = []

    def submit(self, frame: Frame) -> Frame:
        time.sleep(self.delay_s)
        self.submitted.append(frame.index)
        return frame

    def finish(self, pending: Frame, random_weights: bool) -> FrameResult:
        frame = pending
        box = np.array([[0, 0, frame.width, frame.height]], np.float32)
        det = Detections(box, np.ones(1, np.float32), np.full(1, -1, np.int64))
        kpts = Keypoints(np.zeros((1, NUM_KEYPOINTS, 2), np.float32), np.zeros((1, NUM_KEYPOINTS), np.float32))
        return FrameResult(frame=frame, detections=det, keypoints=kpts, random_weights=random_weights)

    def submit_batch(self, frames: list[Frame]) -> list:  # the FrameEngine interface the runner uses
        return [self.submit(frame) for frame in frames]

    def finish_batch(self, pending: list, random_weights: bool) -> list[FrameResult]:
        return [self.finish(p, random_weights) for p in pending]


class CollectingSink:
    def __init__(self) -> None:
        self.opened: StreamInfo | None = None
        self.frames: list[tuple[int, float]] = []  # (index, capture -> write seconds)
        self.results: list[FrameResult] = []
        self.closed = False
        self.on_write = lambda: None

    def open(self, info: StreamInfo) -> None:
        self.opened = info

    def write(self, result: FrameResult) -> None:
        self.frames.append((result.frame.index, (time.time_ns() - result.frame.capture_ns) / 1e9))
        self.results.append(result)
        self.on_write()

    def close(self) -> None:
        self.closed = True


def _run_live(engine, seconds: float = 1.5, stop_after: int | None = None) -> tuple[Source, CollectingSink, Runner]:
    """Run a 200 fps synthetic camera through the Runner for ``seconds`` (or until ``stop_after`` frames)."""
    camera = SyntheticCamera(width=64, height=48, fps=200.0)
    source = Source(camera.open, label="synthetic", source_id="synthetic", live=True, reconnect=True,
                    stall_timeout_s=2.0)
    source.open()
    sink = CollectingSink()
    runner = Runner(source, engine, [sink], None, random_weights=True)
    if stop_after is not None:
        sink.on_write = lambda: len(sink.frames) >= stop_after and runner.stop.set()
    timer = threading.Timer(seconds, runner.stop.set)
    timer.start()
    try:
        start = time.monotonic()
        stats = runner.run()
        elapsed = time.monotonic() - start
    finally:
        timer.cancel()
        source.stop()
    assert stats.error is None, stats.error
    assert elapsed < seconds + 15.0, f"runner took {elapsed:.1f} s to stop"  # a live source never ends by itself
    assert sink.closed and sink.opened is not None and sink.opened.live
    return source, sink, runner


def _assert_live_behaviour(source: Source, sink: CollectingSink, min_frames: int, max_latency_s: float) -> None:
    indices = [i for i, _ in sink.frames]
    latencies = [lat for _, lat in sink.frames]
    assert len(indices) >= min_frames
    assert strictly_increasing(indices), indices
    assert source.frames_dropped > 0
    assert indices[-1] - indices[0] > len(indices)  # gaps: only fresh frames were processed
    # bounded, not a growing backlog: even the last frames are at most ~two engine steps old
    assert max(latencies) < max_latency_s, f"capture-to-sink latencies {[round(x, 3) for x in latencies]}"


def test_live_source_slow_engine_drops_and_stays_fresh() -> None:
    engine = SlowEngine(0.05)
    source, sink, runner = _run_live(engine)
    _assert_live_behaviour(source, sink, min_frames=10, max_latency_s=0.5)
    assert runner.stats.frames == len(sink.frames)
    # every submitted frame is delivered (the in-flight one too, on stop)
    assert [i for i, _ in sink.frames] == engine.submitted


class TimedEngine:
    """A real FrameEngine, remembering how long each submit took."""

    def __init__(self, engine) -> None:
        self.engine, self.submit_s = engine, []

    def submit(self, frame: Frame):
        start = time.perf_counter()
        pending = self.engine.submit(frame)
        self.submit_s.append(time.perf_counter() - start)
        return pending

    def finish(self, pending, random_weights: bool) -> FrameResult:
        return self.engine.finish(pending, random_weights)

    def submit_batch(self, frames: list[Frame]):
        start = time.perf_counter()
        pending = self.engine.submit_batch(frames)
        self.submit_s.append(time.perf_counter() - start)
        return pending

    def finish_batch(self, pending, random_weights: bool) -> list[FrameResult]:
        return self.engine.finish_batch(pending, random_weights)


def test_live_source_real_engine_tiny_pose(tiny: Path, cli_env: dict[str, str], monkeypatch) -> None:
    for key in ("SAPIENS2_STREAM_CACHE", "HF_HUB_OFFLINE", "HF_HOME", "HF_HUB_CACHE"):
        monkeypatch.setenv(key, cli_env[key])
    from pipeline.run.build import build_stages
    from pipeline.run.engine import FrameEngine

    cfg = load_config(CONFIGS / "tiny.yaml", {"tasks": ["pose"]})
    stages = build_stages(cfg)
    assert stages.random_weights
    engine = TimedEngine(FrameEngine(stages, cfg.kpt_threshold))
    for i in range(2):  # warm-up outside the timed run
        engine.finish(engine.submit(Frame(i, np.zeros((48, 64, 3), np.uint8), i, Fraction(1, 200),
                                          time.time_ns())), True)
    engine.submit_s.clear()
    source, sink, _ = _run_live(engine, seconds=10.0, stop_after=6)
    # CPU speed varies (shared runners): bound latency by the engine's own per-frame cost.
    bound = 2 * max(engine.submit_s) + 0.3
    _assert_live_behaviour(source, sink, min_frames=3, max_latency_s=bound)
    assert all(r is not None for r in sink.results)
    assert all(len(r.keypoints) == 1 and r.keypoints.xy.shape == (1, NUM_KEYPOINTS, 2) for r in sink.results)


@pytest.mark.parametrize("sources", [["fast.mp4"], ["a=fast.mp4", "b=fast.mp4"]], ids=["one source", "two sources"])
def test_a_live_source_says_why_it_dropped_in_the_summary(tiny: Path, cli_env: dict[str, str], tmp_path: Path,
                                                          sources: list[str]) -> None:
    """A file paced at 1000 fps (--realtime: the live policy) before models that take far longer a frame: the
    summary line of each source gives its drops with their reason, and what it gave plus what it dropped is
    the whole file."""
    make_video(tmp_path / "fast.mp4", n=60, w=160, h=120, fps=1000)
    ran = run_cli([*(arg for s in sources for arg in ("--source", s)), "--realtime", "--tasks", "pose", *OFFLINE],
                  cli_env, tmp_path)
    assert ran.rc == 0, ran.stderr
    said = re.findall(r"(?:done|  [ab]): (\d+) frames, .*, (\d+) dropped(?:, 0 reopens)? "
                      r"\(live: the newest frame wins while the models are busy\)", ran.stderr)
    assert len(said) == len(sources), ran.stderr
    for frames, dropped in said:
        assert int(dropped) > 0 and int(frames) + int(dropped) == 60, ran.stderr


# -- 6. config -------------------------------------------------------------------------------
def test_cli_overrides_beat_yaml() -> None:
    cfg = load_config(CONFIGS / "tiny.yaml", {"max_frames": 3, "tasks": ["pose"], "source": "clip.mp4"})
    assert (cfg.max_frames, cfg.tasks, cfg.source) == (3, ["pose"], ["clip.mp4"])
    assert cfg.detector == "full-frame" and cfg.fallback_tiny and cfg.device == "cpu"  # the YAML's, kept
    args = build_parser().parse_args(["run", "--config", str(CONFIGS / "tiny.yaml"), "--max-frames", "5",
                                      "--tasks", "pose,seg", "--no-progress", "--pose-input", "256x192",
                                      "--checkpoint", "pose=/x"])
    cfg = load_config(args.config, overrides_from(args))
    assert cfg.max_frames == 5 and cfg.tasks == ["pose", "seg"] and cfg.progress is False
    assert cfg.pose_input == [256, 192] and cfg.checkpoints == {"pose": "/x"}
    assert cfg.source == ["demo"]  # not given on the command line: the YAML's value
    unset = overrides_from(build_parser().parse_args(["run", "--config", "x.yaml"]))
    assert unset == {}  # flags left out override nothing


@pytest.mark.parametrize("name, source", [("default", "webcam"), ("full", "webcam"), ("tiny", "demo"),
                                          ("demo", "demo")])
def test_shipped_configs_parse(name: str, source: str) -> None:
    cfg = load_config(CONFIGS / f"{name}.yaml")
    assert cfg.source == [source]
    assert cfg.tasks and all(isinstance(t, str) for t in cfg.tasks)


def test_load_config_errors_name_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("sourcee: demo\n")
    with pytest.raises(ConfigError, match="sourcee"):
        load_config(bad)
    with pytest.raises(ConfigError, match="max_frames"):
        load_config(None, {"max_frames": "ten"})
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")


class CallOrder(SlowEngine):
    """SlowEngine that logs submit/finish order; ``cuda`` says whether it computes asynchronously."""

    def __init__(self, cuda: bool) -> None:
        super().__init__(0.02)
        self.cuda, self.calls = cuda, []

    def submit(self, frame: Frame) -> Frame:
        self.calls.append(("submit", frame.index))
        return super().submit(frame)

    def finish(self, pending: Frame, random_weights: bool) -> FrameResult:
        self.calls.append(("finish", pending.index))
        return super().finish(pending, random_weights)


class ReadySource:
    """A source that always has its next frame waiting (an infinitely fast camera), then ends:
    the runner's order of calls is then a property of the runner alone, not of timing."""

    frames_dropped = 0
    reopens = 0

    def __init__(self, n: int) -> None:
        self.frames = [Frame(i, np.zeros((48, 64, 3), np.uint8), i, Fraction(1, 30), time.time_ns(), "ready")
                       for i in range(n)]
        self.info = StreamInfo("ready", 64, 48, 30.0, Fraction(1, 30), live=True)

    def read(self, timeout: float) -> Frame:
        if not self.frames:
            from pipeline.sources import SourceEnded

            raise SourceEnded("no more frames")
        return self.frames.pop(0)

    def stop(self) -> None:
        pass


@pytest.mark.parametrize("cuda", [False, True])
def test_runner_pipelines_only_an_asynchronous_engine(cuda: bool) -> None:
    """On the CPU submit() is the computation: each frame is finished before the next is read
    (holding it back would add a frame of latency for nothing). A CUDA engine gets the next frame
    queued before the current one is collected."""
    engine = CallOrder(cuda)
    sink = CollectingSink()
    stats = Runner(ReadySource(8), engine, [sink], None, random_weights=True).run()
    assert stats.error is None and len(sink.frames) == 8
    if cuda:  # submit(i+1) always comes before finish(i); the last one is finished after the source ended
        expected = [("submit", 0)] + [c for i in range(1, 8) for c in (("submit", i), ("finish", i - 1))]
        assert engine.calls == expected + [("finish", 7)]
    else:
        assert engine.calls == [c for i in range(8) for c in (("submit", i), ("finish", i))]
