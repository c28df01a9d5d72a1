"""Helpers of the viewer tests (test_viewer.py, test_viewer_http.py): free ports, the CLI as a child
process, HTTP waits, and Debian's Chromium driven by Selenium through chromedriver."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Self

import pytest

from tests.cliutil import CLI, make_video

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_long_clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 3 s clip (30 fps) that its runs loop (``loop:``, with --realtime): still going while a test looks.
    (A 2-minute 640x360 clip cost 28 s of CPU to encode, in each module that made it.)"""
    return make_video(tmp_path_factory.mktemp("clip") / "long.mp4", n=90, w=320, h=180)


def start_cli(args: list, env: dict | None = None, cwd: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen([*CLI, *map(str, args)], env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def stop_all(*procs: subprocess.Popen) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    for proc in procs:
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def wait_http(url: str, procs: list[subprocess.Popen], deadline_s: float = 180) -> None:
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            http_get(url)
            return
        except OSError:
            for proc in procs:
                assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, f"{url} never answered"
            time.sleep(0.2)


def new_browser(home: str):
    """A headless Chromium (on a fresh profile of chromedriver's) whose crash reports and caches go under
    HOME, a folder of the test run's, not the user's ~/.config/chromium and ~/.cache."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1500,1000"):
        options.add_argument(flag)
    env = dict(os.environ, HOME=home, XDG_CONFIG_HOME=f"{home}/config", XDG_CACHE_HOME=f"{home}/cache")
    return webdriver.Chrome(service=Service(DRIVER, env=env), options=options)


class Chromium:
    """One Chromium for the whole session (starting it is most of a browser test's set-up): each test
    gets it on a blank page, with no cookies or storage, its log drained; a browser that died is
    started again."""

    def __init__(self) -> None:
        self.driver = None
        self.home = tempfile.TemporaryDirectory(prefix="sapiens2-tests-chromium-")

    def get(self):
        from selenium.common.exceptions import WebDriverException

        if self.driver is not None:
            try:
                self.driver.get("about:blank")
                self.driver.delete_all_cookies()
                self.driver.get_log("browser")
            except WebDriverException:
                self.close()
        if self.driver is None:
            self.driver = new_browser(self.home.name)
        return self.driver

    def close(self) -> None:
        if self.driver is not None:
            try:
                self.driver.quit()
            finally:
                self.driver = None


def attr(driver, name: str) -> str:
    return driver.find_element("tag name", "body").get_attribute(name) or ""


def wait_page(driver, predicate, what: str, deadline_s: float = 120) -> None:
    deadline = time.monotonic() + deadline_s
    while not predicate():
        assert time.monotonic() < deadline, f"the page never {what}; browser log: {driver.get_log('browser')}"
        time.sleep(0.2)


class Reader:
    """A daemon thread that reads (``target``) while the with-block runs."""

    def __init__(self, target) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=target, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def unpack_frames(data: bytes) -> list[bytes]:
    """The frames of a packed message (uint32 LE count, then length + bytes per frame)."""
    count, at, frames = int.from_bytes(data[:4], "little"), 4, []
    for _ in range(count):
        size = int.from_bytes(data[at:at + 4], "little")
        frames.append(data[at + 4:at + 4 + size])
        at += 4 + size
    return frames


def scrape(listen: str) -> dict[str, dict]:
    """The Prometheus metrics at ``listen``: name -> {sorted label pairs: value}."""
    from prometheus_client.parser import text_string_to_metric_families

    code, text = http_get(f"http://{listen}/metrics")
    assert code == 200
    out: dict[str, dict] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out
