"""The web viewer in a real browser (Debian's Chromium, driven by Selenium through chromedriver), and
the Prometheus metrics and health endpoints scraped for real.

The pipelines run offline on tiny random weights, one publishing annotated frames, one raw frames
(--publish-raw-frames); the browser must draw frames, show the figures the pipeline publishes, lock
the layers of an annotated picture and toggle them over a raw one (checked on the picture itself,
against the published frame). Screenshots are kept (out/artifacts/viewer.png, and viewer-demo.png of
the README's command, the source of docs/viewer.png) for a person to look at.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import numpy as np
import pytest
from PIL import Image

from sapiens2_client.subscriber import FrameMessage, ReceiveTimeout, StatusMessage, Subscriber
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


@dataclass
class Streams:
    """Two pipelines on one clip, both publishing: ``lobby`` annotated frames, ``hall`` raw ones."""

    baked: str  # the lobby pipeline's endpoint
    raw: str  # the hall pipeline's endpoint (--publish-raw-frames)
    listen: str  # the viewer's page
    metrics: str  # the viewer's --metrics
    viewer: subprocess.Popen


@pytest.fixture(scope="module")
def streams(tiny: Path, cli_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory, long_clip: Path):
    cwd = tmp_path_factory.mktemp("streams")
    baked, raw = f"tcp://127.0.0.1:{_port()}", f"tcp://127.0.0.1:{_port()}"
    listen, metrics = f"127.0.0.1:{_port()}", f"127.0.0.1:{_port()}"
    run = ["--realtime", "--tasks", "pose", *OFFLINE]
    pipelines = [_start(["--source", f"lobby=loop:{long_clip}", *run, "--publish", baked], env=cli_env, cwd=cwd),
                 _start(["--source", f"hall=loop:{long_clip}", *run, "--publish", raw, "--publish-raw-frames"],
                        env=cli_env, cwd=cwd)]
    viewer = _start(["view", "--endpoint", baked, "--endpoint", raw, "--listen", listen, "--metrics", metrics])
    try:
        _wait_http(f"http://{listen}/", [*pipelines, viewer])
        _wait_http(f"http://{metrics}/healthz", [*pipelines, viewer])
        yield Streams(baked, raw, listen, metrics, viewer)
    finally:
        _stop(viewer, *pipelines)


class _Reader:
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


class _Frames(_Reader):
    """The frames a pipeline publishes, as the Python client decodes them: {frame_index: RGB image}."""

    def __init__(self, endpoint: str, source: str) -> None:
        self.images: dict[int, np.ndarray] = {}
        super().__init__(lambda: self._run(endpoint, source))

    def _run(self, endpoint: str, source: str) -> None:
        with Subscriber(endpoint, ["frame"], sources=[source]) as sub:
            while not self._stop.is_set():
                try:
                    msg = sub.recv(timeout_s=0.5)
                except ReceiveTimeout:
                    continue
                if isinstance(msg, FrameMessage):
                    self.images[msg.meta.frame_index] = msg.image
                    for old in [i for i in self.images if i < msg.meta.frame_index - 300]:
                        del self.images[old]


def _canvas(driver) -> tuple[int, np.ndarray]:
    """The picture the page shows (its canvas, as PNG) and the frame_index it says it is."""
    index, url = driver.execute_script("return [document.body.dataset.lastFrameIndex, "
                                       "document.getElementById('view').toDataURL('image/png')];")
    image = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB")
    return int(index), np.asarray(image)


def _differing(driver, frames: _Frames) -> float:
    """Fraction of the shown picture's pixels that differ clearly (> 48 in a channel) from the
    published frame of the index the page says it shows (JPEG decoders differ by a few levels)."""
    deadline = time.monotonic() + 30
    while True:
        index, shown = _canvas(driver)
        published = frames.images.get(index)
        if published is not None:
            assert shown.shape == published.shape, f"the page shows {shown.shape}, frame {index} is {published.shape}"
            return float((np.abs(shown.astype(np.int16) - published.astype(np.int16)).max(axis=2) > 48).mean())
        assert time.monotonic() < deadline, f"frame {index} the page shows never came to the test's subscriber"
        time.sleep(0.1)


def _show(driver, source: str) -> None:
    """Pick ``source`` in the page's picker and wait until it draws that source's frames."""
    from selenium.webdriver.support.ui import Select

    _wait_page(driver, lambda: driver.find_elements("css selector", f'#source option[value="{source}"]'),
               f"listed {source}")
    Select(driver.find_element("id", "source")).select_by_value(source)
    drawn = int(_body(driver, "data-frames-drawn") or 0)
    _wait_page(driver, lambda: _body(driver, "data-source") == source and _body(driver, "data-annotated") != ""
               and int(_body(driver, "data-frames-drawn") or 0) >= drawn + 3, f"drew frames of {source}")


def _caption_agrees_with_the_figures(driver) -> None:
    """The caption, the figures and the keypoints drawn all name the frame shown."""
    index, caption, figure, keypoints = driver.execute_script(
        "const b = document.body.dataset; return [b.lastFrameIndex, document.getElementById('caption').textContent, "
        "document.getElementById('frame').textContent, b.keypointsFrameIndex];")
    assert f"frame {index} " in caption and figure == index, (caption, figure)
    assert keypoints == index or (keypoints == "-1" and "not received: none drawn" in caption), (keypoints, caption)


def _scrape(listen: str) -> dict[str, dict]:
    from prometheus_client.parser import text_string_to_metric_families

    code, text = _get(f"http://{listen}/metrics")
    assert code == 200
    out: dict[str, dict] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_view_metrics_are_the_pipelines_figures(streams: Streams) -> None:
    """``view --metrics`` serves the pipelines' own figures from their messages, with no browser open."""
    deadline = time.monotonic() + 120
    while _get(f"http://{streams.metrics}/readyz")[0] != 200:
        assert time.monotonic() < deadline, "the viewer never heard a publisher"
        time.sleep(0.2)

    def has(scrape: dict, name: str, labels: tuple) -> float:
        return scrape.get(name, {}).get(labels, 0)

    lobby, hall = (("source", "lobby"),), (("source", "hall"),)

    def counted(scrape: dict) -> bool:  # both pipelines heard from (the second may load its models later)
        return has(scrape, "sapiens2_stage_latency_seconds_count", (("stage", "pose"),)) > 0 and all(
            has(scrape, "sapiens2_frames_total", source) > 0
            and has(scrape, "sapiens2_capture_to_publish_seconds_count", source) > 0 for source in (lobby, hall))

    while not counted(first := _scrape(streams.metrics)):
        assert time.monotonic() < deadline, f"no frames counted for both sources: {first}"
        time.sleep(0.3)
    while True:
        second = _scrape(streams.metrics)
        if (has(second, "sapiens2_frames_total", lobby) > has(first, "sapiens2_frames_total", lobby)
                and has(second, "sapiens2_stage_latency_seconds_count", (("stage", "pose"),))
                > has(first, "sapiens2_stage_latency_seconds_count", (("stage", "pose"),))):
            break
        assert time.monotonic() < deadline, "the frame counter or the stage histogram did not grow"
        time.sleep(0.3)
    assert second["sapiens2_viewer_clients"][()] == 0  # the figures came without a browser watching
    for source in (lobby, hall):
        assert has(second, "sapiens2_capture_to_publish_seconds_count", source) > 0
        assert has(second, "sapiens2_capture_to_publish_seconds_bucket", (("le", "+Inf"), *source)) > 0
        assert has(second, "sapiens2_source_up", source) == 1
        assert has(second, "sapiens2_frames_total", source) > 0
    for name in ("sapiens2_frames_dropped_total", "sapiens2_source_reopens_total", "sapiens2_viewer_missed_total",
                 "sapiens2_viewer_received_total", "sapiens2_source_fps"):
        assert name in second, name


