"""Sources: real PyAV files, images, the demo clip, and the live policy with a synthetic camera."""

from __future__ import annotations

import functools
import http.server
import os
import threading
import time
from pathlib import Path

import av
import cv2
import numpy as np
import pytest

from pipeline.sources import Source, SourceEnded, SourceError, open_source
from pipeline.sources.demo import SyntheticCamera
from stages.types import Frame

pytestmark = pytest.mark.timeout(30)


def make_video(path: Path, n: int = 20, w: int = 64, h: int = 48, fps: int = 30, faststart: bool = False) -> Path:
    """Encode ``n`` flat frames whose gray level is 10 * index."""
    options = {"movflags": "faststart"} if faststart else {}
    with av.open(str(path), "w", options=options) as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        for i in range(n):
            image = np.full((h, w, 3), (10 * i) % 256, np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def drain(source: Source, budget_s: float = 10.0) -> list[Frame]:
    """Read until SourceEnded; fail (not hang) if it takes longer than ``budget_s``."""
    frames: list[Frame] = []
    deadline = time.monotonic() + budget_s
    while True:
        assert time.monotonic() < deadline, "source did not end in time"
        try:
            frame = source.read(timeout=1.0)
        except SourceEnded:
            return frames
        if frame is not None:
            frames.append(frame)


def wait_for(predicate, budget_s: float = 30.0) -> bool:
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_file_delivers_every_frame_in_order(tmp_path: Path) -> None:
    path = make_video(tmp_path / "clip.mp4", n=20)
    before = time.time_ns()
    with open_source(str(path)) as source:
        assert (source.info.width, source.info.height, source.info.live) == (64, 48, False)
        assert source.info.fps == pytest.approx(30.0)
        frames = drain(source)
        with pytest.raises(SourceEnded):  # stays ended
            source.read(timeout=0.1)
    assert [f.index for f in frames] == list(range(20))
    assert all(f.image.shape == (48, 64, 3) and f.image.dtype == np.uint8 for f in frames)
    assert [round(float(f.image.mean()) / 10) for f in frames] == list(range(20))  # content in order
    pts = [f.pts for f in frames]
    assert pts == sorted(pts) and len(set(pts)) == 20
    assert frames[1].pts * frames[1].time_base == pytest.approx(1 / 30, abs=1e-3)
    assert all(before <= f.capture_ns <= time.time_ns() for f in frames)
    assert source.frames_decoded == source.frames_delivered == 20 and source.frames_dropped == 0
    assert source.health == "ended"


def test_looping_file_never_ends_and_its_clock_keeps_rising(tmp_path: Path) -> None:
    path = make_video(tmp_path / "clip.mp4", n=5)
    frames: list[Frame] = []
    with open_source(f"loop:{path}", source_id="lobby") as source:
        assert source.info.source_id == "lobby" and source.info.width == 64
        deadline = time.monotonic() + 20
        while len(frames) < 13:  # two and a half passes
            assert time.monotonic() < deadline, "the looping file stopped delivering"
            frame = source.read(timeout=1.0)
            if frame is not None:
                frames.append(frame)
        assert source.health == "ok"
    assert [f.index for f in frames] == list(range(13))
    assert [round(float(f.image.mean()) / 10) for f in frames] == [0, 1, 2, 3, 4] * 2 + [0, 1, 2]
    pts = [f.pts for f in frames]
    assert all(b > a for a, b in zip(pts, pts[1:])), pts  # one continuous stream across the restarts
    step = frames[1].pts - frames[0].pts
    assert frames[5].pts - frames[4].pts == step and frames[10].pts - frames[9].pts == step


def test_looping_missing_file_fails_clearly(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="no such file"):
        open_source(f"loop:{tmp_path / 'missing.mp4'}")


def test_file_with_slow_consumer_drops_nothing(tmp_path: Path) -> None:
    path = make_video(tmp_path / "clip.mp4", n=12)
    with open_source(str(path), queue_size=2) as source:
        frames = []
        for _ in range(12):
            time.sleep(0.02)
            frames.append(source.read(timeout=2.0))
        assert [f.index for f in frames] == list(range(12))
        with pytest.raises(SourceEnded):
            source.read(timeout=2.0)
    assert source.frames_dropped == 0


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize(
    "kind, message",
    [
        ("missing", "no such file"),
        ("empty", "empty"),
        ("garbage", "cannot open"),
        ("truncated", "cannot open"),  # moov atom at the end is gone
        ("truncated_faststart", "truncated, corrupt|truncated or corrupt"),  # index intact, frame data gone
        ("text", "cannot open"),
    ],
)
def test_bad_files_fail_with_one_clear_error(tmp_path: Path, kind: str, message: str) -> None:
    path = tmp_path / "bad.mp4"
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "garbage":
        path.write_bytes(os.urandom(20_000))
    elif kind == "text":
        path.write_text("this is not a video\n" * 100)
    elif kind.startswith("truncated"):
        make_video(path, n=30, faststart=kind.endswith("faststart"))
        _truncate(path)
    with pytest.raises(SourceError, match=message) as info:
        with open_source(str(path)) as source:
            drain(source)
    assert str(path) in str(info.value)
    assert "no frame within" not in str(info.value)  # the reader's own error, not a timeout that ran out


def test_camera_that_does_not_exist_fails_clearly() -> None:
    if Path("/dev/video7").exists():
        pytest.skip("this machine has a /dev/video7")
    with pytest.raises(SourceError, match="no such device"):
        open_source("webcam:7")
    with pytest.raises(SourceError, match="no such device"):
        open_source("/dev/video7")


@pytest.mark.parametrize("spec", ["webcam:x", "webcam:", "/dev/videoX"])
def test_bad_camera_specs(spec: str) -> None:
    with pytest.raises(SourceError, match="bad camera spec"):
        open_source(spec)


def _write_images(folder: Path, count: int) -> list[Path]:
    folder.mkdir()
    paths = []
    for i in range(count):
        path = folder / f"img_{i:02d}.png"
        cv2.imwrite(str(path), np.full((30 + 2 * i, 40, 3), (0, 0, 50 * (i + 1)), np.uint8))  # BGR: red
        paths.append(path)
    (folder / "notes.txt").write_text("not an image")
    return paths


def test_image_folder_glob_and_single_image(tmp_path: Path) -> None:
    paths = _write_images(tmp_path / "imgs", 3)
    for spec in [str(tmp_path / "imgs"), str(tmp_path / "imgs" / "img_*.png")]:
        with open_source(spec) as source:
            frames = drain(source)
        assert [f.index for f in frames] == [0, 1, 2]
        assert [f.image.shape[0] for f in frames] == [30, 32, 34]  # sorted by name
        assert [int(f.image[0, 0, 0]) for f in frames] == [50, 100, 150]  # RGB order
    with open_source(str(paths[1])) as source:
        frames = drain(source)
    assert len(frames) == 1 and frames[0].image.shape == (32, 40, 3)


def test_bad_images_fail_clearly(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="no images found"):
        open_source(str(tmp_path / "empty"))
    with pytest.raises(SourceError, match="no such file"):
        open_source(str(tmp_path / "missing.jpg"))
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"\xff\xd8 not really a jpeg")
    with pytest.raises(SourceError, match="cannot decode image"):
        open_source(str(bad))


