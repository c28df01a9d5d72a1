"""``--compile`` as a user runs it: the run starts on the eager forward at once, compiles in the
background, switches when the shape is compiled and checked, and a second start finds the compiled
kernels kept in the cache folder. A run stopped while it compiles ends cleanly. An estimator made in
this process (the library's use) computes with its compiled forward what eager computes. (Inductor on
the CPU here: the same code path as on a GPU, without the CUDA graphs.)

One cold compile for the whole file: the command's first start makes it on an empty cache folder; the
second start and the estimator here read what it kept (a cold compile is 30-40 s of CPU)."""

from __future__ import annotations

import logging
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from stages.sapiens2 import load_model
from stages.sapiens2.compiled import compilers_running
from stages.sapiens2.estimators import estimator_for
from stages.sapiens2.fastpath import FastPath
from stages.sapiens2.tiny import make_tiny
from tests.cliutil import CLI, OFFLINE, ctrl_c, killed_on_exit, make_video, read_jsonl, wait_for, wait_for_log

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]
COMPILE_S = 600.0  # one small shape compiles in ~30 s on an idle 2-core machine; 10x beside other jobs
# The runs are paced (--realtime at the clip's 10 fps): unpaced, the eager frames while a shape compiles
# keep a core busy for nothing the test reads (measured: a looped tiny run 19 s of CPU in 20 s unpaced).
FPS = 10
OFF = ("switched off",)  # a fast path turned off: the switch waited for will not come


def _start(args: list[str], env: dict[str, str], cwd: Path, err: Path) -> subprocess.Popen:
    return subprocess.Popen([*CLI, *map(str, args)], env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                            stderr=err.open("w"), text=True)


@dataclass
class ColdStart:
    """The command stopped while it compiled, then started again until its compiled forward was in use."""

    folder: Path
    env: dict[str, str]
    base: list[str]  # the command's arguments, but where its keypoints go
    pose: Path
    stopped_rc: int
    stopped_log: str
    stopped_while_compiling: bool
    stopped: Path  # its keypoints
    first_rc: int
    first: str  # its log
    frames_before_the_switch: int


@pytest.fixture(scope="module")
def cold(cli_env, tmp_path_factory) -> ColdStart:
    tmp_path = tmp_path_factory.mktemp("compile")
    # no kept kernels yet; a run that overstays is aborted for faulthandler's dump of its threads
    env = dict(cli_env, SAPIENS2_STREAM_CACHE=str(tmp_path / "cache"), PYTHONFAULTHANDLER="1")
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)  # (Inductor sets it in a process that compiled: not a user's choice)
    clip = make_video(tmp_path / "clip.mp4", 8, w=96, h=64, fps=FPS)
    # the smallest model of the family (2 layers): the fewest kernels to compile
    pose = make_tiny(tmp_path / "pose", "pose", hidden=32, layers=2, heads=2, image_size=(64, 48))
    base = ["--source", f"loop:{clip}", "--realtime", "--tasks", "pose", "--checkpoint", f"pose={pose}", *OFFLINE,
            "--max-persons", "1", "--compile", "default"]

    err = tmp_path / "stopped.txt"
    stopped = tmp_path / "stopped.jsonl"
    with killed_on_exit(_start([*base, "--save-keypoints", stopped], env, tmp_path, err)) as proc:
        wait_for(lambda: stopped.exists() and len(stopped.read_text().splitlines()) >= 3, "keypoints while compiling",
                 120)
        # stopped while a compiler it started builds a kernel into the cache (the worst moment)
        wait_for(lambda: compilers_running(proc.pid) or proc.poll() is not None or "compiled in" in err.read_text(),
                 "a compiler process", COMPILE_S)
        compiling = "compiled in" not in err.read_text()
        ctrl_c(proc)
    stopped_log = err.read_text()

    err = tmp_path / "first.txt"
    kp = tmp_path / "first.jsonl"
    with killed_on_exit(_start([*base, "--save-keypoints", kp], env, tmp_path, err)) as first:
        wait_for_log(first, err, "compiled forward in use for input 1x3x64x48", COMPILE_S, OFF)
        before = len(read_jsonl(kp))
        wait_for(lambda: len(kp.read_text().splitlines()) > before + 3, "compiled frames", 120)
        ctrl_c(first)
    return ColdStart(tmp_path, env, base, pose, proc.returncode, stopped_log, compiling, stopped, first.returncode,
                     err.read_text(), before)


def test_a_run_stopped_while_compiling_ends_cleanly(cold: ColdStart) -> None:
    """A clean end, every frame so far written; the next start compiles (the fixture's first start)."""
    assert cold.stopped_rc == 0, cold.stopped_log
    assert cold.stopped_while_compiling
    assert "stopped while compiling pose input 1x3x64x48" in cold.stopped_log
    assert all(len(r["persons"]) == 1 for r in read_jsonl(cold.stopped))