@needs_browser
def test_annotated_frames_are_shown_as_published_and_their_layers_locked(streams: Streams) -> None:
    driver = _browser()
    statuses: list[StatusMessage] = []
    try:
        driver.get(f"http://{streams.listen}/")
        _show(driver, "lobby")
        with Subscriber(streams.baked, ["status"]) as sub:  # what the pipeline itself says, to compare with the page
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
            assert any(abs(shown_fps - s.fps) < 0.01 for s in statuses[-3:]) or _published_later(sub, shown_fps), \
                f"the page shows {shown_fps} fps, the pipeline published {[s.fps for s in statuses]}"
        assert driver.find_element("id", "health").text == "ok"
        assert "RANDOM WEIGHTS" in driver.find_element("id", "banner").text  # the page says what it shows
        assert int(_body(driver, "data-refused")) == 0
        # The pipeline drew the overlays: the page says so, greys the toggles and draws nothing over them.
        assert _body(driver, "data-annotated") == "true"
        note = driver.find_element("id", "bakednote")
        assert note.is_displayed() and "--publish-raw-frames" in note.text
        boxes = driver.find_elements("css selector", "#layers input")
        assert boxes and not any(box.is_enabled() for box in boxes)
        assert driver.find_element("css selector", 'input[data-layer="boxes"]').is_selected()
        with _Frames(streams.baked, "lobby") as frames:
            assert _differing(driver, frames) < 0.002, "the page drew over the pipeline's annotated picture"
        assert _body(driver, "data-drawn-boxes") == "0" and _body(driver, "data-drawn-links") == "0"
        _caption_agrees_with_the_figures(driver)
    finally:
        driver.quit()


