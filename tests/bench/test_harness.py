"""The test harness itself (tests/conftest.py): under CI=true a skip is a failure naming its reason; a
logger made while pytest starts a test phase no longer breaks that phase."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _pytest.logging import LogCaptureHandler, catching_logs

REPO = Path(__file__).resolve().parents[2]

SKIPS = '''
import pytest

def test_a_missing_module():
    pytest.importorskip("no_such_module_here")

@pytest.mark.skipif(True, reason="needs no-such-binary (.ci/run installs it)")
def test_a_missing_binary():
    pass

@pytest.mark.xfail(reason="a known failure is not a skip")
def test_an_expected_failure():
    assert False

def test_that_runs():
    pass
'''


def _pytest(folder: Path, ci: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-p", "tests.conftest", str(folder)], check=False, env=env, cwd=folder, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.timeout(240)
def test_under_ci_a_skip_fails_and_names_what_is_missing(tmp_path: Path) -> None:
    tests, module = tmp_path / "tests", tmp_path / "module"
    tests.mkdir()
    module.mkdir()
    (tests / "test_skips.py").write_text(SKIPS)
    (module / "test_module_skip.py").write_text('import pytest\npytest.importorskip("no_such_package_either")\n\n'
                                                'def test_never_collected():\n    pass\n')
    ci = _pytest(tests, "true")
    assert ci.returncode == 1, ci.stdout + ci.stderr
    assert "1 failed, 1 passed, 1 xfailed, 1 error" in ci.stdout, ci.stdout
    assert "CI=true: this would have been skipped (could not import 'no_such_module_here'" in ci.stdout, ci.stdout
    assert "CI=true: this would have been skipped (needs no-such-binary (.ci/run installs it))" in ci.stdout
    at_collection = _pytest(module, "true")  # a module's skip: a collection error, which stops the run
    assert at_collection.returncode == 2, at_collection.stdout + at_collection.stderr
    assert "ERROR test_module_skip.py - CI=true: this would have been skipped (could not import " \
           "'no_such_package_either'" in at_collection.stdout, at_collection.stdout
    local = _pytest(tmp_path, None)  # elsewhere a skip stays a skip
    assert local.returncode == 0, local.stdout + local.stderr
    assert "1 passed, 3 skipped, 1 xfailed" in local.stdout, local.stdout


@pytest.fixture
def a_logger_that_makes_loggers():
    """A non-propagating logger whose addHandler makes another logger: what a thread that imports ray does
    between two steps of pytest's walk over logging's loggers (see SnapshotLoggerDict in conftest.py)."""
    made: list[str] = []

    class Grows(logging.Logger):
        def addHandler(self, handler: logging.Handler) -> None:
            super().addHandler(handler)
            made.append(f"tests-harness-made-during-the-walk-{len(made)}")
            logging.getLogger(made[-1])

    name = "tests-harness-grows"
    with logging._lock:
        logging.Logger.manager.loggerDict[name] = logger = Grows(name)
    logger.propagate = False
    try:
        yield made
    finally:
        with logging._lock:
            for key in (name, *made):
                logging.Logger.manager.loggerDict.pop(key, None)


def test_a_logger_made_while_a_test_phase_starts_breaks_nothing(a_logger_that_makes_loggers: list[str]) -> None:
    for _ in range(3):  # what pytest enters at each setup, call and teardown
        with catching_logs(LogCaptureHandler()):
            pass
    assert len(a_logger_that_makes_loggers) >= 3  # the dict grew under the walk each time
