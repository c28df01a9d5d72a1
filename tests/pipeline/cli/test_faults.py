"""Real faults against the real CLI: SIGKILL, a full disk, a read-only folder, a taken port, Ctrl-C held
down, bad input of every kind, rotated and damaged media. Every output must survive what it can.

Full-disk and read-only cases mount a small tmpfs (needs root, as on the CI machine; skipped with
the reason otherwise).
"""

from __future__ import annotations

import contextlib
import json
import pickle
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import av
import numpy as np
import pytest

from tests.cliutil import (
    CLI,
    OFFLINE,
    assert_one_clear_error,
    make_video,
    read_jsonl,
    run_cli,
    run_cli_cases,
    run_cli_on_terminal,
)

pytestmark = pytest.mark.timeout(240)
TINY_POSE = ["--tasks", "pose", *OFFLINE]
START_DEADLINE_S = 120.0  # a loaded 2-core machine: generous, never a timing assertion


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def _wait_until(predicate, proc: subprocess.Popen, deadline_s: float = START_DEADLINE_S) -> None:
    deadline = time.monotonic() + deadline_s
    while not predicate():
        assert proc.poll() is None, f"the run ended early (rc {proc.returncode}): {proc.communicate()[1]}"
        assert time.monotonic() < deadline, "the run did not get there in time"
        time.sleep(0.05)


def _decodable(path: Path, strict: bool = True) -> int:
    """Frames PyAV decodes from the file (0 when it does not open). strict: any packet that does not
    decode counts as a failure (0); otherwise such packets are skipped, as players do."""
    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            count = 0
            for packet in container.demux(stream):
                try:
                    count += len(packet.decode())
                except av.error.FFmpegError:
                    if strict:
                        return 0
            return count
    except (av.error.FFmpegError, IndexError):
        return 0


