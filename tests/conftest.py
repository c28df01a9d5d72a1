"""Shared fixtures: an offline CLI environment with tiny RANDOM-weight checkpoints made once per session;
under CI=true a skipped test fails (CI runs every test); loggers made by a thread while a test phase starts."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

import pytest

from tests.cliutil import CLI, RUN_TIMEOUT_S


# -- the harness ------------------------------------------------------------------------------
class SnapshotLoggerDict(dict):
    """logging's table of loggers, whose views are snapshots. pytest (9.2, ``catching_logs.__enter__``,
    at the start of every setup, call and teardown) walks ``loggerDict.values()`` without logging's
    lock and calls ``addHandler`` (which takes it) on each non-propagating logger; a thread that makes
    loggers meanwhile (one importing ray: ~90 loggers, ``ray`` itself non-propagating) adds to the dict
    between two steps: "RuntimeError: dictionary changed size during iteration" in that phase (the fleet
    test's setup once: the previous test's controller thread imported Ray on its first step). A copy
    is taken under the GIL in one C call, and logging adds to the dict only under its lock."""

    def values(self):  # type: ignore[override]
        return list(super().values())

    def items(self):  # type: ignore[override]
        return list(super().items())

    def keys(self):  # type: ignore[override]
        return list(super().keys())

    def __iter__(self):
        return iter(list(super().keys()))


with logging._lock:  # before any test starts a thread
    if not isinstance(logging.Logger.manager.loggerDict, SnapshotLoggerDict):
        logging.Logger.manager.loggerDict = SnapshotLoggerDict(logging.Logger.manager.loggerDict)


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


class NoSkipsInCI:
    """Under CI=true a skip (a missing module, redis-server, Chromium, no root for a tmpfs) is a failure
    that names its reason: a suite that passes by skipping tests nothing. Registered for the whole
    session, so it covers clients/python/tests too."""

    @staticmethod
    def _fail(report: pytest.CollectReport | pytest.TestReport) -> None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        report.outcome = "failed"
        report.longrepr = (f"CI=true: this would have been skipped ({reason}); CI runs every test: install what "
                           "it needs (.ci/run installs redis-server, chromium and chromium-driver, and runs as root)")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        report = yield
        if report.skipped and not hasattr(report, "wasxfail"):
            self._fail(report)
        return report

    @pytest.hookimpl(wrapper=True)
    def pytest_make_collect_report(self, collector: pytest.Collector):
        report = yield
        if report.skipped:  # a module-level importorskip
            self._fail(report)
        return report


def pytest_configure(config: pytest.Config) -> None:
    if in_ci() and not config.pluginmanager.has_plugin("sapiens2-no-skips-in-ci"):
        config.pluginmanager.register(NoSkipsInCI(), "sapiens2-no-skips-in-ci")


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
