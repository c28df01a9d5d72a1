"""The web viewer in a real browser (Debian's Chromium, driven by Selenium through chromedriver), and
the Prometheus metrics and health endpoints scraped for real.

The pipeline runs offline on tiny random weights; the browser must draw frames, show the figures the
pipeline publishes, and toggle layers. A screenshot is kept (out/artifacts/viewer.png) for a person
to look at.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sapiens2_client.subscriber import ReceiveTimeout, StatusMessage, Subscriber
from tests.cliutil import CLI, OFFLINE, make_video

REPO = Path(__file__).resolve().parents[1]
CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = [pytest.mark.timeout(420)]
needs_browser = pytest.mark.skipif(not (CHROMIUM and DRIVER),
                                   reason="needs Debian's chromium and chromium-driver (.ci/run installs them)")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def long_clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_video(tmp_path_factory.mktemp("clip") / "long.mp4", n=3600, w=640, h=360)  # 2 minutes at 30 fps


def _start(args: list, env: dict | None = None, cwd: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen([*CLI, *map(str, args)], env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _stop(*procs: subprocess.Popen) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    for proc in procs:
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _wait_http(url: str, procs: list[subprocess.Popen], deadline_s: float = 180) -> None:
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            _get(url)
            return
        except OSError:
            for proc in procs:
                assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, f"{url} never answered"
            time.sleep(0.2)


def _browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1500,1000"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(DRIVER), options=options)


def _body(driver, name: str) -> str:
    return driver.find_element("tag name", "body").get_attribute(name) or ""


def _wait_page(driver, predicate, what: str, deadline_s: float = 120) -> None:
    deadline = time.monotonic() + deadline_s
    while not predicate():
        assert time.monotonic() < deadline, f"the page never {what}; browser log: {driver.get_log('browser')}"
        time.sleep(0.2)


@needs_browser
def test_the_viewer_shows_the_stream_its_figures_and_layers(tiny: Path, cli_env: dict[str, str], tmp_path: Path,
                                                           long_clip: Path) -> None:
    publish, listen = f"tcp://127.0.0.1:{_port()}", f"127.0.0.1:{_port()}"
    pipeline = _start(["--source", f"lobby={long_clip}", "--realtime", "--tasks", "pose", *OFFLINE,
                       "--publish", publish], env=cli_env, cwd=tmp_path)
    viewer = _start(["view", "--endpoint", publish, "--listen", listen])
    driver = None
    statuses: list[StatusMessage] = []
    try:
        _wait_http(f"http://{listen}/", [pipeline, viewer])
        driver = _browser()
        driver.get(f"http://{listen}/")
        with Subscriber(publish, ["status"]) as sub:  # what the pipeline itself says, to compare with the page
            _wait_page(driver, lambda: int(_body(driver, "data-frames-drawn") or 0) >= 5, "drew 5 frames")
            _wait_page(driver, lambda: _body(driver, "data-health") == "ok", "showed the health")
            deadline = time.monotonic() + 60
            while len(statuses) < 3 and time.monotonic() < deadline:
                try:
                    msg = sub.recv(timeout_s=1.0)
                except ReceiveTimeout:
                    continue
                if isinstance(msg, StatusMessage):
                    statuses.append(msg)
            shown_fps = float(_body(driver, "data-fps"))
            assert any(abs(shown_fps - s.fps) < 0.01 for s in statuses[-3:]) or shown_fps == pytest.approx(
                statuses[-1].fps, abs=0.01) or _published_later(sub, shown_fps), \
                f"the page shows {shown_fps} fps, the pipeline published {[s.fps for s in statuses]}"
        assert _body(driver, "data-source") == "lobby"
        assert driver.find_element("id", "health").text == "ok"
        assert "RANDOM WEIGHTS" in driver.find_element("id", "banner").text  # the page says what it shows
        assert int(_body(driver, "data-refused")) == 0
        # A layer toggle changes what is drawn: face points appear when switched on, go when off.
        face = driver.find_element("css selector", 'input[data-layer="face"]')
        assert not face.is_selected() and _body(driver, "data-drawn-face") == "0"
        face.click()
        _wait_page(driver, lambda: int(_body(driver, "data-drawn-face") or 0) > 0, "drew face points")
        assert "face" in _body(driver, "data-layers").split(",")
        driver.find_element("css selector", 'input[data-layer="boxes"]').click()
        _wait_page(driver, lambda: _body(driver, "data-drawn-boxes") == "0", "hid the boxes")
        shot = tmp_path / "viewer.png"
        driver.save_screenshot(str(shot))
        artifacts = REPO / "out" / "artifacts"
        artifacts.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, artifacts / "viewer.png")
        assert shot.stat().st_size > 20_000
        code, stats = _get(f"http://{listen}/stats.json")
        assert code == 200 and '"clients": 1' in stats
    finally:
        if driver is not None:
            driver.quit()
        _stop(viewer, pipeline)


def _published_later(sub: Subscriber, fps: float) -> bool:
    """The page may already show a status the test had not read yet: look at the next few."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            msg = sub.recv(timeout_s=1.0)
        except ReceiveTimeout:
            continue
        if isinstance(msg, StatusMessage) and abs(msg.fps - fps) < 0.01:
            return True
    return False