def _start(args: list, env: dict[str, str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([*CLI, *map(str, args)], env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_video(tmp_path_factory.mktemp("clip") / "clip.mp4", n=400)


@contextlib.contextmanager
def tmpfs(path: Path, options: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    ran = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
    if ran.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({ran.stderr.strip() or 'not root'}): the disk faults need one")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


# -- SIGKILL ---------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".mp4", ".mkv"])
def test_sigkill_keeps_all_but_the_last_fragment(tiny: Path, cli_env: dict[str, str], tmp_path: Path, clip: Path,
                                                 suffix: str) -> None:
    out, kp = tmp_path / f"out{suffix}", tmp_path / "out.jsonl"
    proc = _start(["--source", clip, *TINY_POSE, "--record", out, "--save-keypoints", kp], cli_env, tmp_path)
    try:
        _wait_until(lambda: _lines(kp) >= 30, proc)  # well past the first frames (those: the next test)
        done = _lines(kp)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    kept = _decodable(out)
    # mp4: a fragment per frame; mkv: a cluster per 0.1 s of media (3 frames here), whatever the
    # processing rate; a frame or two more may be in the encoder or the sink queue.
    assert kept >= done - 6, f"{kept} frames decodable after SIGKILL at {done} processed"
    records = [json.loads(line) for line in kp.read_text().splitlines()]  # every line whole and parsable
    assert len(records) >= done and [r["frame"] for r in records] == list(range(len(records)))


def test_sigkill_in_the_first_frames_leaves_a_playable_file(tiny: Path, cli_env: dict[str, str], tmp_path: Path,
                                                            clip: Path) -> None:
    out, kp = tmp_path / "early.mp4", tmp_path / "early.jsonl"
    proc = _start(["--source", clip, *TINY_POSE, "--record", out, "--save-keypoints", kp, "--record-fragment-s",
                   "0.2"], cli_env, tmp_path)
    try:
        _wait_until(lambda: _lines(kp) >= 12, proc)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _decodable(out) >= 1


# -- Ctrl-C held down ------------------------------------------------------------------------
def test_repeated_sigint_never_abandons_the_flush(tiny: Path, cli_env: dict[str, str], tmp_path: Path,
                                                  clip: Path) -> None:
    out, kp = tmp_path / "held.mp4", tmp_path / "held.jsonl"
    proc = _start(["--source", clip, *TINY_POSE, "--record", out, "--save-keypoints", kp], cli_env, tmp_path)
    try:
        _wait_until(lambda: _lines(kp) >= 30, proc)
        for _ in range(4):  # a held Ctrl-C: the first asks to stop, the others arrive during shutdown
            proc.send_signal(signal.SIGINT)
            time.sleep(0.05)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    frames = len(read_jsonl(kp))
    assert _decodable(out) == frames  # every processed frame is in the file
    with av.open(str(out)) as container:  # finalised: a standard MP4, not the fragmented working copy
        assert "frag_keyframe" not in str(container.metadata) and container.duration
    assert out.read_bytes()[4:8] == b"ftyp" and b"moov" in out.read_bytes()[:4096]  # index at the front


# -- a full disk and a read-only folder ------------------------------------------------------
@pytest.mark.parametrize("on_disk", ["record", "keypoints", "both"])
def test_full_disk_keeps_what_came_before_and_fails_with_one_line(tiny: Path, cli_env: dict[str, str],
                                                                  tmp_path: Path, clip: Path, on_disk: str) -> None:
    with tmpfs(tmp_path / "small", "size=160k") as disk:  # (a JSONL line is ~7 KB: some 20 frames fit)
        out = (disk if on_disk in ("record", "both") else tmp_path) / "out.mp4"
        kp = (disk if on_disk in ("keypoints", "both") else tmp_path) / "out.jsonl"
        ran = run_cli(["--source", clip, *TINY_POSE, "--record", out, "--save-keypoints", kp], cli_env, tmp_path,
                      timeout=180)
        assert_one_clear_error(ran, "disk", "failed")
        lines = kp.read_bytes()
        assert lines.endswith(b"\n"), "the JSONL ends with a torn line"
        records = [json.loads(line) for line in lines.splitlines()]
        assert records and [r["frame"] for r in records] == list(range(len(records)))
        kept = _decodable(out)  # strict: every packet in the file decodes (no partial fragment left)
        assert kept >= 1, f"nothing of the recording survived the full disk ({out.stat().st_size} bytes)"
        assert kept <= len(records) + 1  # the recorder is written before the keypoint file


def test_a_disk_that_fills_while_the_recording_is_finalised_keeps_the_fragmented_file(tmp_path: Path) -> None:
    """The close writes a second, standard MP4 beside the fragmented one: a disk with room for one
    copy only fails there, with RecorderError, and the fragmented recording stays, playable."""
    from fractions import Fraction

    from pipeline.sinks.recorder import RecorderError, VideoRecorder
    from stages.types import Frame, FrameResult, StreamInfo

    with tmpfs(tmp_path / "small", "size=600k") as disk:
        out = disk / "out.mp4"
        recorder = VideoRecorder(out, fps=30.0)
        recorder.open(StreamInfo("cam0", 320, 240, 30.0, Fraction(1, 30), live=False))
        noise = np.random.default_rng(0)
        written = 0
        while not out.exists() or out.stat().st_size < 360_000:  # more than half of the disk, short of full
            image = noise.integers(0, 256, (240, 320, 3), dtype=np.uint8)  # incompressible: big fragments
            recorder.write(FrameResult(Frame(written, image, written, Fraction(1, 30), time.time_ns())))
            written += 1
        with pytest.raises(RecorderError, match="finalising the MP4 failed.*fragmented recording is kept"):
            recorder.close()
        assert _decodable(out) == written  # every frame written is in the kept file
        assert [p.name for p in disk.iterdir()] == ["out.mp4"]  # no half-written second copy left


def test_read_only_folder_fails_before_the_models_load(cli_env: dict[str, str], tmp_path: Path, clip: Path) -> None:
    with tmpfs(tmp_path / "ro", "ro,size=64k") as folder:
        ran = run_cli(["--source", clip, *TINY_POSE, "--record", folder / "out.mp4"], cli_env, tmp_path)
        assert_one_clear_error(ran, "not writable")
        assert "loaded pose" not in ran.stderr


# -- a start that fails ----------------------------------------------------------------------
def test_a_failed_start_leaves_existing_outputs_and_loads_no_model(cli_env: dict[str, str], tmp_path: Path,
                                                                   clip: Path) -> None:
    kp, video = tmp_path / "keep.jsonl", tmp_path / "keep.mp4"
    kp.write_text('{"frame": 0}\n')
    video.write_bytes(b"an earlier recording")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ran = run_cli(["--source", clip, *TINY_POSE, "--save-keypoints", kp, "--record", video, "--publish",
                       f"tcp://127.0.0.1:{port}"], cli_env, tmp_path)
    assert_one_clear_error(ran, "cannot bind")
    assert kp.read_text() == '{"frame": 0}\n' and video.read_bytes() == b"an earlier recording"
    assert "loaded pose" not in ran.stderr  # refused before any model loaded


# -- bad input, refused up front -------------------------------------------------------------
BAD_INPUT = [
    (["--max-frames", "-5"], ["--max-frames", "at least 1"]),
    (["--publish", "tcp://127.0.0.1:99999"], ["port 99999"]),
    (["--publish", "127.0.0.1:5555"], ["tcp://127.0.0.1:5555"]),
    (["--publish-connect", "tcp://*:5556"], ["only when binding"]),
    (["--det-conf", "5"], ["--det-conf", "0..1"]),
    (["--det-imgsz", "64000"], ["--det-imgsz", "at most 4096"]),
    (["--tasks", "matting", "--matte-background", "missing.jpg"], ["--matte-background", "missing.jpg"]),
    (["--detector", "yolo", "--detector-model", "/nonexistent.pt"], ["/nonexistent.pt", "no such file"]),
    (["--detector", "yolo", "--detector-model", "evil.pt"], ["pickle", "--trust-detector-model"]),
    (["--record", "out.avi"], ["record", ".mp4"]),
    (["--source-id", "cam.0"], ["--source-id"]),
    (["--kpt-threshold", "-1"], ["--kpt-threshold"]),
    (["--device", "tpu"], ["tpu"]),
    (["--tasks", "seg", "--keypoints3d"], ["--keypoints3d", "pose"]),
    (["--keypoints3d", "--keypoints3d-window", "4"], ["--keypoints3d-window", "odd"]),
    (["--keypoints3d", "--pointmap-every", "0"], ["--pointmap-every", "at least 1"]),
    (["--smooth", "--smooth-beta", "nan"], ["--smooth-beta", "finite"]),
    (["--matte-background", "missing.jpg"], ["--matte-background", "missing.jpg"]),  # checked without matting too
    (["--detector", "yolo", "--detector-model", "person.pth"], ["person.pth", "Ultralytics"]),
    (["--checkpoint", "pose=./my-pose-ckpt"], ["pose=./my-pose-ckpt", "no such checkpoint", "hub id"]),
    (["--record", "/proc/x.mp4"], ["--record", "/proc/x.mp4", "cannot create", "/proc is not writable)"]),  # as root
    (["--save-keypoints", "/proc/kp.jsonl"], ["--save-keypoints", "/proc/kp.jsonl", "/proc is not writable)"]),
    (["--record", "{clip}"], ["record", "is the source file", "destroy the input"]),
    (["--save-keypoints", "{clip}"], ["--save-keypoints", "video name", ".jsonl"]),
    (["--record", "same.mp4", "--save-keypoints", "same.mp4"], ["--save-keypoints", "video name"]),
    (["--metrics", "127.0.0.1:5588", "--control", "tcp://127.0.0.1:5588"], ["control and metrics", "5588"]),
    (["--publish", "tcp://127.0.0.1:5589", "--view", "127.0.0.1:5589"], ["publish and view", "5589"]),
]
# What a refusal must not say: the config key instead of the flag, a second reason that contradicts the first.
NEVER_SAID = {
    ("--record", "/proc/x.mp4"): ["No such file or directory", "not writable ("],
    ("--save-keypoints", "/proc/kp.jsonl"): ["save_keypoints", "No such file or directory", "not writable ("],
    ("--matte-background", "missing.jpg"): ["matte_background"],
    ("--detector", "yolo", "--detector-model", "person.pth"): ["detector_model"],
    ("--checkpoint", "pose=./my-pose-ckpt"): ["checkpoints:"],
}


TAKEN_PORT_FLAGS = ["--view", "--metrics", "--control"]
MISTYPED = [(["--max-frames", "abc"], "--max-frames", "run"), (["--no-such-flag"], "--no-such-flag", "run"),
            (["subscribe", "--timeout", "-1"], "--timeout", "subscribe")]


@pytest.fixture(scope="module")
def refusals(cli_env: dict[str, str], clip: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """This file's runs that must be refused before any model, through the CLI's main in one fresh
    interpreter (a refusal needs no start-up of its own), each in a folder of its own: BAD_INPUT (with an
    evil.pt and its own copy of the clip: a run that wrote over it must not spoil the others), a port
    taken (the sockets are held while the runs go) and MISTYPED. Name -> its run (and more, per kind)."""
    cases, sources, addresses = {}, {}, {}
    for i, (args, _) in enumerate(BAD_INPUT):
        folder = tmp_path_factory.mktemp(f"bad-input-{i}")
        (folder / "evil.pt").write_bytes(pickle.dumps({"not": "a model"}))
        base = [a for a in TINY_POSE if a not in ("--detector", "full-frame")] if "--detector" in args else TINY_POSE
        sources[i] = folder / "input.mp4"
        sources[i].write_bytes(clip.read_bytes())
        cases[i] = (["--source", sources[i], *base, *[a.replace("{clip}", str(sources[i])) for a in args]], folder)
    with contextlib.ExitStack() as held:
        for flag in TAKEN_PORT_FLAGS:
            taken = held.enter_context(socket.socket())
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            addresses[flag] = f"127.0.0.1:{taken.getsockname()[1]}"
            value = f"tcp://{addresses[flag]}" if flag == "--control" else addresses[flag]
            cases[flag] = (["--source", clip, *TINY_POSE, flag, value], tmp_path_factory.mktemp("taken-port"))
        for args, needle, _ in MISTYPED:
            cases[needle] = (args, tmp_path_factory.mktemp("mistyped"))
        runs = run_cli_cases(cases, cli_env)
    yield {**{i: (runs[i], sources[i]) for i in sources}, **{f: (runs[f], addresses[f]) for f in addresses},
           **{needle: runs[needle] for _, needle, _ in MISTYPED}}


@pytest.mark.parametrize("case", range(len(BAD_INPUT)), ids=[" ".join(args) for args, _ in BAD_INPUT])
def test_bad_input_is_one_line_before_any_model(refusals: dict, clip: Path, case: int) -> None:
    ran, source = refusals[case]
    last = assert_one_clear_error(ran, *BAD_INPUT[case][1])
    for needle in NEVER_SAID.get(tuple(BAD_INPUT[case][0]), []):
        assert needle not in last, last
    assert "loaded " not in ran.stderr
    assert source.read_bytes() == clip.read_bytes()


@pytest.mark.parametrize("command", [[], ["subscribe"]], ids=["run", "subscribe"])
def test_show_without_a_display_is_one_line_not_an_abort(cli_env: dict[str, str], tmp_path: Path, clip: Path,
                                                          command: list[str]) -> None:
    """OpenCV's Qt build aborts the process (SIGABRT, exit 134) when no display is there, and a
    recording then keeps no frame: --show is refused first instead."""
    env = {k: v for k, v in cli_env.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    args = ["--show"] if command else ["--source", clip, *TINY_POSE, "--show", "--record", tmp_path / "out.mp4"]
    ran = run_cli([*command, *args], env, tmp_path)
    assert_one_clear_error(ran, "--show" if command else "show", "no display")
    assert "loaded " not in ran.stderr and not (tmp_path / "out.mp4").exists()


@pytest.mark.parametrize("flag", TAKEN_PORT_FLAGS)
def test_a_taken_port_is_refused_before_any_model(refusals: dict, flag: str) -> None:
    """The web view, metrics and control servers start after the models load: their ports are
    checked before, so a taken one costs a second, not a model load."""
    ran, address = refusals[flag]
    assert_one_clear_error(ran, "cannot bind", address)
    assert "loaded " not in ran.stderr


def test_a_setting_this_run_does_not_use_is_named(cli_env: dict[str, str], tmp_path: Path, clip: Path) -> None:
    ran = run_cli(["--source", clip, *TINY_POSE, "--detector-model", "yolo11n.yaml", "--max-frames", "1",
                   "--pointmap-every", "3", "--keypoints3d-window", "5"], cli_env, tmp_path)
    assert ran.rc == 0, ran.stderr
    assert "--detector-model is not used with --detector full-frame" in ran.stderr
    assert "--pointmap-every is used only with --keypoints3d" in ran.stderr
    assert "--keypoints3d-window is used only with --keypoints3d" in ran.stderr


def test_a_checkpoint_of_another_task_is_refused_before_any_model_loads(tiny: Path, cli_env: dict[str, str],
                                                                        tmp_path: Path, clip: Path) -> None:
    ran = run_cli(["--source", clip, "--tasks", "pose", "--keypoints3d", "--checkpoint", f"pointmap={tiny / 'seg'}",
                   *OFFLINE], cli_env, tmp_path)
    assert_one_clear_error(ran, "pointmap=", "is a seg checkpoint", "not pointmap")
    assert "loaded " not in ran.stderr


def test_settings_and_tasks_that_do_nothing_are_named() -> None:
    """--smooth without track ids, a 3D beta without 3D smoothing, tasks whose maps nothing carries."""
    from pipeline.cli.config import RunConfig
    from pipeline.cli.preflight import unused_settings

    notes = unused_settings(RunConfig(source="demo", detector="yolo", smooth=True, smooth_beta3d=2.0,
                                      tasks=["pose", "normal", "pointmap"]))
    assert any("--smooth follows track ids" in n and "--track" in n for n in notes)
    assert "--smooth-beta3d is used only with --smooth and --keypoints3d" in notes
    assert any(n.startswith("the normal task runs") for n in notes)
    assert any(n.startswith("the pointmap task runs") for n in notes)
    tracked = unused_settings(RunConfig(source="demo", detector="yolo", smooth=True, track=True, keypoints3d=True,
                                        smooth_beta3d=2.0, tasks=["pose", "pointmap"]))
    assert tracked == []


def test_a_bad_flag_is_blamed_on_the_flag_not_on_the_config_file(cli_env: dict[str, str], tmp_path: Path,
                                                                 clip: Path) -> None:
    """With --config, a value given as a flag is named by its flag; one from the file by the file."""
    config = tmp_path / "run.yaml"
    config.write_text("det_conf: 0.4\n")
    ran = run_cli(["--config", config, "--source", clip, *TINY_POSE, "--max-frames", "0"], cli_env, tmp_path)
    last = assert_one_clear_error(ran, "--max-frames", "at least 1")
    assert "run.yaml" not in last
    config.write_text("max_frames: 0\n")
    ran = run_cli(["--config", config, "--source", clip, *TINY_POSE], cli_env, tmp_path)
    assert_one_clear_error(ran, "run.yaml: max_frames", "at least 1")


def test_bad_input_is_refused_before_torch_is_imported(cli_env: dict[str, str], tmp_path: Path, clip: Path) -> None:
    """The cases above that need no detector file are refused before torch, torchvision or
    Ultralytics are imported (the command line checks a run before it imports the pipeline)."""
    cases = [["--source", str(clip), *TINY_POSE, *args] for args, _ in BAD_INPUT if "--detector-model" not in args]
    script = ("import json, sys\nfrom pipeline.cli.main import main\n"
              f"codes = [main(argv) for argv in {cases!r}]\n"
              "heavy = [m for m in ('torch', 'torchvision', 'ultralytics', 'cv2') if m in sys.modules]\n"
              "print(json.dumps({'codes': codes, 'heavy': heavy}))")
    ran = subprocess.run([sys.executable, "-c", script], env=cli_env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert ran.returncode == 0, ran.stderr
    out = json.loads(ran.stdout.splitlines()[-1])
    assert out["codes"] == [1] * len(cases), ran.stderr
    assert out["heavy"] == [], ran.stderr


@pytest.mark.parametrize("args, needle, help_of", MISTYPED)
def test_a_mistyped_flag_is_one_line_not_the_usage_text(refusals: dict, args: list[str], needle: str,
                                                        help_of: str) -> None:
    ran = refusals[needle]
    assert_one_clear_error(ran, needle, f"sapiens2-stream {help_of} --help")
    assert ran.rc == 2 and len(ran.stderr.strip().splitlines()) == 1, ran.stderr


# -- media as it is meant to be shown --------------------------------------------------------
def _rotated_clip(path: Path, n: int = 12) -> Path:
    """Coded 64x48 with a white block top-left, shown rotated 90 degrees clockwise (as phones record)."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        stream.set_display_rotation(-90)
        for _ in range(n):
            image = np.zeros((48, 64, 3), np.uint8)
            image[:12, :20] = 255
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def test_rotated_video_is_processed_as_displayed(tiny: Path, cli_env: dict[str, str], tmp_path: Path) -> None:
    clip = _rotated_clip(tmp_path / "portrait.mp4")
    out, kp = tmp_path / "out.mp4", tmp_path / "out.jsonl"
    # --annotate seg without the seg task: nothing is drawn, the recording holds the frames as decoded
    ran = run_cli(["--source", clip, *TINY_POSE, "--record", out, "--save-keypoints", kp, "--annotate", "seg"],
                  cli_env, tmp_path)
    assert ran.rc == 0, ran.stderr
    records = read_jsonl(kp)
    assert {(r["width"], r["height"]) for r in records} == {(48, 64)}  # portrait, as shown
    with av.open(str(out)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert frames[0].shape == (64, 48, 3)
    # Turned clockwise, the block that was top-left of the coded picture is top-right.
    assert frames[-1][2:10, -10:-2].mean() > 150 and frames[-1][2:10, 2:10].mean() < 100


def _noisy_clip(path: Path, n: int) -> Path:
    """A clip with some grain, so its frames are real-sized packets (garbage lands inside a frame)."""
    rng = np.random.default_rng(1)
    with av.open(str(path), "w", options={"movflags": "faststart"}) as container:
        stream = container.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = 320, 240, "yuv420p"
        for i in range(n):
            image = rng.integers(0, 40, (240, 320, 3), dtype=np.uint8)
            image[60:180, (i * 9) % 260:(i * 9) % 260 + 60] += 180
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def test_garbage_inside_a_file_is_skipped_not_fatal(tiny: Path, cli_env: dict[str, str], tmp_path: Path) -> None:
    clip = _noisy_clip(tmp_path / "damaged.mp4", n=60)
    data = bytearray(clip.read_bytes())
    mdat = data.find(b"mdat")
    assert mdat > 0 and data.find(b"moov") < mdat  # faststart: the index first, then the frame data
    middle = mdat + (len(data) - mdat) // 2  # 10 KB of garbage in the middle of the frame data
    data[middle:middle + 10240] = np.random.default_rng(0).integers(0, 256, 10240, dtype=np.uint8).tobytes()
    clip.write_bytes(bytes(data))
    kp = tmp_path / "out.jsonl"
    ran = run_cli(["--source", clip, *TINY_POSE, "--save-keypoints", kp], cli_env, tmp_path, timeout=180)
    assert ran.rc == 0, ran.stderr
    assert len(read_jsonl(kp)) >= 50  # FFmpeg itself decodes 58 of these 60 frames
    assert "did not decode and were skipped" in ran.stderr


def test_progress_bar_knows_the_length_and_log_lines_stay_whole(tiny: Path, cli_env: dict[str, str],
                                                               tmp_path: Path) -> None:
    """On a terminal (in a log, tests/pipeline/cli/test_first_run.py: no bar, no terminal codes)."""
    clip = make_video(tmp_path / "short.mp4", n=16)
    args = [a for a in TINY_POSE if a != "--no-progress"]
    ran = run_cli_on_terminal(["--source", clip, *args, "--record", tmp_path / "o.mp4"], cli_env, tmp_path)
    assert ran.rc == 0, ran.stderr
    assert "16/16" in ran.stderr  # the bar knew the frame count
    for line in ran.stderr.splitlines():
        for segment in line.split("\r"):
            if any(level in segment for level in ("INFO ", "WARNING ")):
                assert segment.lstrip().startswith(("INFO", "WARNING")), f"a log line glued to the bar: {line!r}"


# -- NaN never leaves the pipeline -----------------------------------------------------------
def test_nan_weights_stop_with_one_error_and_write_no_nan(cli_env: dict[str, str], tmp_path: Path,
                                                          clip: Path) -> None:
    from safetensors.torch import load_file, save_file

    from stages.sapiens2.tiny import make_tiny

    folder = make_tiny(tmp_path / "nan-pose", "pose")
    weights = folder / "model.safetensors"
    state = load_file(str(weights))
    state = {k: (v * float("nan") if k.startswith("decode_head.conv_pose") else v) for k, v in state.items()}
    save_file(state, str(weights), metadata={"format": "pt", "sapiens2_stream": "random-init"})
    kp = tmp_path / "nan.jsonl"
    ran = run_cli(["--source", clip, *TINY_POSE, "--checkpoint", f"pose={folder}", "--save-keypoints", kp],
                  cli_env, tmp_path)
    assert_one_clear_error(ran, "pose", "non-finite")
    assert "NaN" not in (kp.read_text() if kp.exists() else "")