def test_demo_clip_looks_like_photos() -> None:
    with open_source("demo") as source:
        assert (source.info.width, source.info.height, source.info.fps) == (1280, 720, 30.0)
        frames = drain(source, budget_s=20.0)
    assert len(frames) == 180  # 6 s at 30 fps
    assert all(f.image.shape == (720, 1280, 3) for f in frames)
    first, last = frames[0].image, frames[-1].image
    assert first.std() > 30 and last.std() > 30  # textured photos, not flat fills
    assert len(np.unique(first.reshape(-1, 3), axis=0)) > 10_000
    assert np.abs(frames[10].image.astype(int) - frames[11].image.astype(int)).mean() > 0.1  # it moves
    assert np.abs(first.astype(int) - last.astype(int)).mean() > 20  # a different photo at the end
    assert [f.pts for f in frames] == list(range(180))


def test_realtime_file_is_paced_and_live(tmp_path: Path) -> None:
    path = make_video(tmp_path / "clip.mp4", n=15, fps=30)
    start = time.monotonic()
    with open_source(str(path), realtime=True) as source:
        assert source.info.live
        frames = drain(source)
    elapsed = time.monotonic() - start
    assert elapsed >= 14 / 30  # paced: 15 frames at 30 fps cannot take less (load only makes it longer)
    assert len(frames) + source.frames_dropped == 15 and frames  # live policy: what the consumer missed is counted
    captured = [f.capture_ns / 1e9 for f in frames]
    # Never released ahead of the file's own clock, counted from the first frame (a frame released late
    # under load is followed by the next one at once, when it is due: a pair may be close, the schedule
    # never early). 0.1 s covers the first frame's own late delivery; an unpaced file is ~0.45 s early.
    for frame in frames[1:]:
        assert (frame.capture_ns - frames[0].capture_ns) / 1e9 >= (frame.index - frames[0].index) / 30 - 0.1
    assert captured == sorted(captured)


def test_live_source_with_slow_consumer_keeps_latency_bounded() -> None:
    camera = SyntheticCamera(fps=500.0)
    source = Source(camera.open, label="synthetic", live=True, reconnect=True, stall_timeout_s=2.0)
    latencies, frames = [], []
    with source:
        for _ in range(25):
            time.sleep(0.02)  # a consumer 10x slower than the camera
            frame = source.read(timeout=1.0)
            assert frame is not None
            latencies.append((time.time_ns() - frame.capture_ns) / 1e9)
            frames.append(frame)
    indices = [f.index for f in frames]
    assert indices == sorted(indices) and len(set(indices)) == len(indices)
    assert indices[-1] - indices[0] > len(indices)  # gaps: we see only the newest frames
    assert source.frames_dropped > 0
    assert source.frames_decoded >= source.frames_delivered + source.frames_dropped
    assert source.reopens == 0
    del latencies  # the bound on staleness is shown without a clock in test_newest_frame_wins_the_mailbox


