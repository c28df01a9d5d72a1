"""The viewer's and the pipeline's HTTP side without a browser: Prometheus metrics and health scraped
for real, the origin checks against other sites' pages, a viewer that cannot listen, a CURVE
publisher read with its keys only. (The page in a browser: test_viewer.py.)"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sapiens2_client import wire
from tests.cliutil import CLI, OFFLINE
from tests.viewerutil import free_port, http_get, make_long_clip, scrape, start_cli, stop_all, wait_http

pytestmark = [pytest.mark.timeout(420)]


@pytest.fixture(scope="module")
def long_clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_long_clip(tmp_path_factory)


def test_metrics_grow_and_health_says_ready(tiny: Path, cli_env: dict[str, str], tmp_path: Path,
                                           long_clip: Path) -> None:
    listen = f"127.0.0.1:{free_port()}"
    pipeline = start_cli(["--source", f"hall=loop:{long_clip}", "--realtime",
                          "--source", f"gone={tmp_path / 'missing.mp4'}",
                       "--tasks", "pose", *OFFLINE, "--metrics", listen, "--publish", f"tcp://127.0.0.1:{free_port()}"],
                      env=cli_env, cwd=tmp_path)
    try:
        wait_http(f"http://{listen}/healthz", [pipeline])
        deadline = time.monotonic() + 180
        while http_get(f"http://{listen}/readyz")[0] != 200:  # 503 while the models load, then ready
            assert pipeline.poll() is None and time.monotonic() < deadline, pipeline.communicate()[1]
            time.sleep(0.2)
        first = scrape(listen)
        # every series exists from the start, at 0 until something happens; a source that never
        # opened is there too, down
        assert first["sapiens2_source_up"][(("source", "gone"),)] == 0
        for name in ("sapiens2_source_reopens_total", "sapiens2_decode_errors_total", "sapiens2_frames_dropped_total"):
            assert (("source", "hall"),) in first[name], (name, first.get(name))
        # (one series per kind the wire has, the world's included)
        assert set(first["sapiens2_publisher_dropped_total"]) == {(("kind", kind),) for kind in wire.KINDS}
        frames = first["sapiens2_frames_total"][(("source", "hall"),)]
        while scrape(listen)["sapiens2_frames_total"][(("source", "hall"),)] <= frames:
            assert time.monotonic() < deadline, "the frame counter did not grow"
            time.sleep(0.3)
        second = scrape(listen)
        assert second["sapiens2_stage_latency_seconds_count"][(("stage", "pose"),)] > \
            first["sapiens2_stage_latency_seconds_count"].get((("stage", "pose"),), 0)
        assert second["sapiens2_capture_to_output_seconds_count"][(("source", "hall"),)] > 0
        assert second["sapiens2_source_up"][(("source", "hall"),)] == 1
        info = next(labels for labels in second["sapiens2_model_info"])
        assert ("random_weights", "true") in info and ("tasks", "pose") in info
        assert ("dtype", "float32") in info, info  # what the stages compute in, not the setting ("auto")
        assert "sapiens2_subscribers" in second and "sapiens2_frames_dropped_total" in second
        assert http_get(f"http://{listen}/healthz")[0] == 200
    finally:
        stop_all(pipeline)


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
        assert http_get(url) == (200, "starting\n")
        metrics.loop_started()
        assert http_get(url)[0] == 200
        metrics.heartbeat = time.monotonic() - 2 * HEARTBEAT_S  # the loop stopped beating
        assert http_get(url)[0] == 503
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
        received = json.loads(http_get(f"http://{listen}/stats.json")[1])["received"]
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
    with_keys, without = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    viewers = [start_cli(["view", "--endpoint", publisher.endpoint, "--keys", keys, "--listen", with_keys]),
               start_cli(["view", "--endpoint", publisher.endpoint, "--listen", without])]
    try:
        wait_http(f"http://{with_keys}/", viewers)
        wait_http(f"http://{without}/", viewers)
        assert _viewer_heard(with_keys, viewers[0], 60) > 0, "the viewer with the keys heard nothing"
        assert _viewer_heard(without, viewers[1], 3) == 0, "a viewer without the keys read an encrypted stream"
    finally:
        stop_all(*viewers)
        publisher.close()


def test_a_viewer_off_loopback_without_a_token_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    from pipeline.viewer.server import ViewServer

    with caplog.at_level("WARNING", "pipeline.viewer.server"):
        ViewServer(["tcp://127.0.0.1:9"], listen="0.0.0.0:0", token="t")
        assert "no --view-token" not in caplog.text  # a token: nothing to warn about
        ViewServer(["tcp://127.0.0.1:9"], listen="0.0.0.0:0")
    assert "has no --view-token: anyone who reaches it sees the streams" in caplog.text
