"""``--compile`` as a user runs it: the run starts on the eager forward at once, compiles in the
background, switches when the shape is compiled and checked, and a second start finds the compiled
kernels kept in the cache folder. A run stopped while it compiles ends cleanly. (Inductor on the CPU
here: the same code path as on a GPU, without the CUDA graphs.)"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from stages.sapiens2.tiny import make_tiny
from tests.cliutil import CLI, OFFLINE, ctrl_c, killed_on_exit, make_video, read_jsonl, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]
COMPILE_S = 600.0  # one small shape compiles in ~30 s on an idle 2-core machine; 10x beside other jobs


def _start(args: list[str], env: dict[str, str], cwd: Path, err: Path) -> subprocess.Popen:
    return subprocess.Popen([*CLI, *map(str, args)], env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                            stderr=err.open("w"), text=True)


def test_compile_starts_eager_switches_when_ready_and_is_kept_for_the_next_start(cli_env, tmp_path):
    env = dict(cli_env, SAPIENS2_STREAM_CACHE=str(tmp_path / "cache"))  # no kept kernels yet
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)  # (Inductor sets it in a process that compiled: not a user's choice)
    clip = make_video(tmp_path / "clip.mp4", 8, w=96, h=64)
    # the smallest model of the family (2 layers): the fewest kernels to compile
    pose = make_tiny(tmp_path / "pose", "pose", hidden=32, layers=2, heads=2, image_size=(64, 48))
    base = ["--source", f"loop:{clip}", "--tasks", "pose", "--checkpoint", f"pose={pose}", *OFFLINE,
            "--max-persons", "1", "--compile", "default"]

    # stopped while compiling: a clean end, every frame so far written
    err = tmp_path / "stopped.txt"
    kp = tmp_path / "stopped.jsonl"
    with killed_on_exit(_start([*base, "--save-keypoints", kp], env, tmp_path, err)) as proc:
        wait_for(lambda: kp.exists() and len(kp.read_text().splitlines()) >= 3, "keypoints while compiling", 120)
        compiling = "compiled in" not in err.read_text()
        ctrl_c(proc)
    assert proc.returncode == 0, err.read_text()
    assert compiling and all(len(r["persons"]) == 1 for r in read_jsonl(kp))

    # the first start: eager frames at once, the compiled forward from the step after it is ready
    err = tmp_path / "first.txt"
    kp = tmp_path / "first.jsonl"
    with killed_on_exit(_start([*base, "--save-keypoints", kp], env, tmp_path, err)) as proc:
        wait_for(lambda: "compiled forward in use for input 1x3x64x48" in err.read_text(), "the switch", COMPILE_S)
        before = len(read_jsonl(kp))
        wait_for(lambda: len(kp.read_text().splitlines()) > before + 3, "compiled frames", 120)
        ctrl_c(proc)
    first = err.read_text()
    assert proc.returncode == 0, first
    assert "compiling in the background" in first and "from the kept cache" not in first
    assert before > 0  # frames came out while the shape compiled
    assert (tmp_path / "cache" / "compile").is_dir()

    # the second start: the same shape from Inductor's kept cache
    err = tmp_path / "second.txt"
    with killed_on_exit(_start([*base, "--save-keypoints", tmp_path / "second.jsonl"], env, tmp_path, err)) as proc:
        wait_for(lambda: "compiled forward in use" in err.read_text(), "the switch", COMPILE_S)
        ctrl_c(proc)
    second = err.read_text()
    assert proc.returncode == 0, second
    assert "pose: input 1x3x64x48 compiled in" in second and "from the kept cache" in second