def test_compile_starts_eager_switches_when_ready_and_is_kept_for_the_next_start(cold: ColdStart) -> None:
    # the first start: eager frames at once, the compiled forward from the step after it is ready
    assert cold.first_rc == 0, cold.first
    assert "compiling in the background" in cold.first and "from the kept cache" not in cold.first
    assert cold.frames_before_the_switch > 0  # frames came out while the shape compiled
    assert (cold.folder / "cache" / "compile").is_dir()

    # the second start: the same shape from Inductor's kept cache
    err = cold.folder / "second.txt"
    with killed_on_exit(_start([*cold.base, "--save-keypoints", cold.folder / "second.jsonl"], cold.env, cold.folder,
                               err)) as proc:
        wait_for_log(proc, err, "compiled forward in use", COMPILE_S, OFF)
        ctrl_c(proc)
    second = err.read_text()
    assert proc.returncode == 0, second
    assert "pose: input 1x3x64x48 compiled in" in second and "from the kept cache" in second


# A program of a library user: warm-up compiles shapes 1 and 2 (shape 2 a cold one: a compiler is
# sure to run), and the program ends while a compiler builds one of their kernels.
_PROGRAM = """
import logging, sys, time
from stages.sapiens2 import load_model
from stages.sapiens2.compiled import compilers_running
from stages.sapiens2.estimators import estimator_for
from stages.sapiens2.fastpath import FastPath
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
est = estimator_for("pose")(load_model(sys.argv[1], device="cpu"), fastpath=FastPath(compile="default"))
est.warmup(max_batch=2)
end = time.monotonic() + float(sys.argv[2])
while not compilers_running() and time.monotonic() < end:
    time.sleep(0.02)
print("compiler running" if compilers_running() else "no compiler came", flush=True)
"""


def test_a_program_that_ends_while_its_estimator_compiles_waits_for_the_shape(cold: ColdStart) -> None:
    """Not the interpreter's abort inside the compile thread ("terminate called without an active
    exception"): the shape under way finishes, and the program ends with its own exit code."""
    ran = subprocess.run([sys.executable, "-c", _PROGRAM, str(cold.pose), str(COMPILE_S)], env=cold.env,
                         cwd=cold.folder, capture_output=True, text=True, timeout=2 * COMPILE_S)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "compiler running", ran.stderr
    assert "waiting for the compile of pose input" in ran.stderr, ran.stderr


def test_compile_matches_eager(cold: ColdStart, monkeypatch, caplog) -> None:
    """compile=default on the CPU: warm-up starts eager, the shapes compile in the background, and each is
    used once checked against eager; then nothing compiles again."""
    # Inductor's caches are the command's (it finds their kernels: the same graph, one torch thread as
    # there); restored after, as the estimator points Inductor there for the rest of the process.
    (kept,) = (cold.folder / "cache" / "compile").glob("*/cpu")
    monkeypatch.setenv("SAPIENS2_STREAM_CACHE", str(cold.folder / "cache"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(kept))
    eager = estimator_for("pose")(load_model(cold.pose, device="cpu"))
    compiled = estimator_for("pose")(load_model(cold.pose, device="cpu"), fastpath=FastPath(compile="default"))
    with torch.inference_mode():  # as in the pipeline: dynamo guards on inference vs normal tensors
        image = eager.image_tensor(np.random.default_rng(0).integers(0, 256, (90, 70, 3), dtype=np.uint8))
        pixels = eager.preprocess(image, torch.tensor([[5.0, 8.0, 60.0, 85.0]]))  # (1, 3, 64, 48): one crop
    with caplog.at_level(logging.INFO, "stages.sapiens2"):
        assert compiled.warmup(max_batch=1) > 0  # eager: the one shape used below, compiled after it
        assert compiled.wait_compiled(timeout=600)
        got = _forward(compiled, pixels)  # the first use: checked against eager, then used
    assert "pose: input 1x3x64x48 compiled in" in caplog.text
    assert "pose: compiled forward in use for input 1x3x64x48" in caplog.text
    graphs = dict(torch._dynamo.utils.counters["stats"])
    again = _forward(compiled, pixels)
    assert dict(torch._dynamo.utils.counters["stats"]) == graphs  # compiled: nothing compiled again
    torch.testing.assert_close(got, _forward(eager, pixels), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(again, got)
    compiled.close()


def _forward(est, pixels: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        maps, _ = est.forward(pixels)  # (1, K, h, w) heatmaps
    return maps