@needs_browser
def test_raw_frames_get_the_layers_drawn_here_and_toggled(streams: Streams) -> None:
    driver = _browser()
    try:
        driver.get(f"http://{streams.listen}/")
        _show(driver, "hall")
        assert _body(driver, "data-annotated") == "false"
        assert not driver.find_element("id", "bakednote").is_displayed()
        assert all(box.is_enabled() for box in driver.find_elements("css selector", "#layers input"))
        # A layer toggle changes what is drawn: face points appear when switched on.
        face = driver.find_element("css selector", 'input[data-layer="face"]')
        assert not face.is_selected() and _body(driver, "data-drawn-face") == "0"
        face.click()
        _wait_page(driver, lambda: int(_body(driver, "data-drawn-face") or 0) > 0, "drew face points")
        assert "face" in _body(driver, "data-layers").split(",")
        _caption_agrees_with_the_figures(driver)
        with _Frames(streams.raw, "hall") as frames:
            _wait_page(driver, lambda: _body(driver, "data-keypoints-frame-index") == _body(
                driver, "data-last-frame-index"), "drew the keypoints of the frame shown")
            layered = _differing(driver, frames)
            assert layered > 0.003, f"with boxes, skeleton and face on, only {layered:.2%} of the picture changed"
            for layer in ("skeleton", "hands", "face", "boxes", "ids"):
                box = driver.find_element("css selector", f'input[data-layer="{layer}"]')
                if box.is_selected():
                    box.click()
            _wait_page(driver, lambda: _body(driver, "data-drawn-boxes") == "0" and _body(
                driver, "data-drawn-face") == "0", "hid the layers")
            bare = _differing(driver, frames)
            assert bare < 0.002, f"with every layer off, {bare:.2%} of the picture differs from the published frame"
        shot = REPO / "out" / "artifacts" / "viewer.png"
        shot.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(shot))
        assert shot.stat().st_size > 20_000
        code, stats = _get(f"http://{streams.listen}/stats.json")
        assert code == 200 and '"clients": 1' in stats
    finally:
        driver.quit()


def test_a_browser_gets_the_pictures_of_its_source_only(streams: Streams) -> None:
    """Pictures of the source the page picked; keypoints and status of every source; no deflate."""
    import aiohttp

    async def listen() -> tuple[list[str], int]:
        topics: list[str] = []
        async with aiohttp.ClientSession() as session, session.ws_connect(f"http://{streams.listen}/ws") as ws:
            compress = ws.compress
            await ws.send_str(json.dumps({"source": "hall"}))
            start = time.monotonic()
            while time.monotonic() - start < 8:
                msg = await ws.receive(timeout=10)
                assert msg.type == aiohttp.WSMsgType.BINARY, msg
                if time.monotonic() - start > 1:  # what was on its way before the page said which source
                    topics.append(_unpack(msg.data)[0].decode())
        return topics, compress

    topics, compress = asyncio.run(listen())
    assert compress == 0, "JPEG frames must not be deflated again"
    assert "frame.hall" in topics and "frame.lobby" not in topics, sorted(set(topics))
    assert {"keypoints.hall", "keypoints.lobby"} <= set(topics), sorted(set(topics))


def _unpack(data: bytes) -> list[bytes]:
    """The frames of a packed message (uint32 LE count, then length + bytes per frame)."""
    count, at, frames = int.from_bytes(data[:4], "little"), 4, []
    for _ in range(count):
        size = int.from_bytes(data[at:at + 4], "little")
        frames.append(data[at + 4:at + 4 + size])
        at += 4 + size
    return frames


