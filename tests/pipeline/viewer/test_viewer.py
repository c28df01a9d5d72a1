"""The web viewer in a real browser (Debian's Chromium, driven by Selenium through chromedriver).

The pipelines run offline on tiny random weights, one publishing annotated frames, one raw frames
(--publish-raw-frames); the browser must draw frames, show the figures the pipeline publishes, lock
the layers of an annotated picture and toggle them over a raw one (checked on the picture itself,
against the published frame), and draw a rig's world steps in 3D. Screenshots are kept
(out/artifacts/viewer.png, viewer-demo.png of the README's command, the source of docs/viewer.png,
and world3d.png, of docs/world3d.png) for a person to look at. One Chromium serves every test of the
session, on a blank page again after each. (The HTTP side without a browser: test_viewer_http.py.)
"""

from __future__ import annotations

import asyncio
import base64
import fcntl
import io
import json
import signal
import socket
import struct
import subprocess
import termios
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sapiens2_client.subscriber import FrameMessage, ReceiveTimeout, StatusMessage, Subscriber
from tests.cliutil import OFFLINE, make_video
from tests.viewerutil import (
    CHROMIUM,
    DRIVER,
    Chromium,
    Reader,
    attr,
    free_port,
    http_get,
    make_long_clip,
    scrape,
    start_cli,
    stop_all,
    unpack_frames,
    wait_http,
    wait_page,
)

REPO = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.timeout(420)]
needs_browser = pytest.mark.skipif(not (CHROMIUM and DRIVER),
                                   reason="needs Debian's chromium and chromium-driver (.ci/run installs them)")


@pytest.fixture(scope="module")
def long_clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_long_clip(tmp_path_factory)


@pytest.fixture(scope="session")
def _chromium():
    chromium = Chromium()
    yield chromium
    chromium.close()


@pytest.fixture
def driver(_chromium: Chromium):
    """The session's Chromium on a fresh blank page; the page is left (about:blank) after the test,
    so its WebSocket and timers go before the next test."""
    if not (CHROMIUM and DRIVER):
        pytest.skip("needs Debian's chromium and chromium-driver (.ci/run installs them)")
    page = _chromium.get()
    yield page
    _chromium.get()


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
    baked, raw = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    listen, metrics = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    run = ["--realtime", "--tasks", "pose", *OFFLINE]
    pipelines = [start_cli(["--source", f"lobby=loop:{long_clip}", *run, "--publish", baked], env=cli_env, cwd=cwd),
                 start_cli(["--source", f"hall=loop:{long_clip}", *run, "--publish", raw, "--publish-raw-frames"],
                        env=cli_env, cwd=cwd)]
    viewer = start_cli(["view", "--endpoint", baked, "--endpoint", raw, "--listen", listen, "--metrics", metrics])
    try:
        wait_http(f"http://{listen}/", [*pipelines, viewer])
        wait_http(f"http://{metrics}/healthz", [*pipelines, viewer])
        yield Streams(baked, raw, listen, metrics, viewer)
    finally:
        stop_all(viewer, *pipelines)


class _Frames(Reader):
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

    wait_page(driver, lambda: driver.find_elements("css selector", f'#source option[value="{source}"]'),
               f"listed {source}")
    Select(driver.find_element("id", "source")).select_by_value(source)
    drawn = int(attr(driver, "data-frames-drawn") or 0)
    wait_page(driver, lambda: attr(driver, "data-source") == source and attr(driver, "data-annotated") != ""
               and int(attr(driver, "data-frames-drawn") or 0) >= drawn + 3, f"drew frames of {source}")


def _caption_agrees_with_the_figures(driver) -> None:
    """The caption, the figures and the keypoints drawn all name the frame shown."""
    index, caption, figure, keypoints = driver.execute_script(
        "const b = document.body.dataset; return [b.lastFrameIndex, document.getElementById('caption').textContent, "
        "document.getElementById('frame').textContent, b.keypointsFrameIndex];")
    assert f"frame {index} " in caption and figure == index, (caption, figure)
    assert keypoints == index or (keypoints == "-1" and "not received: none drawn" in caption), (keypoints, caption)


