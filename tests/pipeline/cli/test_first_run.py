"""What a new user meets in the first hour, as the README has them do it: the offline demo says what is random in
one line the README quotes (before the models load) and writes no terminal codes into a log; a file's latency is
reported as time in the pipeline plus its wait in the read-ahead queue; a run without a detector shows no detect
time; --view's own feed is named as such; the broker says its endpoints once; make-tiny's files follow the umask;
a folder of videos points at batch; subscribe says what latency and age are; a source's fps counts only while it
gave frames."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import stat
import subprocess
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from pipeline.run.sinkthread import SourceStats
from sapiens2_client import video
from sapiens2_client.subscriber import KeypointsMessage, ReceiveTimeout, Subscriber
from sapiens2_client.timing import RateMeter
from stages.sapiens2.verify import switched_off
from tests.cliutil import (
    CLI,
    CONFIGS,
    OFFLINE,
    REPO,
    decode_video,
    make_video,
    run_cli,
    run_cli_cases,
)

pytestmark = pytest.mark.timeout(300)
README = (REPO / "README.md").read_text()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def demo(cli_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory):
    """``make demo``'s command on a machine that never ran Ultralytics, offline, output not a terminal."""
    folder = tmp_path_factory.mktemp("demo")
    env = {**cli_env, "YOLO_CONFIG_DIR": str(folder / "fresh-ultralytics-settings")}
    ran = run_cli(["--config", CONFIGS / "demo.yaml", "--max-frames", 3], env, folder, timeout=240)
    assert ran.rc == 0, ran.stderr
    return ran


def test_the_offline_demo_says_what_is_random_in_one_line_the_readme_quotes(demo) -> None:
    lines = demo.stderr.splitlines()
    warnings = [line for line in lines if line.startswith("WARNING")]
    assert len(warnings) == 1, "\n".join(warnings)
    (warning,) = warnings
    for needle in ("RANDOM WEIGHTS", "pose, seg", "whole frame", "yolo11n.pt", "--checkpoint TASK=DIR",
                   "--detector-model"):
        assert needle in warning, warning
    assert warning in README, "the README does not quote the demo's warning as the demo prints it"
    loaded = [i for i, line in enumerate(lines) if "loaded" in line and "RANDOM WEIGHTS" in line]
    assert loaded and lines.index(warning) < loaded[0], "the models' RANDOM WEIGHTS lines come before the why"
    assert demo.stdout == "", demo.stdout  # (Ultralytics' settings-file lines, with an emoji, were here)


def test_a_log_gets_no_terminal_codes_and_a_plain_progress_line(demo) -> None:
    for stream in (demo.stdout, demo.stderr):
        assert "\r" not in stream and "\x1b[" not in stream, repr(stream[-500:])
    progress = [line for line in demo.stderr.splitlines() if "progress: " in line]
    assert progress and "/3 frames done" in progress[0], demo.stderr
    assert " detect " not in progress[0], progress  # the whole frame is the person: no detector ran


def test_a_files_latency_is_time_in_the_pipeline_plus_its_wait_in_the_read_ahead_queue(demo) -> None:
    done = next(line for line in demo.stderr.splitlines() if "done: 3 frames" in line)
    assert re.search(r"latency p95 \d+ ms in the pipeline \+ \d+ ms waiting in the file's read-ahead queue", done), done
    assert "capture-to-output" not in done, done


def test_make_says_before_it_installs_the_figures_the_readme_gives() -> None:
    """What ``make`` prints before an install (how big, how long) and the README's first-run section agree."""
    shown = subprocess.run(["make", "-n", "-B", ".venv/.installed", "clients/js/node_modules/.installed"], cwd=REPO,
                           capture_output=True, text=True, timeout=60)  # -n: printed, not run
    assert shown.returncode == 0, shown.stderr
    commands = shown.stdout.splitlines()
    notes = [i for i, line in enumerate(commands) if line.startswith('echo "make: installing')]
    installs = [i for i, line in enumerate(commands) if " install " in line or "npm ci" in line]
    assert len(notes) == 2 and notes[0] < installs[0] and notes[1] < installs[-1], shown.stdout  # said first
    first_run = " ".join(README.split("\n## ")[0].split())  # the README up to its first section, on one line
    said = {"python": next((s for s in first_run.split(". ") if "installs into `.venv`" in s), ""),
            "js": next((s for s in first_run.split(". ") if "JavaScript client's packages" in s), "")}
    figures = re.compile(r"\(\d+ of them|\d+(?:\.\d+)? (?:to \d+ )?(?:GB|MB|minutes)")
    for (kind, readme), note in zip(said.items(), (commands[i] for i in notes), strict=True):
        assert figures.findall(note) and figures.findall(note) == figures.findall(readme), f"{kind}:\n{note}\n{readme}"


