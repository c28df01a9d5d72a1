"""The device benchmark's plan, checked here where no GPU is: it warms every pose bucket its rows
reach before it times them, it runs on the device image's own torch and says which, and its
overlap figures (the lanes' spans from CUDA events) are the arithmetic they claim to be."""

from __future__ import annotations

import os
import stat
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


class Warmed(Exception):
    """Ends the phase once its warm-up is known."""


@pytest.mark.timeout(300)
def test_the_pipeline_phase_warms_every_bucket_its_rows_reach(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.device_stream as stream
    from bench.devicekit import Ctx, Report
    from pipeline.run.engine import FrameEngine
    from stages.sapiens2.tiny import make_tiny

    monkeypatch.setenv("YOLO_OFFLINE", "1")
    monkeypatch.setattr(stream, "PIPELINE_ROWS", ((1, True, True), (5, True, True)))  # 5 persons: bucket 8
    asked = []

    def warm_up(self, max_persons: int = 8, max_frames: int = 1):
        asked.append((max_persons, max_frames))
        raise Warmed

    monkeypatch.setattr(FrameEngine, "warm_up", warm_up)
    ckpts = {task: make_tiny(tmp_path / task, task, image_size=(64, 48)) for task in ("pose", "seg")}
    ctx = Ctx(device=torch.device("cpu"), smoke=True, iters=1, seconds=0.5, deadline=time.monotonic() + 60,
              report=Report(tmp_path / "out"), ckpts=ckpts)
    with pytest.raises(Warmed):
        stream.phase_pipeline(ctx)
    assert asked == [(5, 1)]


def _fake_python(folder: Path) -> Path:
    """A python3 that runs -c snippets with this interpreter and only names the bench it was asked to run."""
    import sys

    script = folder / "python3"
    script.write_text(f'#!/bin/sh\nif [ "$1" = "-c" ]; then exec {sys.executable} "$@"; fi\necho "bench: $@"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return folder


def _run_device_script(tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, OUT=str(tmp_path / "out"), PATH=f"{_fake_python(tmp_path)}:{os.environ['PATH']}")
    return subprocess.run(["bash", str(REPO / "bench" / "device_run.sh")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_device_script_says_which_torch_it_runs_on(tmp_path: Path) -> None:
    ran = _run_device_script(tmp_path)
    assert ran.returncode == 0, ran.stderr
    gpu = (tmp_path / "out" / "gpu.txt").read_text()
    assert f"torch {torch.__version__} CUDA" in gpu and "on Python 3." in gpu
    assert "bench: -m bench.device_bench --out" in ran.stdout


def test_the_device_script_refuses_a_carried_torch(tmp_path: Path) -> None:
    (tmp_path / ".whl").mkdir()
    (tmp_path / ".whl" / "torch-2.9.0-cp312-cp312-manylinux_2_28_x86_64.whl").write_bytes(b"")
    ran = _run_device_script(tmp_path)
    assert ran.returncode == 1 and "would replace the device image's own torch" in ran.stderr


class At:
    """A CUDA event stand-in at a time (ms)."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def elapsed_time(self, other: At) -> float:
        return other.ms - self.ms


def _step(t0: float, seg: tuple[float, float], pose: tuple[float, float]) -> SimpleNamespace:
    marks = {"upload": (At(t0), At(t0 + 1)), "seg": tuple(map(At, seg)), "pose": tuple(map(At, pose))}
    return SimpleNamespace(clock=SimpleNamespace(marks=marks))


def test_the_overlap_figures() -> None:
    from bench.device_compile import _lane_figures

    # step 0: upload 0-1, seg 1-11, detect 2-6 (inside seg: 4 ms), pose 6-16
    # step 1: upload 10-11, seg 11-21, detect 12-17 beside seg (5) and step 0's pose (12-16: 4) = 9 ms
    steps = [_step(0, (1, 11), (6, 16)), _step(10, (11, 21), (17, 27))]
    spans = [(At(2), At(6)), (At(12), At(17))]
    row = _lane_figures(steps, spans, wall_ms=10.0)
    assert row["lane_ms"] == {"upload": 1.0, "seg": 10.0, "pose": 10.0, "detect": 4.5}
    assert row["summed_ms"] == 25.5 and row["summed_over_wall"] == 2.55
    assert row["detect_overlap_ms"] == (4 + 9) / 2
    assert row["timeline"] == "upload 0.0-1.0, seg 1.0-11.0, detect 2.0-7.0, pose 7.0-17.0"


def test_a_command_the_benchmark_starts_ends_when_its_worker_dies(tmp_path: Path) -> None:
    """The watchdog ends a worker with os._exit: a CLI run it started must not go on holding the GPU."""
    import sys

    worker = ("import subprocess, sys, time\n"
              "from bench.device_cli import guarded\n"
              "child = subprocess.Popen(guarded(['/bin/sleep', '300']))\n"
              "time.sleep(1.0)\n"  # the guard has set its parent-death signal and become sleep
              "print(child.pid, flush=True)\n"
              "import os; os._exit(0)\n")
    done = subprocess.run([sys.executable, "-c", worker], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout.split()[0])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except FileNotFoundError:
            return  # gone (reaped by init)
        if state == "Z":
            return  # ended, waiting for init to reap it
        time.sleep(0.1)
    os.kill(pid, 9)
    pytest.fail(f"the command (pid {pid}) outlived the worker that started it")


# A stand-in for a `--compile` run of the command: its log lines as the CLI writes them, then it runs until
# SIGINT, when it finishes as the CLI does (its done: line, exit status 0).
_FAKE_COMPILE_RUN = """import signal, sys, threading, time
stop = threading.Event()
signal.signal(signal.SIGINT, lambda *_: stop.set())
say = lambda line: print(line, file=sys.stderr, flush=True)
say("INFO sapiens2_stream: warm-up 1.5 s (pose 1.0 s, seg 0.5 s); compiling in the background, each input shape "
    "switches when ready")
time.sleep(0.3)
say("INFO stages.sapiens2.forward: pose: input 1x3x64x48 compiled in 2.0 s, from the kept cache (in the background; "
    "used from its next step)")
say("INFO stages.sapiens2.forward: pose: compiled forward in use for input 1x3x64x48 (compiled in 2.0 s, 2.5 s after "
    "start-up; checked against eager)")
time.sleep(0.3)
say("WARNING stages.sapiens2.verify: seg: fast path compile switched off for this run: input (1, 3, 64, 48): off by 1")
stop.wait(60)
say("INFO sapiens2_stream: done: 40 frames, 12.5 fps, latency p95 9 ms in the pipeline + 3 ms waiting in the file's "
    "read-ahead queue, 0 dropped (RANDOM WEIGHTS)")
"""


def test_a_compile_row_is_stopped_once_every_stage_switched_and_says_when(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    import bench.device_cli as cli

    monkeypatch.setattr(cli, "AFTER_SWITCH_S", 0.5)
    monkeypatch.setattr(cli, "AFTER_SWITCH_MESSAGES", 3)
    received: list[tuple[int, int, str]] = []

    def stop_when(lines: list[tuple[int, str]]) -> bool:
        received.append((time.time_ns(), 0, "demo"))  # a keypoint message every poll (0.1 s)
        return cli.switched_all(["pose", "seg"], lines, received, time.time_ns())

    t0 = time.monotonic()
    run = cli.run_command([sys.executable, "-c", _FAKE_COMPILE_RUN], dict(os.environ), 50.0, stop_when)
    assert run["rc"] == 0 and run["stopped_by"].startswith("the benchmark"), run
    assert time.monotonic() - t0 < 30  # stopped at the switch, not at the limit
    lines = [line for _, line in run["lines"]]
    assert cli.parse_log(lines)["cli_fps"] == 12.5 and cli.parse_log(lines)["warm_s"] == 1.5
    assert cli.parse_log(lines)["switched_off"] == ["seg: compile"]
    figures = cli.compile_figures(run, received, ["pose", "seg"])
    [switch] = figures["switches"]
    assert (switch["task"], switch["shape"], switch["compile_s"]) == ("pose", "1x3x64x48", 2.0) and switch["at_s"] > 0
    assert figures["compiled"][0]["from_cache"] and set(figures["compile_off"]) == {"seg"}
    assert figures["not_switched"] == []
    assert figures["fps_before"] and figures["fps_after"]  # messages came before and after the switch
    note = cli.compile_note(figures)
    assert "pose 1x3x64x48 compiled in use at" in note and "kept cache" in note and "seg: compile switched off" in note


def test_a_compile_row_runs_until_every_stage_switched() -> None:
    from bench.device_cli import switched_all

    line = "INFO x: pose: compiled forward in use for input 1x3x8x8 (compiled in 1.0 s, 2.0 s after start-up; checked"
    pose = (1_000_000_000, line + " against eager)")
    many = [(2_000_000_000 + i, 0, "demo") for i in range(100)]
    assert not switched_all(["pose", "seg"], [pose], many, 10_000_000_000)  # seg not yet
    assert not switched_all(["pose"], [pose], many, 2_000_000_000)  # not long enough after
    assert not switched_all(["pose"], [pose], many[:5], 10_000_000_000)  # too few messages after
    assert switched_all(["pose"], [pose], many, 10_000_000_000)


def test_the_looped_demo_clip_is_a_video_of_the_demo(tmp_path: Path) -> None:
    import av

    from bench.device_cli import write_demo_clip

    with av.open(str(write_demo_clip(tmp_path / "clip.mp4", frames=6))) as clip:
        frames = [f.to_ndarray(format="rgb24") for f in clip.decode(video=0)]
    assert len(frames) == 6 and frames[0].shape == (720, 1280, 3) and frames[0].std() > 10


def test_a_compile_row_at_its_limit_keeps_what_switched_and_says_what_did_not() -> None:
    import sys

    import bench.device_cli as cli

    run = cli.run_command([sys.executable, "-c", _FAKE_COMPILE_RUN], dict(os.environ), 3.0, lambda lines: False,
                          limit_fails=False)
    assert run["rc"] == 0 and run["stopped_by"] == "the row's limit (3 s)"  # the command itself ended well
    assert "done: 40 frames" in run["lines"][-1][1]
    figures = cli.compile_figures(run, [], ["pose", "seg", "matting"])
    assert [s["task"] for s in figures["switches"]] == ["pose"] and figures["not_switched"] == ["matting"]
    assert "matting: not switched when the row ended" in cli.compile_note(figures)
    timed_out = cli.run_command([sys.executable, "-c", _FAKE_COMPILE_RUN], dict(os.environ), 2.0)
    assert timed_out["rc"] == "timeout"  # a plain row at its limit: 2.5x its estimate is a failure


def test_a_first_start_finds_no_kernel_the_worker_compiled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker has compiled by the starts phase (the graphs phase): Inductor then sets TRITON_CACHE_DIR in
    its process, and a first start that inherited it would find Triton's kernels already built."""
    from bench.device_cli import start_env

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "inductor" / "triton" / "0"))
    env = start_env(str(tmp_path / "start"))
    assert "TORCHINDUCTOR_CACHE_DIR" not in env and "TRITON_CACHE_DIR" not in env
    assert env["SAPIENS2_STREAM_CACHE"].startswith(str(tmp_path / "start"))  # ours: <cache>/compile, fresh