class _Forwarded(_Reader):
    """A WebSocket client of a viewer, as a page is: the status messages it forwards, decoded."""

    def __init__(self, listen: str) -> None:
        self.url, self.statuses = f"http://{listen}/ws", []
        super().__init__(lambda: asyncio.run(self._read()))

    async def _read(self) -> None:
        import aiohttp

        from sapiens2_client.messages import decode_message

        async with aiohttp.ClientSession() as session, session.ws_connect(self.url) as ws:
            while not self._stop.is_set():
                try:
                    msg = await ws.receive(timeout=0.5)
                except asyncio.TimeoutError:
                    continue
                if msg.type != aiohttp.WSMsgType.BINARY:
                    return
                frames = _unpack(msg.data)
                if frames[0].startswith(b"status."):
                    self.statuses.append(decode_message(frames))


def test_the_viewer_stops_cleanly_with_a_stalled_browser(streams: Streams) -> None:
    """A browser that stops reading (a busy tab) while frames flow: the viewer still stops at once,
    with every send ended and no task left pending (asyncio's "Task was destroyed")."""
    listen = f"127.0.0.1:{_port()}"
    viewer = _start(["view", "--endpoint", streams.baked, "--endpoint", streams.raw, "--listen", listen])
    try:
        _wait_http(f"http://{listen}/", [viewer])
        host, port = listen.split(":")
        with socket.socket() as tab:
            tab.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills up after a frame or two
            tab.connect((host, int(port)))
            key = base64.b64encode(b"0123456789abcdef").decode()
            tab.sendall(f"GET /ws HTTP/1.1\r\nHost: {listen}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                        "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n\r\n".encode())
            reply = tab.recv(1024).decode(errors="replace")  # the 101, then this tab reads nothing more
            assert reply.startswith("HTTP/1.1 101"), reply
            assert "permessage-deflate" not in reply.lower(), "JPEG frames must not be deflated again"
            time.sleep(4)  # frames queue up behind the stalled reader
            stopping = time.monotonic()
            viewer.send_signal(signal.SIGINT)
            _, err = viewer.communicate(timeout=60)
            assert time.monotonic() - stopping < 15, "the viewer waited too long for a stalled browser"
        assert viewer.returncode == 0, err
        assert "Task was destroyed" not in err and "Traceback" not in err and "ERROR" not in err, err
    finally:
        _stop(viewer)


@needs_browser
def test_the_viewer_stops_cleanly_with_a_page_open(streams: Streams) -> None:
    listen = f"127.0.0.1:{_port()}"
    viewer = _start(["view", "--endpoint", streams.baked, "--endpoint", streams.raw, "--listen", listen])
    driver = None
    try:
        _wait_http(f"http://{listen}/", [viewer])
        driver = _browser()
        driver.get(f"http://{listen}/")
        _wait_page(driver, lambda: int(_body(driver, "data-frames-drawn") or 0) >= 10, "drew 10 frames")
        viewer.send_signal(signal.SIGINT)  # while frames flow to the page
        _, err = viewer.communicate(timeout=60)
        assert viewer.returncode == 0, err
        assert "Task was destroyed" not in err and "Traceback" not in err and "ERROR" not in err, err
    finally:
        if driver is not None:
            driver.quit()
        _stop(viewer)


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
        assert _body(driver, "data-annotated") == "false"  # raw frames, layers drawn here
        assert not driver.find_element("id", "bakednote").is_displayed()
        # --keypoints3d: the page's 3D panel shows the persons' lifted keypoints, in each plane
        _wait_page(driver, lambda: int(_body(driver, "data-drawn3d") or 0) > 0, "drew 3D links")
        assert driver.find_element("id", "space").is_displayed()
        # docs/WIRE.md: metric, but the reference names no unit (metres is a convention, unverified)
        assert "metric (unit not named by the reference: conventionally metres, unverified)" in \
            driver.find_element("id", "spaceunits").text
        driver.find_element("css selector", '#spaceview option[value="top"]').click()
        _wait_page(driver, lambda: int(_body(driver, "data-points3d") or 0) > 0, "kept drawing in the top view")
    finally:
        if driver is not None:
            driver.quit()
        _stop(pipeline)


@needs_browser
def test_the_documented_command_shows_the_demo_with_layers_figures_and_its_end(tiny: Path, cli_env: dict[str, str],
                                                                              tmp_path: Path) -> None:
    """The README's command as a user types it (free ports for 5599 and 8080): the demo on the tiny
    random-weight fallback (pose and seg, no person detector), served by the pipeline itself. The
    page draws the frames, the segmentation layer toggles on the picture, the figures are what the
    pipeline publishes, the page says the whole frame is the one person, and when the clip ends the
    view stays up showing the source closed until Ctrl-C. A screenshot with the layers on is kept
    (out/artifacts/viewer-demo.png) for a person to look at."""
    listen, publish = f"127.0.0.1:{_port()}", f"tcp://127.0.0.1:{_port()}"
    pipeline = _start(["--source", "demo", "--fallback-tiny", "--publish", publish, "--view", listen],
                      env=cli_env, cwd=tmp_path)
    driver = None
    try:
        _wait_http(f"http://{listen}/", [pipeline])
        driver = _browser()
        with _Forwarded(listen) as forwarded:  # the status messages the page gets, as the Python client reads them
            driver.get(f"http://{listen}/")
            _wait_page(driver, lambda: int(_body(driver, "data-frames-drawn") or 0) >= 3, "drew 3 frames")
            assert _body(driver, "data-annotated") == "false" and _body(driver, "data-source") == "demo"
            seg = driver.find_element("css selector", 'input[data-layer="seg"]')
            assert not seg.is_selected() and _body(driver, "data-drawn-seg") == "0"
            seg.click()
            _wait_page(driver, lambda: _body(driver, "data-drawn-seg") == "1", "drew the segmentation layer")
            seg.click()  # and off again (random weights: the segmentation is noise over the picture)
            _wait_page(driver, lambda: _body(driver, "data-drawn-seg") == "0", "hid the segmentation layer")
            face = driver.find_element("css selector", 'input[data-layer="face"]')
            face.click()
            _wait_page(driver, lambda: int(_body(driver, "data-drawn-face") or 0) > 0, "drew the face points")
            _wait_page(driver, lambda: _body(driver, "data-health") == "ok" and float(_body(driver, "data-fps")) > 0,
                       "showed a status")
            shown_fps = float(_body(driver, "data-fps"))
            deadline = time.monotonic() + 30  # the page's status reached the test's connection too
            while not any(abs(shown_fps - s.fps) < 0.01 for s in forwarded.statuses):
                assert time.monotonic() < deadline, \
                    f"the page shows {shown_fps} fps, the pipeline said {[s.fps for s in forwarded.statuses]}"
                time.sleep(0.1)
            assert forwarded.statuses[-1].detector == "full-frame"  # the offline fallback: no detector weights
        figures = {name: driver.find_element("id", name).text for name in ("drops", "reopens", "decode", "persons")}
        assert figures == {"drops": "0", "reopens": "0", "decode": "0", "persons": "1 (whole frame)"}, figures
        assert driver.find_element("id", "detectornote").is_displayed()
        assert "median" in driver.find_element("id", "plotrange").text  # the latency plot has points
        assert "RANDOM WEIGHTS" in driver.find_element("id", "banner").text
        _caption_agrees_with_the_figures(driver)
        index = int(_body(driver, "data-last-frame-index"))  # more frames: the latency plot has a history
        _wait_page(driver, lambda: int(_body(driver, "data-last-frame-index")) >= index + 40
                   or _body(driver, "data-health") == "closed", "showed 40 frames more")
        shot = REPO / "out" / "artifacts" / "viewer-demo.png"
        shot.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(shot))
        # The clip ends; the page keeps its last picture and says the source closed.
        drawn = int(_body(driver, "data-frames-drawn"))
        _wait_page(driver, lambda: _body(driver, "data-health") == "closed", "showed the end of the clip", 300)
        assert pipeline.poll() is None, "the view went away with the clip"
        assert int(_body(driver, "data-frames-drawn")) >= drawn and driver.find_element("id", "health").text == "closed"
        pipeline.send_signal(signal.SIGINT)
        _, err = pipeline.communicate(timeout=120)
        assert pipeline.returncode == 0, err
        assert "the web view stays up" in err and "Traceback" not in err
    finally:
        if driver is not None:
            driver.quit()
        _stop(pipeline)