def test_the_other_warnings_the_readme_explains_are_worded_as_printed(tmp_path: Path, monkeypatch,
                                                                      caplog) -> None:
    """The recorder on a PyAV build without x264 (its probe refuses libx264) records MPEG-4 with the line the
    README quotes; a fast path switched off says what the README's pattern says."""
    probe = video.probe_encoder
    monkeypatch.setattr(video, "probe_encoder", lambda name, *args: name != "libx264" and probe(name, *args))
    caplog.set_level(logging.WARNING)
    writer = video.VideoWriter(tmp_path / "out.mp4", fps=30)
    for i in range(3):
        writer.write(np.full((48, 64, 3), 60 * i, np.uint8), Fraction(i, 30))
    writer.close()
    assert writer.codec == "mpeg4" and decode_video(tmp_path / "out.mp4").count == 3
    switched_off("pose", "CUDA graphs", "a graph of input (1, 3, 256, 192) raised RuntimeError: boom")
    said = [f"{r.levelname} {r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 2, said
    readme = " ".join(README.split())
    assert f"`{said[0]}`" in readme, said[0]
    template = re.search(r"`(WARNING stages\.sapiens2\.verify: [^`]*)`", readme)
    assert template, "the README does not show the fast-path warning"
    pattern = re.escape(template[1]).replace("TASK", r"\w+").replace("NAME", ".+").replace("REASON", ".+")
    assert re.fullmatch(pattern, said[1]), f"{said[1]!r} is not {template[1]!r}"


def test_view_names_its_own_feed_and_frames_carry_their_queue_time_and_no_detect(cli_env: dict[str, str],
                                                                                tmp_path: Path) -> None:
    """One publishing line (the --publish one) and one for the viewer's feed; a keypoints message's stages begin
    with the queue, and a run whose person is the whole frame reports no detect time."""
    clip = make_video(tmp_path / "clip.mp4", 6, w=160, h=120)
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    err = tmp_path / "run.err"
    with Subscriber(endpoint, ["keypoints"]) as sub:
        proc = subprocess.Popen([*CLI, "--source", f"loop:{clip}", "--tasks", "pose", *OFFLINE, "--publish", endpoint,
                                 "--view", f"127.0.0.1:{_free_port()}"], env=cli_env, cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=err.open("w"))
        try:
            msg = None
            while not isinstance(msg, KeypointsMessage):
                assert proc.poll() is None, err.read_text()
                try:
                    msg = sub.recv(timeout_s=120)
                except ReceiveTimeout:
                    pytest.fail(f"no keypoints message:\n{err.read_text()}")
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert next(iter(msg.meta.latency_ms)) == "queue" and msg.meta.latency_ms["queue"] >= 0, msg.meta.latency_ms
    assert "detect" not in msg.meta.latency_ms, msg.meta.latency_ms
    log = err.read_text()
    assert log.count("publishing on") == 1 and f"publishing on {endpoint}" in log, log
    assert log.count("the web view's own feed (raw frames for the page, apart from any --publish) is on") == 1, log


def test_the_broker_says_its_endpoints_once(tmp_path: Path) -> None:
    proc = subprocess.Popen([*CLI, "broker", "--xsub", "tcp://127.0.0.1:0", "--xpub", "tcp://127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
        assert first.startswith("broker: publishers -> "), first + proc.stderr.read()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert (first + out + err).count("publishers ->") == 1, first + out + err


def test_make_tiny_files_follow_the_umask(tmp_path: Path) -> None:
    folder = tmp_path / "tiny-pose"
    ran = subprocess.run([*CLI, "weights", "make-tiny", str(folder), "--task", "pose"], capture_output=True,
                         text=True, timeout=120, preexec_fn=lambda: os.umask(0o022))
    assert ran.returncode == 0, ran.stderr
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()}
    assert modes == {"config.json": 0o644, "model.safetensors": 0o644}, {k: oct(v) for k, v in modes.items()}


def test_a_folder_of_videos_points_at_batch_and_subscribe_says_what_its_figures_are(tmp_path: Path) -> None:
    videos = tmp_path / "videos"
    videos.mkdir()
    make_video(videos / "a.mp4", 3, w=64, h=48)
    runs = run_cli_cases({
        "folder": (["--source", str(videos), "--tasks", "pose", *OFFLINE], tmp_path),
        "subscribe": (["subscribe", "--endpoint", f"tcp://127.0.0.1:{_free_port()}", "--timeout", "1"], tmp_path),
    }, dict(os.environ))
    folder = runs["folder"]
    assert folder.rc == 1 and "Traceback" not in folder.stderr, folder.stderr
    last = folder.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "holds videos (1: a.mp4)" in last, last
    assert f"sapiens2-stream batch {videos} --out DIR" in last, last
    waiting = next(line for line in runs["subscribe"].stderr.splitlines() if "waiting for messages" in line)
    assert "latency = the frame's time in the pipeline" in waiting and "age = since its capture" in waiting, waiting


def test_a_sources_fps_counts_only_while_it_gave_frames() -> None:
    """A camera that gave 5 frames in its first 4 s of a 300 s run ran at 1 fps, not 5 / 300 = 0.0."""
    now = [100.0]
    stats = SourceStats(rate=RateMeter(clock=lambda: now[0]))
    for _ in range(5):
        stats.note(latency_ms=50.0, queue_ms=10.0)
        now[0] += 1.0
    now[0] += 296.0  # the rest of the run: the other sources
    summary = stats.summary()
    assert summary["frames"] == 5 and summary["fps"] == pytest.approx(1.0), summary
    assert summary["queue_p95_ms"] == pytest.approx(10.0) and summary["pipeline_p95_ms"] == pytest.approx(40.0)
    assert json.dumps(summary)  # plain numbers
