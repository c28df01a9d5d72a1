"""Under CI=true a test run that writes into the user's home fails, naming what it wrote (tests/homeguard.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _pytest(tmp_path: Path, body: str, ci: str = "true") -> subprocess.CompletedProcess:
    home = tmp_path / "home"
    (home / ".config").mkdir(parents=True, exist_ok=True)
    (tmp_path / "test_it.py").write_text(body)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(HOME=str(home), CI=ci, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.homeguard", "-p", "no:cacheprovider",
                           "test_it.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


WRITES_HOME = """
from pathlib import Path
def test_writes_a_token():
    (Path.home() / ".ray").mkdir()
    (Path.home() / ".ray" / "auth_token").write_text("x")
"""

LEAVES_HOME = """
import tempfile
def test_writes_elsewhere():
    with tempfile.TemporaryDirectory() as d:
        open(d + "/x", "w").close()
"""


def test_a_run_that_writes_into_home_fails_naming_the_path(tmp_path: Path) -> None:
    ran = _pytest(tmp_path, WRITES_HOME)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "1 passed" in ran.stdout  # the test itself passed: the run fails for the home
    assert "wrote into the user's home" in ran.stdout and ".ray/auth_token" in ran.stdout, ran.stdout


def test_a_run_that_leaves_home_alone_passes_and_outside_ci_nothing_is_checked(tmp_path: Path) -> None:
    ran = _pytest(tmp_path, LEAVES_HOME)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    ran = _pytest(tmp_path / "local", WRITES_HOME, ci="")
    assert ran.returncode == 0 and "user's home" not in ran.stdout, ran.stdout + ran.stderr