# -- runs of their own (before the two looping pipelines of `streams` start: a module fixture stays up
# until the module ends, and they would share the CPU with these runs) ----------------------------------
@needs_browser
def test_pipeline_serves_its_own_view_with_a_token(tiny: Path, cli_env: dict[str, str], tmp_path: Path,
                                                  long_clip: Path, driver) -> None:
    listen = f"127.0.0.1:{free_port()}"
    pipeline = start_cli(["--source", f"loop:{long_clip}", "--realtime", "--tasks", "pose", "--keypoints3d", *OFFLINE,
                       "--publish", f"tcp://127.0.0.1:{free_port()}", "--view", listen, "--view-token", "s3cret"],
                      env=cli_env, cwd=tmp_path)
    try:
        wait_http(f"http://{listen}/static/viewer.js", [pipeline])
        assert http_get(f"http://{listen}/")[0] == 401  # no token, no page
        assert http_get(f"http://{listen}/ws")[0] == 401
        assert http_get(f"http://{listen}/static/")[0] == 404  # no directory listing
        assert http_get(f"http://{listen}/static/../pyproject.toml")[0] == 404
        driver.get(f"http://{listen}/?token=s3cret")
        wait_page(driver, lambda: int(attr(driver, "data-frames-drawn") or 0) >= 3, "drew 3 frames")
        assert attr(driver, "data-annotated") == "false"  # raw frames, layers drawn here
        assert not driver.find_element("id", "bakednote").is_displayed()
        assert driver.find_element("id", "agelabel").text == "Capture → publish"  # --realtime: a live source
        # --keypoints3d: the page's 3D panel shows the persons' lifted keypoints, in each plane
        wait_page(driver, lambda: int(attr(driver, "data-drawn3d") or 0) > 0, "drew 3D links")
        assert driver.find_element("id", "space").is_displayed()
        # docs/WIRE.md: metric, but the reference names no unit (metres is a convention, unverified)
        assert "metric (unit not named by the reference: conventionally metres, unverified)" in \
            driver.find_element("id", "spaceunits").text
        driver.find_element("css selector", '#spaceview option[value="top"]').click()
        wait_page(driver, lambda: int(attr(driver, "data-points3d") or 0) > 0, "kept drawing in the top view")
    finally:
        stop_all(pipeline)


@needs_browser
def test_the_documented_command_shows_the_demo_with_layers_and_figures(tiny: Path, cli_env: dict[str, str],
                                                                              tmp_path: Path, driver) -> None:
    """The README's command as a user types it (free ports for 5599 and 8080): the demo on the tiny
    random-weight fallback (pose and seg, no person detector), served by the pipeline itself. The
    page draws the frames, the segmentation layer toggles on the picture, the figures are what the
    pipeline publishes, the page says the whole frame is the one person, and Ctrl-C ends the run
    cleanly. A screenshot with the layers on is kept (out/artifacts/viewer-demo.png) for a person to
    look at."""
    listen, publish = f"127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    pipeline = start_cli(["--source", "demo", "--fallback-tiny", "--publish", publish, "--view", listen],
                      env=cli_env, cwd=tmp_path)
    try:
        wait_http(f"http://{listen}/", [pipeline])
        with _Forwarded(listen) as forwarded:  # the status messages the page gets, as the Python client reads them
            driver.get(f"http://{listen}/")
            wait_page(driver, lambda: int(attr(driver, "data-frames-drawn") or 0) >= 3, "drew 3 frames")
            assert attr(driver, "data-annotated") == "false" and attr(driver, "data-source") == "demo"
            seg = driver.find_element("css selector", 'input[data-layer="seg"]')
            assert not seg.is_selected() and attr(driver, "data-drawn-seg") == "0"
            seg.click()
            wait_page(driver, lambda: attr(driver, "data-drawn-seg") == "1", "drew the segmentation layer")
            seg.click()  # and off again (random weights: the segmentation is noise over the picture)
            wait_page(driver, lambda: attr(driver, "data-drawn-seg") == "0", "hid the segmentation layer")
            face = driver.find_element("css selector", 'input[data-layer="face"]')
            face.click()
            wait_page(driver, lambda: int(attr(driver, "data-drawn-face") or 0) > 0, "drew the face points")
            wait_page(driver, lambda: attr(driver, "data-health") == "ok" and float(attr(driver, "data-fps")) > 0,
                       "showed a status")
            shown_fps = float(attr(driver, "data-fps"))
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
        # a file: its latency runs from the frame's read, and includes its wait in the read-ahead queue
        label = driver.find_element("id", "agelabel")
        assert label.text == "Read → publish" and "read-ahead queue" in label.get_attribute("title"), label.text
        assert driver.find_element("id", "plotlabel").text == "read → publish"
        stages = driver.find_element("id", "stages").text.split()
        assert stages[0] == "queue" and "detect" not in stages, stages  # no detector ran: no detect time
        assert "RANDOM WEIGHTS" in driver.find_element("id", "banner").text
        _caption_agrees_with_the_figures(driver)
        index = int(attr(driver, "data-last-frame-index"))  # more frames: the latency plot has a history
        wait_page(driver, lambda: int(attr(driver, "data-last-frame-index")) >= index + 20
                   or attr(driver, "data-health") == "closed", "showed 20 frames more")
        shot = REPO / "out" / "artifacts" / "viewer-demo.png"
        shot.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(shot))
        # Ctrl-C mid-clip (the end of a source under --view: the next test, on a short clip: the demo's 180
        # frames of 720p took some 80 s more on a loaded 2-core machine).
        pipeline.send_signal(signal.SIGINT)
        _, err = pipeline.communicate(timeout=120)
        assert pipeline.returncode == 0, err
        assert "Traceback" not in err
    finally:
        stop_all(pipeline)