def test_metrics_grow_and_health_says_ready(tiny: Path, cli_env: dict[str, str], tmp_path: Path,
                                           long_clip: Path) -> None:
    listen = f"127.0.0.1:{_port()}"
    pipeline = _start(["--source", f"hall={long_clip}", "--realtime", "--source", f"gone={tmp_path / 'missing.mp4'}",
                       "--tasks", "pose", *OFFLINE, "--metrics", listen, "--publish", f"tcp://127.0.0.1:{_port()}"],
                      env=cli_env, cwd=tmp_path)
    try:
        _wait_http(f"http://{listen}/healthz", [pipeline])
        deadline = time.monotonic() + 180
        while _get(f"http://{listen}/readyz")[0] != 200:  # 503 while the models load, then ready
            assert pipeline.poll() is None and time.monotonic() < deadline, pipeline.communicate()[1]
            time.sleep(0.2)
        first = _scrape(listen)
        # every series exists from the start, at 0 until something happens; a source that never
        # opened is there too, down
        assert first["sapiens2_source_up"][(("source", "gone"),)] == 0
        for name in ("sapiens2_source_reopens_total", "sapiens2_decode_errors_total", "sapiens2_frames_dropped_total"):
            assert (("source", "hall"),) in first[name], (name, first.get(name))
        assert {labels for labels in first["sapiens2_publisher_dropped_total"]} >= {
            (("kind", kind),) for kind in ("keypoints", "frame", "status")}
        frames = first["sapiens2_frames_total"][(("source", "hall"),)]
        while _scrape(listen)["sapiens2_frames_total"][(("source", "hall"),)] <= frames:
            assert time.monotonic() < deadline, "the frame counter did not grow"
            time.sleep(0.3)
        second = _scrape(listen)
        assert second["sapiens2_stage_latency_seconds_count"][(("stage", "pose"),)] > \
            first["sapiens2_stage_latency_seconds_count"].get((("stage", "pose"),), 0)
        assert second["sapiens2_capture_to_output_seconds_count"][(("source", "hall"),)] > 0
        assert second["sapiens2_source_up"][(("source", "hall"),)] == 1
        info = next(labels for labels in second["sapiens2_model_info"])
        assert ("random_weights", "true") in info and ("tasks", "pose") in info
        assert ("dtype", "float32") in info, info  # what the stages compute in, not the setting ("auto")
        assert "sapiens2_subscribers" in second and "sapiens2_frames_dropped_total" in second
        assert _get(f"http://{listen}/healthz")[0] == 200
    finally:
        _stop(pipeline)


