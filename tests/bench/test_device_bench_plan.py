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