@needs_browser
def test_under_view_the_run_stays_up_after_its_source_ends(tiny: Path, cli_env: dict[str, str], tmp_path: Path,
                                                           driver) -> None:
    """When the clip ends the page keeps its last picture and says the source closed; the view stays up
    until Ctrl-C, which ends the run cleanly."""
    clip = make_video(tmp_path / "short.mp4", n=60, w=96, h=64, fps=10)  # 6 s paced: the page sees it play
    listen = f"127.0.0.1:{free_port()}"
    pipeline = start_cli(["--source", clip, "--realtime", "--tasks", "pose", *OFFLINE, "--publish", f"tcp://127.0.0.1:{free_port()}",
                          "--view", listen], env=cli_env, cwd=tmp_path)
    try:
        wait_http(f"http://{listen}/", [pipeline])
        driver.get(f"http://{listen}/")
        wait_page(driver, lambda: int(attr(driver, "data-frames-drawn") or 0) >= 3, "drew 3 frames")
        drawn = int(attr(driver, "data-frames-drawn"))
        wait_page(driver, lambda: attr(driver, "data-health") == "closed", "showed the end of the clip")
        assert pipeline.poll() is None, "the view went away with the clip"
        assert int(attr(driver, "data-frames-drawn")) >= drawn, "the page lost the clip's last picture"
        assert driver.find_element("id", "health").text == "closed"
        pipeline.send_signal(signal.SIGINT)
        _, err = pipeline.communicate(timeout=120)
        assert pipeline.returncode == 0, err
        assert "the web view stays up" in err and "Traceback" not in err
    finally:
        stop_all(pipeline)


# A person standing at the origin, facing +X (x forward, y left, z up, metres): the 15 body joints
# and the wrists; the other 291 keypoints (feet, hands, face, extra) are sent as not valid.
_JOINTS = {
    "nose": (0.10, 0.00, 1.62), "left_eye": (0.08, 0.03, 1.66), "right_eye": (0.08, -0.03, 1.66),
    "left_ear": (0.00, 0.08, 1.63), "right_ear": (0.00, -0.08, 1.63),
    "left_shoulder": (0.00, 0.19, 1.42), "right_shoulder": (0.00, -0.19, 1.42),
    "left_elbow": (0.02, 0.24, 1.14), "right_elbow": (0.02, -0.24, 1.14),
    "left_wrist": (0.05, 0.26, 0.88), "right_wrist": (0.05, -0.26, 0.88),
    "left_hip": (0.00, 0.11, 0.95), "right_hip": (0.00, -0.11, 0.95),
    "left_knee": (0.03, 0.11, 0.52), "right_knee": (0.03, -0.11, 0.52),
    "left_ankle": (0.00, 0.11, 0.08), "right_ankle": (0.00, -0.11, 0.08),
}


