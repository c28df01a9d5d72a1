"""The client package on its own: a fresh virtual environment with only clients/python installed (no
torch, no Ultralytics, no OpenCV) receives and decodes a live pipeline's keypoints."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.cliutil import CLI, OFFLINE

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("client-venv")
    venv.create(folder, with_pip=False, system_site_packages=False)
    python = folder / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    # This environment's pip installs into the new one (--python): no pip of its own to bootstrap, and no
    # byte-compiling of every installed file (the client's tests compile what they import): 20 -> 6 s CPU.
    ran = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                          "--disable-pip-version-check", "--no-compile", f"{REPO / 'clients' / 'python'}[test,images]"],
                         capture_output=True, text=True, timeout=540, env=env)
    assert ran.returncode == 0, ran.stderr
    return folder


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_the_client_suite_passes_without_torch_or_opencv(client_venv: Path) -> None:
    """The client's own tests, in its own environment: images go through Pillow there, not OpenCV."""
    ran = subprocess.run([str(client_venv / "bin" / "python"), "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                          str(REPO / "clients" / "python" / "tests")], capture_output=True, text=True, timeout=540,
                         cwd=client_venv)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-2000:]
    # Only the check of the OpenCV-made vectors is skipped (no OpenCV here: the point of this venv).
    assert " passed, 1 skipped" in ran.stdout, ran.stdout[-3000:]
    assert "test_vectors.py:" in ran.stdout and "the committed JPEG bytes come from OpenCV's encoder" in ran.stdout


def test_the_client_venv_has_no_torch_and_no_opencv(client_venv: Path) -> None:
    python = str(client_venv / "bin" / "python")
    for module in ("torch", "ultralytics", "cv2", "pipeline", "stages"):
        ran = subprocess.run([python, "-c", f"import {module}"], capture_output=True, text=True, timeout=60,
                             cwd=client_venv)
        assert ran.returncode != 0 and "No module named" in ran.stderr, f"{module} is importable in the client venv"
    ran = subprocess.run([python, "-c", "import sapiens2_client.subscriber, sapiens2_client.cli"],
                         capture_output=True, text=True, timeout=60, cwd=client_venv)
    assert ran.returncode == 0, ran.stderr


def test_the_client_alone_prints_keypoints_from_a_running_pipeline(client_venv: Path, tiny: Path,
                                                                  cli_env: dict[str, str], tmp_path: Path) -> None:
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    pipeline = subprocess.Popen([*CLI, "--source", "demo", "--realtime", "--tasks", "pose", *OFFLINE,
                                 "--source-id", "cam5", "--publish", endpoint], env=cli_env, cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        sub = subprocess.run([str(client_venv / "bin" / "sapiens2-client"), "subscribe", "--endpoint", endpoint,
                              "--count", "3", "--timeout", "120", "--save-keypoints", str(tmp_path / "kp.jsonl")],
                             capture_output=True, text=True, timeout=180, cwd=client_venv)
    finally:
        pipeline.send_signal(signal.SIGINT)
        try:
            pipeline.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pipeline.kill()
    assert sub.returncode == 0, sub.stderr
    lines = sub.stdout.splitlines()
    assert len(lines) == 3 and all(line.startswith("keypoints.cam5 #") and "persons=1" in line for line in lines)
    records = [json.loads(line) for line in (tmp_path / "kp.jsonl").read_text().splitlines()]
    assert len(records) == 3 and all(len(r["persons"][0]["keypoints"]) == 308 for r in records)
    assert all(r["source"] == "cam5" and r["random_weights"] for r in records)