def test_healthz_says_alive_while_the_process_starts() -> None:
    """Weights download, model load and compile take longer than the loop's 10 s heartbeat: a liveness
    probe must not see 503 then (it would kill the process it waits for); after the loop started,
    a loop that stopped beating is 503."""
    from pipeline.metrics import HEARTBEAT_S, PipelineMetrics

    metrics = PipelineMetrics()
    service = metrics.serve("127.0.0.1:0")
    try:
        url = f"{service.url}/healthz"
        metrics.heartbeat = time.monotonic() - 10 * HEARTBEAT_S  # a long start: no beat for a while
        assert _get(url) == (200, "starting\n")
        metrics.loop_started()
        assert _get(url)[0] == 200
        metrics.heartbeat = time.monotonic() - 2 * HEARTBEAT_S  # the loop stopped beating
        assert _get(url)[0] == 503
    finally:
        service.stop()


def _status_with(url: str, headers: dict[str, str]) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


async def _websocket_status(url: str, origin: str) -> int:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        try:
            async with session.ws_connect(url, origin=origin):
                return 101
        except aiohttp.WSServerHandshakeError as e:
            return e.status


def test_pages_of_other_sites_get_neither_the_stream_nor_the_figures() -> None:
    """Browsers let any page open a WebSocket anywhere and send it its own Origin, and a page can
    rebind its own name to 127.0.0.1: the viewer and the metrics answer only their own origin."""
    from pipeline.metrics import PipelineMetrics
    from pipeline.viewer.server import ViewServer

    viewer = ViewServer(["tcp://127.0.0.1:9"], listen="127.0.0.1:0").start()
    metrics = PipelineMetrics().serve("127.0.0.1:0")
    try:
        own = viewer.url.removeprefix("http://")
        ws = f"ws://{own}/ws"
        assert asyncio.run(_websocket_status(ws, f"http://{own}")) == 101  # the page's own script
        assert asyncio.run(_websocket_status(ws, "http://evil.example.com")) == 403
        assert asyncio.run(_websocket_status(ws, "null")) == 403  # a sandboxed frame or a file:// page
        stats = f"{viewer.url}/stats.json"
        assert _status_with(stats, {}) == 200  # programs send no Origin
        assert _status_with(stats, {"Origin": f"http://{own}"}) == 200
        assert _status_with(stats, {"Host": own.replace("127.0.0.1", "localhost"),
                                    "Origin": f"http://{own.replace('127.0.0.1', 'localhost')}"}) == 200
        assert _status_with(stats, {"Origin": "http://evil.example.com"}) == 403
        rebound = own.replace("127.0.0.1", "evil.example.com")  # DNS rebinding: same origin for the browser
        assert _status_with(stats, {"Host": rebound, "Origin": f"http://{rebound}"}) == 403
        assert _status_with(f"{metrics.url}/metrics", {"Host": rebound}) == 403
        assert _status_with(f"{metrics.url}/metrics", {}) == 200
    finally:
        viewer.close()
        metrics.stop()