@dataclass
class _World:
    """Two persons of a rig's world step: id 7 at (1.2, 0.4) whole, id 12 at (-0.6, 1.5) without its
    left arm (not valid), and what the page must draw of them."""

    fields: dict
    parts: list
    points: int  # valid points
    links: int  # skeleton links between two valid points


def _world() -> _World:
    from sapiens2_client import wire
    from stages.metadata import load_metadata

    meta = load_metadata()
    names, k = [str(n) for n in meta.keypoint_names], meta.num_keypoints
    xyz, valid = np.zeros((2, k, 3), np.float32), np.zeros((2, k), np.uint8)
    for p, (at, missing) in enumerate([((1.2, 0.4), ()), ((-0.6, 1.5), ("left_elbow", "left_wrist"))]):
        for name, (x, y, z) in _JOINTS.items():
            if name not in missing:
                i = names.index(name)
                xyz[p, i], valid[p, i] = (x + at[0], y + at[1], z), 1
    members = np.array([[0, 1, -1], [1, -1, 0]], np.int32)
    parts = [wire.Part("world_keypoints", xyz), wire.Part("world_valid", valid),
             wire.Part("world_error", valid * np.float32(0.6)), wire.Part("world_views", valid * 2),
             wire.Part("world_ids", np.array([7, 12], np.int64)), wire.Part("world_members", members),
             wire.Part("single_view", np.array([[2, 1]], np.int32))]
    fields = {"num_persons": 2, "num_keypoints": k, "units": "m", "cameras": ["cam0", "cam1", "cam2"],
              "camera_frames": {"cam0": 40, "cam1": 41}}
    links = sum(bool(valid[p, a] and valid[p, b]) for p in range(2) for a, b in meta.skeleton_links.tolist())
    return _World(fields, parts, int(valid.sum()), links)


class _WorldRig(Reader):
    """A rig's publisher as the pipeline's is to a subscriber: ``wire.encode`` on a real XPUB socket,
    a world step every 0.1 s (the same persons, standing still) until the with-block ends."""

    def __init__(self, world: _World) -> None:
        import zmq

        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.XPUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.endpoint = f"tcp://127.0.0.1:{self.sock.bind_to_random_port('tcp://127.0.0.1')}"
        self.world, self.sent = world, 0
        super().__init__(self._run)

    def _run(self) -> None:
        from sapiens2_client import wire

        while not self._stop.wait(0.1):
            meta = wire.meta_fields(wire.FrameMeta("rig", self.sent, capture_ns=time.time_ns(),
                                                   latency_ms={"triangulate": 0.8}))
            self.sock.send_multipart(wire.encode("world", "rig", {**meta, **self.world.fields}, self.world.parts,
                                                 publish_ns=time.time_ns()))
            self.sent += 1

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        self.sock.close()
        self.ctx.term()


async def _world_topics(url: str, source: str, count: int) -> list[str]:
    """The topics a WebSocket client of the viewer that shows camera ``source`` gets, until ``count``
    world messages came (or 60 s)."""
    import aiohttp

    topics: list[str] = []
    deadline = time.monotonic() + 60
    async with aiohttp.ClientSession() as session, session.ws_connect(f"{url}/ws") as ws:
        await ws.send_str(json.dumps({"source": source}))
        while sum(t.startswith("world.") for t in topics) < count and time.monotonic() < deadline:
            msg = await ws.receive(timeout=30)
            assert msg.type == aiohttp.WSMsgType.BINARY, msg
            topics.append(unpack_frames(msg.data)[0].decode())
    return topics


def _world_canvas(driver) -> bytes:
    return base64.b64decode(driver.execute_script(
        "return document.getElementById('world3d').toDataURL('image/png');").split(",", 1)[1])


