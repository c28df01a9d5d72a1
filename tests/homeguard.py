"""Under CI=true the test run must leave the user's home as it found it: a run that writes there (Ray's
~/.ray/auth_token, Ultralytics' ~/.config/Ultralytics, Chromium's crash reports, a checkpoint cache in
~/.cache) fails at its end, naming what appeared. Loaded by conftest.py; a plugin of its own, so that
test_homeguard.py can run it in a pytest of its own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

DEPTH = 3  # ~/.ray/auth_token, ~/.config/chromium/Crash Reports, ~/.cache/sapiens2-stream/tiny


def listing(home: Path, depth: int = DEPTH) -> set[str]:
    """The paths under HOME, relative, down to DEPTH levels (links not followed)."""
    found: set[str] = set()
    for folder, dirs, files in os.walk(home):
        rel = Path(folder).relative_to(home)
        level = len(rel.parts)
        found.update(str(rel / name) for name in (*dirs, *files))
        if level + 1 >= depth:
            dirs.clear()
    return found


class HomeUntouched:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.before = listing(home)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        new = sorted(listing(self.home) - self.before)
        if not new:
            return
        shown = ", ".join(new[:8]) + (f" and {len(new) - 8} more" if len(new) > 8 else "")
        message = (f"CI=true: the tests wrote into the user's home {self.home}: {shown}; "
                   "give the tool that wrote it a folder of the test run's (conftest.py sets several)")
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(message, red=True)
        else:
            print(message)
        if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config: pytest.Config) -> None:
    ci = os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")
    controller = not hasattr(config, "workerinput")  # xdist's workers run tests; the controller decides
    if ci and controller and not config.pluginmanager.has_plugin("sapiens2-home-untouched"):
        config.pluginmanager.register(HomeUntouched(Path.home()), "sapiens2-home-untouched")