def test_a_viewer_that_cannot_listen_says_one_line(cli_env: dict[str, str], tmp_path: Path) -> None:
    from tests.cliutil import assert_one_clear_error, run_cli

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        ran = run_cli(["view", "--endpoint", "tcp://127.0.0.1:9", "--listen", address], cli_env, tmp_path)
    assert_one_clear_error(ran, "viewer", address)
    assert len([line for line in ran.stderr.splitlines() if line.strip()]) == 1, ran.stderr  # no asyncio noise


def _viewer_heard(listen: str, proc: subprocess.Popen, deadline_s: float) -> int:
    """Upstream messages the viewer accepted, once it has some or when ``deadline_s`` passed."""
    deadline = time.monotonic() + deadline_s
    while True:
        received = json.loads(_get(f"http://{listen}/stats.json")[1])["received"]
        if received or time.monotonic() > deadline:
            return received
        assert proc.poll() is None, proc.communicate()[1]
        time.sleep(0.2)


def test_view_reads_a_curve_publisher_with_its_keys_only(tmp_path: Path) -> None:
    """``view --keys`` is a CURVE client of an encrypted publisher: with the keys it receives the
    stream; without them it receives nothing (the publisher refuses its handshake)."""
    from pipeline.sinks.publisher import ZmqPublisher
    from sapiens2_client.keys import CurveServerKeys
    from stages.types import StreamInfo

    keys = tmp_path / "keys"
    assert subprocess.run([*CLI, "keys", keys], capture_output=True, timeout=60).returncode == 0
    publisher = ZmqPublisher("tcp://127.0.0.1:*", curve=CurveServerKeys.from_dir(keys), status_interval_s=0.1)
    publisher.open(StreamInfo("cam0", 64, 48, 30.0, None, live=True))  # status messages from now on
    with_keys, without = f"127.0.0.1:{_port()}", f"127.0.0.1:{_port()}"
    viewers = [_start(["view", "--endpoint", publisher.endpoint, "--keys", keys, "--listen", with_keys]),
               _start(["view", "--endpoint", publisher.endpoint, "--listen", without])]
    try:
        _wait_http(f"http://{with_keys}/", viewers)
        _wait_http(f"http://{without}/", viewers)
        assert _viewer_heard(with_keys, viewers[0], 60) > 0, "the viewer with the keys heard nothing"
        assert _viewer_heard(without, viewers[1], 3) == 0, "a viewer without the keys read an encrypted stream"
    finally:
        _stop(*viewers)
        publisher.close()


def test_a_viewer_off_loopback_without_a_token_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    from pipeline.viewer.server import ViewServer

    with caplog.at_level("WARNING", "pipeline.viewer.server"):
        ViewServer(["tcp://127.0.0.1:9"], listen="0.0.0.0:0", token="t")
        assert "no --view-token" not in caplog.text  # a token: nothing to warn about
        ViewServer(["tcp://127.0.0.1:9"], listen="0.0.0.0:0")
    assert "has no --view-token: anyone who reaches it sees the streams" in caplog.text