@needs_browser
def test_the_world_steps_of_a_rig_are_drawn_in_3d_and_turn_with_a_drag(driver) -> None:
    """A rig's world messages reach the page (a viewer forwards them to every browser), which draws
    the valid points and the skeleton links between them in 3D with a floor grid, axes and the
    person ids; a drag turns the view; with no world message for a while the panel hides again.
    The panel's picture is kept (out/artifacts/world3d.png, the source of docs/world3d.png)."""
    from selenium.webdriver.common.action_chains import ActionChains

    from pipeline.viewer.server import ViewServer

    world = _world()
    rig = _WorldRig(world)
    viewer = ViewServer([rig.endpoint], listen="127.0.0.1:0").start()
    try:
        driver.get(f"{viewer.url}/")
        wait_page(driver, lambda: driver.find_element("id", "connection").text == "connected", "connected")
        assert not driver.find_element("id", "world").is_displayed()  # no world message yet: no panel
        with rig:
            wait_page(driver, lambda: attr(driver, "data-world-shown") == "true", "showed the world panel")
            wait_page(driver, lambda: int(attr(driver, "data-world-frame-index") or -1) >= 2, "drew 3 world steps")
            assert driver.find_element("id", "world").is_displayed()
            assert attr(driver, "data-world-rig") == "rig" and attr(driver, "data-world-persons") == "2"
            assert attr(driver, "data-world-ids") == "7,12"
            assert int(attr(driver, "data-world-points")) == world.points == 32  # 17 + 15: invalid ones not drawn
            assert int(attr(driver, "data-world-links")) == world.links
            hint = driver.find_element("id", "worldhint").text
            assert "2 persons" in hint and "metres, Z up" in hint and "2/3 cameras (no frame: cam2)" in hint, hint
            assert "1 seen by one camera only" in hint, hint
            assert not driver.find_elements("css selector", '#source option[value="rig"]')  # a rig is no camera
            assert attr(driver, "data-refused") == "0"
            topics = asyncio.run(_world_topics(viewer.url, "cam0", 3))  # a page showing a camera gets them too
            assert topics.count("world.rig") >= 3, topics
            canvas = driver.find_element("id", "world3d")
            shot = REPO / "out" / "artifacts" / "world3d.png"  # the source of docs/world3d.png
            shot.parent.mkdir(parents=True, exist_ok=True)
            driver.execute_script("document.getElementById('world').scrollIntoView();")
            driver.find_element("id", "world").screenshot(str(shot))
            before, yaw, pitch = _world_canvas(driver), attr(driver, "data-world-yaw"), attr(driver, "data-world-pitch")
            ActionChains(driver).drag_and_drop_by_offset(canvas, 90, 40).perform()
            wait_page(driver, lambda: attr(driver, "data-world-yaw") != yaw, "turned the view with a drag")
            assert attr(driver, "data-world-pitch") != pitch
            # the persons stand still: only the turn can have changed the picture
            wait_page(driver, lambda: _world_canvas(driver) != before, "drew the turned view")
        wait_page(driver, lambda: not driver.find_element("id", "world").is_displayed(),
                  "hid the world panel once the rig stopped")
        assert Image.open(shot).size[0] >= 300
        # A page that is left closes its WebSocket (Chromium keeps a left page, and its socket, in its
        # back/forward cache for minutes: the viewer would go on sending to it).
        driver.get("about:blank")
        deadline = time.monotonic() + 60
        while viewer.stats.clients:
            assert time.monotonic() < deadline, "the page left for about:blank still holds its WebSocket"
            time.sleep(0.1)
    finally:
        viewer.close()


