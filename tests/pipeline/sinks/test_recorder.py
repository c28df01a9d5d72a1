"""VideoRecorder: real encodes, decoded back with PyAV."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from pipeline.sinks.recorder import RecorderError, VideoRecorder
from stages.types import Frame, FrameResult, StreamInfo

pytestmark = pytest.mark.timeout(30)

TB = Fraction(1, 30)


def result(index: int, pts: int | None, *, w: int = 64, h: int = 48, capture_ns: int = 0,
           annotated: bool = False, time_base: Fraction | None = TB) -> FrameResult:
    image = np.full((h, w, 3), (index * 25) % 256, np.uint8)
    frame = Frame(index, image, pts, time_base if pts is not None else None, capture_ns or index * 33_333_333)
    out = FrameResult(frame)
    if annotated:
        out.annotated = np.full_like(image, 200)
    return out


def info(live: bool = False, w: int = 64, h: int = 48) -> StreamInfo:
    return StreamInfo("test", w, h, 30.0, TB, live)


def decode(path: Path) -> tuple[list[float], list[np.ndarray], av.video.stream.VideoStream]:
    """Seconds and RGB images of every frame of ``path``."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = list(container.decode(stream))
        times = [float(f.pts * f.time_base) for f in frames]
        return times, [f.to_ndarray(format="rgb24") for f in frames], stream


def record(path: Path, results: list[FrameResult], stream_info: StreamInfo | None = None, **kwargs) -> VideoRecorder:
    recorder = VideoRecorder(path, **kwargs)
    try:
        recorder.open(stream_info or info())
        for r in results:
            recorder.write(r)
    finally:
        recorder.close()
    return recorder


@pytest.mark.parametrize("codec", ["libx264", "mpeg4", "h264_nvenc"])
def test_roundtrip_frame_count_size_and_timestamps(tmp_path: Path, codec: str) -> None:
    path = tmp_path / "out.mp4"
    recorder = record(path, [result(i, i) for i in range(20)], codec=codec)
    # The encoder used is the first of the codec's chain that opens here: NVENC where there is one,
    # libx264 where not (never a silent jump past an encoder that works).
    from sapiens2_client.video import FALLBACKS, probe_encoder

    usable = [name for name in FALLBACKS[codec] if probe_encoder(name, 64, 48, Fraction(30))]
    assert recorder.codec == usable[0]
    times, images, _ = decode(path)
    assert len(times) == 20
    assert all(img.shape == (48, 64, 3) for img in images)
    assert times == sorted(times) and len(set(times)) == 20
    assert times[0] == pytest.approx(0.0) and times[-1] == pytest.approx(19 / 30, abs=2e-3)
    assert abs(float(images[8].mean()) - 200) < 8  # content survives (lossy)


def test_gaps_in_pts_are_kept_as_gaps(tmp_path: Path) -> None:
    pts = [100, 101, 102, 110, 111, 130, 131, 132]  # drops upstream; recording starts at 0
    path = tmp_path / "gaps.mp4"
    record(path, [result(i, p) for i, p in enumerate(pts)])
    times, _, _ = decode(path)
    assert times == pytest.approx([(p - 100) / 30 for p in pts], abs=2e-3)


def test_live_uses_capture_clock_and_never_duplicates(tmp_path: Path) -> None:
    base = 1_700_000_000_000_000_000
    captures = [base, base + 40_000_000, base + 40_000_000, base + 30_000_000, base + 500_000_000]
    # pts restart (a reopen) must not matter for live sources: the capture clock is used
    frames = [result(i, p, capture_ns=c) for i, (p, c) in enumerate(zip([5, 6, 0, 1, 2], captures))]
    path = tmp_path / "live.mp4"
    record(path, frames, info(live=True))
    times, _, _ = decode(path)
    assert len(times) == 5
    assert all(b > a for a, b in zip(times, times[1:]))  # strictly increasing despite ties/backsteps
    assert times[1] == pytest.approx(0.04, abs=1e-3) and times[-1] == pytest.approx(0.5, abs=1e-3)


def test_annotated_image_is_recorded_and_odd_sizes_are_padded(tmp_path: Path) -> None:
    path = tmp_path / "odd.mkv"
    record(path, [result(i, i, w=63, h=47, annotated=True) for i in range(5)], info(w=63, h=47))
    times, images, _ = decode(path)
    assert len(images) == 5 and images[0].shape == (48, 64, 3)
    assert abs(float(images[2].mean()) - 200) < 8


def test_size_change_mid_stream_is_resized(tmp_path: Path) -> None:
    path = tmp_path / "sizes.mp4"
    record(path, [result(0, 0), result(1, 1, w=100, h=80), result(2, 2)])
    _, images, _ = decode(path)
    assert [img.shape for img in images] == [(48, 64, 3)] * 3


def test_frames_without_pts_use_capture_clock(tmp_path: Path) -> None:
    path = tmp_path / "nopts.mp4"
    record(path, [result(i, None, capture_ns=1 + i * 100_000_000) for i in range(4)])
    times, _, _ = decode(path)
    assert times == pytest.approx([0.0, 0.1, 0.2, 0.3], abs=1e-3)


def test_close_is_idempotent_and_finalises_after_an_error(tmp_path: Path) -> None:
    path = tmp_path / "err.mp4"
    recorder = VideoRecorder(path)
    recorder.open(info())
    for i in range(3):
        recorder.write(result(i, i))
    with pytest.raises(ValueError):
        recorder.write(result(3, 3, w=0))  # a broken frame from upstream raises...
    recorder.close()  # ...and the file is still finalised
    recorder.close()
    times, _, _ = decode(path)
    assert len(times) == 3
    with pytest.raises(RecorderError, match="after close"):
        recorder.write(result(4, 4))