@needs_browser
def test_pipeline_serves_its_own_view_with_a_token(tiny: Path, cli_env: dict[str, str], tmp_path: Path,
                                                  long_clip: Path) -> None:
    listen = f"127.0.0.1:{_port()}"
    pipeline = _start(["--source", long_clip, "--realtime", "--tasks", "pose", "--keypoints3d", *OFFLINE,
                       "--publish", f"tcp://127.0.0.1:{_port()}", "--view", listen, "--view-token", "s3cret"],
                      env=cli_env, cwd=tmp_path)
    driver = None
    try:
        _wait_http(f"http://{listen}/static/viewer.js", [pipeline])
        assert _get(f"http://{listen}/")[0] == 401  # no token, no page
        assert _get(f"http://{listen}/ws")[0] == 401
        assert _get(f"http://{listen}/static/")[0] == 404  # no directory listing
        assert _get(f"http://{listen}/static/../pyproject.toml")[0] == 404
        driver = _browser()
        driver.get(f"http://{listen}/?token=s3cret")
        _wait_page(driver, lambda: int(_body(driver, "data-frames-drawn") or 0) >= 3, "drew 3 frames")
        assert "pipeline drew" not in driver.find_element("id", "caption").text  # raw frames, layers drawn here
        # --keypoints3d: the page's 3D panel shows the persons' lifted keypoints, in each plane
        _wait_page(driver, lambda: int(_body(driver, "data-drawn3d") or 0) > 0, "drew 3D links")
        assert driver.find_element("id", "space").is_displayed()
        assert "metric" in driver.find_element("id", "spaceunits").text
        driver.find_element("css selector", '#spaceview option[value="top"]').click()
        _wait_page(driver, lambda: int(_body(driver, "data-points3d") or 0) > 0, "kept drawing in the top view")
    finally:
        if driver is not None:
            driver.quit()
        _stop(pipeline)


def test_the_page_ships_the_javascript_clients_own_build() -> None:
    """One decoder: the viewer's copy of the browser bundle is the JavaScript client's, byte for byte."""
    shipped = (REPO / "pipeline" / "viewer" / "static" / "sapiens2-client.browser.js").read_bytes()
    built = (REPO / "clients" / "js" / "dist" / "sapiens2-client.browser.js").read_bytes()
    assert shipped == built, "copy clients/js/dist/sapiens2-client.browser.js to pipeline/viewer/static/"


def test_metrics_grow_and_health_says_ready(tiny: Path, cli_env: dict[str, str], tmp_path: Path,
                                           long_clip: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    listen = f"127.0.0.1:{_port()}"
    pipeline = _start(["--source", f"hall={long_clip}", "--realtime", "--tasks", "pose", *OFFLINE, "--metrics",
                       listen, "--publish", f"tcp://127.0.0.1:{_port()}"], env=cli_env, cwd=tmp_path)
    try:
        _wait_http(f"http://{listen}/healthz", [pipeline])

        def scrape() -> dict[str, dict]:
            code, text = _get(f"http://{listen}/metrics")
            assert code == 200
            out: dict[str, dict] = {}
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
            return out

        deadline = time.monotonic() + 180
        while _get(f"http://{listen}/readyz")[0] != 200:  # 503 while the models load, then ready
            assert pipeline.poll() is None and time.monotonic() < deadline, pipeline.communicate()[1]
            time.sleep(0.2)
        first = scrape()
        frames = first["sapiens2_frames_total"][(("source", "hall"),)]
        while scrape()["sapiens2_frames_total"][(("source", "hall"),)] <= frames:
            assert time.monotonic() < deadline, "the frame counter did not grow"
            time.sleep(0.3)
        second = scrape()
        assert second["sapiens2_stage_latency_seconds_count"][(("stage", "pose"),)] > \
            first["sapiens2_stage_latency_seconds_count"].get((("stage", "pose"),), 0)
        assert second["sapiens2_capture_to_output_seconds_count"][(("source", "hall"),)] > 0
        assert second["sapiens2_source_up"][(("source", "hall"),)] == 1
        info = next(labels for labels in second["sapiens2_model_info"])
        assert ("random_weights", "true") in info and ("tasks", "pose") in info
        assert "sapiens2_subscribers" in second and "sapiens2_frames_dropped_total" in second
        assert _get(f"http://{listen}/healthz")[0] == 200
    finally:
        _stop(pipeline)