# -- two looping pipelines and a viewer (the module fixture `streams`) --------------------------------------
def test_view_metrics_are_the_pipelines_figures(streams: Streams) -> None:
    """``view --metrics`` serves the pipelines' own figures from their messages, with no browser open."""
    deadline = time.monotonic() + 120
    while http_get(f"http://{streams.metrics}/readyz")[0] != 200:
        assert time.monotonic() < deadline, "the viewer never heard a publisher"
        time.sleep(0.2)

    def has(scrape: dict, name: str, labels: tuple) -> float:
        return scrape.get(name, {}).get(labels, 0)

    lobby, hall = (("source", "lobby"),), (("source", "hall"),)

    def counted(scrape: dict) -> bool:  # both pipelines heard from (the second may load its models later)
        return has(scrape, "sapiens2_stage_latency_seconds_count", (("stage", "pose"),)) > 0 and all(
            has(scrape, "sapiens2_frames_total", source) > 0
            and has(scrape, "sapiens2_capture_to_publish_seconds_count", source) > 0 for source in (lobby, hall))

    while not counted(first := scrape(streams.metrics)):
        assert time.monotonic() < deadline, f"no frames counted for both sources: {first}"
        time.sleep(0.3)
    while True:
        second = scrape(streams.metrics)
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
def test_annotated_frames_are_shown_as_published_and_their_layers_locked(streams: Streams, driver) -> None:
    statuses: list[StatusMessage] = []
    driver.get(f"http://{streams.listen}/")
    _show(driver, "lobby")
    with Subscriber(streams.baked, ["status"]) as sub:  # what the pipeline itself says, to compare with the page
        wait_page(driver, lambda: attr(driver, "data-health") == "ok", "showed the health")
        deadline = time.monotonic() + 60
        while len(statuses) < 3 and time.monotonic() < deadline:
            try:
                msg = sub.recv(timeout_s=1.0)
            except ReceiveTimeout:
                continue
            if isinstance(msg, StatusMessage):
                statuses.append(msg)
        shown_fps = float(attr(driver, "data-fps"))
        assert any(abs(shown_fps - s.fps) < 0.01 for s in statuses[-3:]) or _published_later(sub, shown_fps), \
            f"the page shows {shown_fps} fps, the pipeline published {[s.fps for s in statuses]}"
    assert driver.find_element("id", "health").text == "ok"
    assert "RANDOM WEIGHTS" in driver.find_element("id", "banner").text  # the page says what it shows
    assert int(attr(driver, "data-refused")) == 0
    # The pipeline drew the overlays: the page says so, greys the toggles and draws nothing over them.
    assert attr(driver, "data-annotated") == "true"
    note = driver.find_element("id", "bakednote")
    assert note.is_displayed() and "--publish-raw-frames" in note.text
    boxes = driver.find_elements("css selector", "#layers input")
    assert boxes and not any(box.is_enabled() for box in boxes)
    assert driver.find_element("css selector", 'input[data-layer="boxes"]').is_selected()
    with _Frames(streams.baked, "lobby") as frames:
        assert _differing(driver, frames) < 0.002, "the page drew over the pipeline's annotated picture"
    assert attr(driver, "data-drawn-boxes") == "0" and attr(driver, "data-drawn-links") == "0"
    _caption_agrees_with_the_figures(driver)


@needs_browser
def test_raw_frames_get_the_layers_drawn_here_and_toggled(streams: Streams, driver) -> None:
    driver.get(f"http://{streams.listen}/")
    _show(driver, "hall")
    assert attr(driver, "data-annotated") == "false"
    assert not driver.find_element("id", "bakednote").is_displayed()
    assert all(box.is_enabled() for box in driver.find_elements("css selector", "#layers input"))
    # A layer toggle changes what is drawn: face points appear when switched on.
    face = driver.find_element("css selector", 'input[data-layer="face"]')
    assert not face.is_selected() and attr(driver, "data-drawn-face") == "0"
    face.click()
    wait_page(driver, lambda: int(attr(driver, "data-drawn-face") or 0) > 0, "drew face points")
    assert "face" in attr(driver, "data-layers").split(",")
    _caption_agrees_with_the_figures(driver)
    with _Frames(streams.raw, "hall") as frames:
        wait_page(driver, lambda: attr(driver, "data-keypoints-frame-index") == attr(
            driver, "data-last-frame-index"), "drew the keypoints of the frame shown")
        layered = _differing(driver, frames)
        assert layered > 0.003, f"with boxes, skeleton and face on, only {layered:.2%} of the picture changed"
        for layer in ("skeleton", "hands", "face", "boxes", "ids"):
            box = driver.find_element("css selector", f'input[data-layer="{layer}"]')
            if box.is_selected():
                box.click()
        wait_page(driver, lambda: attr(driver, "data-drawn-boxes") == "0" and attr(
            driver, "data-drawn-face") == "0", "hid the layers")
        bare = _differing(driver, frames)
        assert bare < 0.002, f"with every layer off, {bare:.2%} of the picture differs from the published frame"
    shot = REPO / "out" / "artifacts" / "viewer.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(shot))
    assert shot.stat().st_size > 20_000
    # This page is the viewer's one client (the page of the test before closed its socket when it was
    # left for about:blank in the shared browser; the server may count it for a moment more).
    wait_page(driver, lambda: json.loads(http_get(f"http://{streams.listen}/stats.json")[1])["clients"] == 1,
              "was the viewer's one client", 60)