def test_newest_frame_wins_the_mailbox() -> None:
    """The live policy, step by step: an unread frame is replaced (and counted); a reader only ever gets
    the newest frame there is, so staleness is bounded by one frame, whatever the load."""
    from pipeline.sources.flow import Channel

    channel = Channel(8, latest_wins=True)
    frame = lambda i: Frame(i, np.zeros((2, 2, 3), np.uint8), i, None, i)  # noqa: E731
    never = lambda: False  # noqa: E731
    assert [channel.put(frame(i), never) for i in range(5)] == [False, True, True, True, True]
    assert channel.get(0).index == 4 and channel.get(0) is None  # only the newest was kept
    assert channel.put(frame(5), never) is False  # read in time: nothing dropped
    assert channel.get(0).index == 5
    ordered = Channel(2, latest_wins=False)  # files: a full queue makes the writer wait instead
    assert ordered.put(frame(0), never) is False and ordered.put(frame(1), never) is False
    assert ordered.put(frame(2), lambda: True) is False and ordered.get(0).index == 0  # cancelled, nothing lost


@pytest.mark.parametrize("refuse_opens", [False, True])
def test_stalled_live_source_is_reopened(refuse_opens: bool) -> None:
    camera = SyntheticCamera(fps=200.0)
    source = Source(camera.open, label="synthetic", live=True, reconnect=True, stall_timeout_s=0.2,
                    open_timeout_s=0.5, backoff_initial_s=0.05, backoff_max_s=0.2)
    with source:
        before = [source.read(timeout=1.0) for _ in range(5)]
        assert all(f is not None for f in before) and source.health == "ok"
        camera.stall(refuse_opens=refuse_opens)
        assert wait_for(lambda: source.health in ("stalled", "reconnecting"))
        time.sleep(0.6)  # outage longer than the stall timeout; reads just time out meanwhile
        assert source.health in ("stalled", "reconnecting")
        while source.read(timeout=0.01) is not None:  # empty the mailbox of pre-stall frames
            pass
        assert source.read(timeout=0.1) is None
        camera.resume()
        after = None
        deadline = time.monotonic() + 5.0
        while after is None and time.monotonic() < deadline:
            after = source.read(timeout=0.2)
        assert after is not None, "source did not come back after the camera resumed"
        assert after.index > before[-1].index
        # Frames carry the session they were decoded in: the reopened stream is a new one.
        assert {f.session for f in before} == {0} and after.session >= 1
        assert wait_for(lambda: source.health == "ok")
        assert source.reopens >= 1 and camera.opens >= 2
    assert source.health == "ended"


def test_stop_is_prompt_with_a_full_queue(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = make_video(tmp_path / "clip.mp4", n=60)
    source = open_source(str(path), queue_size=2).start()
    assert wait_for(lambda: len(source._channel._items) == 2)  # the decode thread now waits on the full queue
    with caplog.at_level("WARNING"):
        source.stop()
    assert not source._thread.is_alive()  # it saw the stop while waiting: stop() did not abandon it
    assert "abandoning it" not in caplog.text
    with pytest.raises(SourceEnded):
        for _ in range(10):
            source.read(timeout=0.1)
    source.stop()  # idempotent


def test_http_stream_is_live(tmp_path: Path) -> None:
    make_video(tmp_path / "clip.mp4", n=30, faststart=True)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *args: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/clip.mp4"
        with open_source(url, stall_timeout_s=2.0, open_timeout_s=5.0) as source:
            assert source.info.live and source.info.source_id == "stream"
            frame = source.read(timeout=5.0)
            assert frame is not None and frame.image.shape == (48, 64, 3)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5.0)


def test_open_that_hangs_times_out_with_a_clear_error() -> None:
    camera = SyntheticCamera()
    camera.stall()  # opens succeed but no frame ever arrives
    source = Source(camera.open, label="synthetic", live=True, reconnect=True, open_timeout_s=0.3)
    start = time.monotonic()
    with pytest.raises(SourceError, match="no frame within 0.3 s"):
        source.open()
    assert time.monotonic() - start < 10.0  # the 0.3 s timeout ended it, not the default 15 s (generous: load)
    source.stop()


def test_a_signal_while_the_decode_thread_starts_leaves_a_source_that_stops(monkeypatch) -> None:
    """Ctrl-C or SIGTERM (a KeyboardInterrupt) raised inside Thread.start: stop() afterwards ends the source
    instead of raising "cannot join thread before it is started" (calibrate on live cameras did)."""
    import threading

    from pipeline.sources import open_source

    source = open_source("demo")
    source.open()

    def interrupted(thread) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(threading.Thread, "start", interrupted)
        with pytest.raises(KeyboardInterrupt):
            source.start()
    source.stop()
    assert source.health == "ended"
