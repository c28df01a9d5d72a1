"""Shared fixtures: an offline CLI environment with tiny RANDOM-weight checkpoints made once per session."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.cliutil import CLI, RUN_TIMEOUT_S


# -- fixtures --------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sapiens2-stream-cache")


@pytest.fixture(scope="session")
def cli_env(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    env = dict(os.environ)
    hf_home = tmp_path_factory.mktemp("empty-hf-home")  # no real weights can be found
    env.update(HF_HUB_OFFLINE="1", YOLO_OFFLINE="1", SAPIENS2_STREAM_CACHE=str(cache_dir), HF_HOME=str(hf_home),
               HF_HUB_CACHE=str(hf_home / "hub"), YOLO_CONFIG_DIR=str(tmp_path_factory.mktemp("yolo-config")),
               PYTHONUNBUFFERED="1")
    # One intra-op thread: on a small shared CPU box, OpenMP threads spin against other processes
    # and a run gets ~6x slower (measured: 27 s vs 4.4 s for 16 frames of pose+seg at 320x240).
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("HUGGINGFACE_HUB_CACHE", None)
    return env


@pytest.fixture(scope="session")
def tiny(cli_env: dict[str, str], cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny checkpoints made once, up front, so that runs never race to create them."""
    cwd = tmp_path_factory.mktemp("make-tiny")
    procs = {task: subprocess.Popen([*CLI, "weights", "make-tiny", str(cache_dir / "tiny" / task), "--task", task],
                                    env=cli_env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for task in ("pose", "seg", "matting", "pointmap")}
    for task, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            pytest.fail(f"make-tiny {task} timed out")
        assert proc.returncode == 0, f"make-tiny {task} failed:\n{err}"
        assert "RANDOM" in out
        assert (cache_dir / "tiny" / task / "model.safetensors").is_file()
    return cache_dir / "tiny"


@pytest.fixture
def redis_url(tmp_path: Path):
    """A fresh redis-server on a free loopback port for one test (tests/clusterutil.py)."""
    from tests.clusterutil import redis_server

    with redis_server(tmp_path) as url:
        yield url