def test_no_frames_means_no_file_and_bad_options_fail_clearly(tmp_path: Path) -> None:
    recorder = VideoRecorder(tmp_path / "never.mp4")
    recorder.open(info())
    recorder.close()
    assert not (tmp_path / "never.mp4").exists()
    with pytest.raises(RecorderError, match="unknown codec"):
        VideoRecorder(tmp_path / "x.mp4", codec="divx")
    recorder = VideoRecorder(tmp_path / "x.notaformat")
    with pytest.raises(RecorderError, match="cannot create"):
        recorder.write(result(0, 0))
    recorder.close()


def test_bitrate_option(tmp_path: Path) -> None:
    path = tmp_path / "br.mp4"
    recorder = record(path, [result(i, i) for i in range(10)], bitrate=200_000, fps=25)
    times, _, stream = decode(path)
    assert len(times) == 10 and recorder.frames_written == 10


def test_falls_back_to_mpeg4_when_libx264_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sapiens2_client.video as video_module

    real_probe = video_module.probe_encoder
    monkeypatch.setattr(video_module, "probe_encoder",
                        lambda name, *args: name != "libx264" and real_probe(name, *args))
    path = tmp_path / "fallback.mp4"
    recorder = record(path, [result(i, i) for i in range(6)], codec="libx264")
    assert recorder.codec == "mpeg4"
    times, _, stream = decode(path)
    assert len(times) == 6 and stream.codec_context.name == "mpeg4"
    assert times == pytest.approx([i / 30 for i in range(6)], abs=2e-3)


def test_the_probe_opens_the_encoder_with_the_streams_own_options(tmp_path: Path) -> None:
    """An option the encoder refuses (libx264 has no preset "p4", an NVENC name) is found by the probe, which
    moves on to the next encoder, instead of failing at the first frame with FFmpeg's own error."""
    path = tmp_path / "preset.mp4"
    recorder = record(path, [result(i, i) for i in range(5)], codec="libx264", preset="p4")
    assert recorder.codec == "mpeg4"
    times, _, stream = decode(path)
    assert len(times) == 5 and stream.codec_context.name == "mpeg4"


def test_recording_a_live_source_with_drops(tmp_path: Path) -> None:
    import time

    from pipeline.sources import Source
    from pipeline.sources.demo import SyntheticCamera

    camera = SyntheticCamera(fps=300.0)
    path = tmp_path / "live.mp4"
    recorder = VideoRecorder(path)
    captures: list[int] = []
    with Source(camera.open, label="synthetic", source_id="cam0", live=True, reconnect=True) as source:
        recorder.open(source.info)
        try:
            for _ in range(15):
                time.sleep(0.02)  # slower than the camera: frames are dropped upstream
                frame = source.read(timeout=1.0)
                assert frame is not None
                captures.append(frame.capture_ns)
                recorder.write(FrameResult(frame))
        finally:
            recorder.close()
    assert source.frames_dropped > 0
    times, _, _ = decode(path)
    assert len(times) == 15 and all(b > a for a, b in zip(times, times[1:]))
    # The recording's clock is the capture clock (real elapsed time), not 15 frames at 30 fps.
    captured = [(c - captures[0]) / 1e9 for c in captures]
    assert times == pytest.approx(captured, abs=2e-3)


def test_frames_are_encoded_off_the_callers_thread_in_order(tmp_path: Path) -> None:
    """libx264 costs ~8 ms per 1080p frame: the sink thread hands frames to an encoder thread (the first
    one excepted: a file that cannot be made fails at once, on the caller's thread)."""
    import threading

    path = tmp_path / "threaded.mp4"
    recorder = VideoRecorder(path)
    recorder.open(info())  # (makes its writer for the stream's rate)
    threads: list[str] = []
    real = recorder._writer.write
    recorder._writer.write = lambda image, t: (threads.append(threading.current_thread().name), real(image, t))[1]
    for r in [result(i, i) for i in range(6)]:
        recorder.write(r)
    recorder.close()
    me = threading.current_thread().name
    assert threads[0] == me and all(name.startswith("encode-") for name in threads[1:]) and len(threads) == 6
    times, images, _ = decode(path)
    assert times == pytest.approx([i / 30 for i in range(6)], abs=1e-3)
    np.testing.assert_allclose([im.mean() for im in images], [(i * 25) % 256 for i in range(6)], atol=2)  # in order


def test_an_encoder_error_reaches_the_caller_and_the_file_keeps_what_came_before(tmp_path: Path) -> None:
    path = tmp_path / "failing.mp4"
    recorder = VideoRecorder(path)
    recorder.open(info())
    real, calls = recorder._writer.write, []

    def write(image, t):
        calls.append(t)
        if len(calls) == 4:
            raise RecorderError(f"recorder {path}: writing failed (No space left on device); check disk space")
        real(image, t)

    recorder._writer.write = write
    with pytest.raises(RecorderError, match="No space left on device"):
        for i in range(40):  # the failure of frame 3 comes back at a later write
            recorder.write(result(i, i))
    assert len(calls) <= 4 + VideoRecorder.QUEUE + 1  # nothing more was encoded after the failure
    recorder.close()  # finalised with the frames before it
    times, _, _ = decode(path)
    assert len(times) == 3