def test_a_browser_gets_the_pictures_of_its_source_only(streams: Streams) -> None:
    """Pictures of the source the page picked; keypoints and status of every source; no deflate."""
    import aiohttp

    async def listen() -> tuple[list[str], int]:
        topics: list[str] = []
        async with aiohttp.ClientSession() as session, session.ws_connect(f"http://{streams.listen}/ws") as ws:
            compress = ws.compress
            await ws.send_str(json.dumps({"source": "hall"}))
            # What was on its way before the page said which source still comes first: once 20 pictures
            # in a row are of hall, the next 40 messages are what the test looks at (pictures of every
            # source, as before the choice, never give 20 in a row of one: the deadline fails it).
            deadline, run = time.monotonic() + 120, 0
            while len(topics) < 40:
                assert time.monotonic() < deadline, f"{run} pictures of hall in a row, then {sorted(set(topics))}"
                msg = await ws.receive(timeout=30)
                assert msg.type == aiohttp.WSMsgType.BINARY, msg
                topic = unpack_frames(msg.data)[0].decode()
                if run >= 20:
                    topics.append(topic)
                elif topic.split(".")[0] in ("frame", "seg", "matte"):
                    run = run + 1 if topic == "frame.hall" else 0
        return topics, compress

    topics, compress = asyncio.run(listen())
    assert compress == 0, "JPEG frames must not be deflated again"
    assert "frame.hall" in topics and "frame.lobby" not in topics, sorted(set(topics))
    assert {"keypoints.hall", "keypoints.lobby"} <= set(topics), sorted(set(topics))


class _Forwarded(Reader):
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
                frames = unpack_frames(msg.data)
                if frames[0].startswith(b"status."):
                    self.statuses.append(decode_message(frames))


def _unread(sock: socket.socket) -> int:
    """Bytes in a socket's receive buffer that nobody has read yet."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]


def test_the_viewer_stops_cleanly_with_a_stalled_browser(streams: Streams) -> None:
    """A browser that stops reading (a busy tab) while frames flow: the viewer still stops at once,
    with every send ended and no task left pending (asyncio's "Task was destroyed")."""
    listen = f"127.0.0.1:{free_port()}"
    viewer = start_cli(["view", "--endpoint", streams.baked, "--endpoint", streams.raw, "--listen", listen])
    try:
        wait_http(f"http://{listen}/", [viewer])
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
            # Frames queue up behind the stalled reader: this tab's receive buffer holds a full window.
            window = tab.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 2
            deadline = time.monotonic() + 60
            while _unread(tab) < window:
                assert time.monotonic() < deadline and viewer.poll() is None, \
                    f"frames did not queue up for the stalled tab ({_unread(tab)} bytes unread)"
                time.sleep(0.05)
            viewer.send_signal(signal.SIGINT)
            _, err = viewer.communicate(timeout=60)  # (a hang; waiting on the stalled send is said, below)
        assert viewer.returncode == 0, err
        assert "Task was destroyed" not in err and "Traceback" not in err and "ERROR" not in err, err
        assert "did not finish" not in err, err  # its shutdown gave up waiting (10 s) instead of stopping the send
    finally:
        stop_all(viewer)


@needs_browser
def test_the_viewer_stops_cleanly_with_a_page_open(streams: Streams, driver) -> None:
    listen = f"127.0.0.1:{free_port()}"
    viewer = start_cli(["view", "--endpoint", streams.baked, "--endpoint", streams.raw, "--listen", listen])
    try:
        wait_http(f"http://{listen}/", [viewer])
        driver.get(f"http://{listen}/")
        wait_page(driver, lambda: int(attr(driver, "data-frames-drawn") or 0) >= 10, "drew 10 frames")
        viewer.send_signal(signal.SIGINT)  # while frames flow to the page
        _, err = viewer.communicate(timeout=60)
        assert viewer.returncode == 0, err
        assert "Task was destroyed" not in err and "Traceback" not in err and "ERROR" not in err, err
    finally:
        stop_all(viewer)


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
