"""Shared fixtures: an offline CLI environment with tiny RANDOM-weight checkpoints made once per run;
under CI=true a skipped test fails (CI runs every test) and so does a run that wrote into the user's home;
loggers made by a thread while a test phase starts."""

from __future__ import annotations

import fcntl
import logging
import os
import secrets
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

from stages.tasks import TASKS
from tests import homeguard
from tests.cliutil import CLI, RUN_TIMEOUT_S

# Ultralytics writes a settings file when it is first imported (here: by the test modules that import
# the detector): in a folder of this run, not in the user's ~/.config (offline_env does so for the runs).
# The xdist workers inherit the main process's; the folder goes when the process that made it exits.
if "YOLO_CONFIG_DIR" not in os.environ:
    _YOLO_CONFIG = tempfile.TemporaryDirectory(prefix="sapiens2-tests-yolo-")
    os.environ["YOLO_CONFIG_DIR"] = _YOLO_CONFIG.name
# Our own cache folder (tiny checkpoints, and compiled kernels: an estimator with compile on points
# Inductor's caches there, for the rest of the process) is one of this run's for the tests run in
# this process too, never ~/.cache/sapiens2-stream (offline_env gives the CLI runs theirs).
if "SAPIENS2_STREAM_CACHE" not in os.environ:
    _OUR_CACHE = tempfile.TemporaryDirectory(prefix="sapiens2-tests-cache-")
    os.environ["SAPIENS2_STREAM_CACHE"] = _OUR_CACHE.name
# Ray 2.60 turns on token authentication for a local cluster and, with no token given, writes one to
# ~/.ray/auth_token: the run's clusters get a token of its own from the environment instead (their
# processes inherit it), and authentication stays on.
if not {"RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"} & set(os.environ):
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
# One intra-op thread in the test processes too, and in what they start (offline_env says why for the runs):
# two xdist workers with torch's default of one thread per core spin against each other on a 2-core box
# (measured: tests/stages/sapiens2 + tests/stages/detect, 2 workers, 94 s of CPU vs 42 s with one thread).
if "OMP_NUM_THREADS" not in os.environ:
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    torch.set_num_threads(1)


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
    homeguard.pytest_configure(config)  # under CI=true, the run fails when it wrote into the user's home


# How ``make test-python`` (``-n 2 --dist loadgroup``) shares the suite between its two workers: a
# file's tests run in one worker, so that its module fixtures (the fleet's Ray cluster, a CLI run
# several tests read) are made once; except in these files, whose tests are long and share nothing
# costly: each of their tests goes to whichever worker is free. The units that hold a test marked
# slow start first (whole files first): the last unit a worker starts bounds the run, so that one
# should be short. xdist's own loadgroup reads xdist_group marks through node ids, which pytest 9.2
# no longer lets it rewrite (pytest-xdist#1386: every test becomes a unit of its own, module fixtures
# made in both workers), so the units are computed here, by the scheduler below.
SPREAD = {"test_archive.py", "test_bench_smoke.py", "test_faults.py", "test_multisource.py",
          "test_network_faults.py"}
LONG = {"test_viewer.py"}  # a long file that marks no test slow (a Chromium and pipelines in its fixtures)


def unit_of(nodeid: str) -> str:
    """The scheduling unit of a test: the test itself in a SPREAD file, else its file."""
    path = nodeid.split("::", 1)[0]
    return nodeid if Path(path).name in SPREAD else path


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # (optional: a run without xdist has no such hook)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FilesAndSpreadTests(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    config.option.loadscopereorder = False  # keep the order collected (below), not the most tests first
    return FilesAndSpreadTests(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("loadgroup", default=False):  # (set in each xdist worker: the workers collect)
        return
    slow = {unit_of(item.nodeid) for item in items if item.get_closest_marker("slow") or item.path.name in LONG}
    # stable: otherwise in the order collected
    items.sort(key=lambda item: (unit_of(item.nodeid) not in slow, item.path.name in SPREAD))


# -- fixtures --------------------------------------------------------------------------------
TINY_TASKS = tuple(TASKS)  # every task: a run never makes one itself


def shared_dir(factory: pytest.TempPathFactory) -> Path:
    """A folder of this run that every xdist worker shares (each worker's base temp is its own)."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = shared_dir(tmp_path_factory) / "sapiens2-stream-cache"
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def offline_env(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    env = dict(os.environ)
    hf_home = tmp_path_factory.mktemp("empty-hf-home")  # no real weights can be found
    env.update(HF_HUB_OFFLINE="1", YOLO_OFFLINE="1", SAPIENS2_STREAM_CACHE=str(cache_dir), HF_HOME=str(hf_home),
               HF_HUB_CACHE=str(hf_home / "hub"), YOLO_CONFIG_DIR=str(tmp_path_factory.mktemp("yolo-config")),
               PYTHONUNBUFFERED="1")
    # One intra-op thread: on a small shared CPU box, OpenMP threads spin against other processes
    # and a run gets ~6x slower (measured: 27 s vs 4.4 s for 16 frames of pose+seg at 320x240).
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    # Ray starts its workers at nice 15: beside the other test worker (nice 0) a Ray actor then gets a few
    # percent of a core (measured: a tiny-pose actor's model load 96 s instead of ~10 s on a loaded box).
    env.update(RAY_worker_niceness="0", RAY_USAGE_STATS_ENABLED="0")
    env.pop("HUGGINGFACE_HUB_CACHE", None)
    return env


@pytest.fixture(scope="session")
def tiny(offline_env: dict[str, str], cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny checkpoints made once per run by ``weights make-tiny``, up front, so that runs never race to
    create them: the first xdist worker to ask makes them, the other waits on the lock and finds them."""
    folder = cache_dir / "tiny"
    with open(cache_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held for the maker's runs, each under its own timeout
        if (folder / ".made").exists():
            return folder
        cwd = tmp_path_factory.mktemp("make-tiny")
        procs = {task: subprocess.Popen([*CLI, "weights", "make-tiny", str(folder / task), "--task", task],
                                        env=offline_env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True)
                 for task in TINY_TASKS}
        for task, proc in procs.items():
            try:
                out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                pytest.fail(f"make-tiny {task} timed out")
            assert proc.returncode == 0, f"make-tiny {task} failed:\n{err}"
            assert "RANDOM" in out
            assert (folder / task / "model.safetensors").is_file()
        (folder / ".made").touch()
    return folder


@pytest.fixture(scope="session")
def cli_env(offline_env: dict[str, str], tiny: Path) -> dict[str, str]:
    """The CLI's offline environment; its cache holds every tiny checkpoint already."""
    return offline_env


@pytest.fixture
def redis_url(tmp_path: Path):
    """A fresh redis-server on a free loopback port for one test (tests/clusterutil.py)."""
    from tests.clusterutil import redis_server

    with redis_server(tmp_path) as url:
        yield url
