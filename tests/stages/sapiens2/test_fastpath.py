"""GPU fast-path switches on the CPU: every option computes what the default computes, CUDA-only
choices fall back with one warning, config/CLI validate them, and the published JPEG falls back to
the CPU encoder with the same wire format."""

from __future__ import annotations

import logging
import time
from fractions import Fraction

import numpy as np
import pytest
import torch
from sapiens2_client import wire
from sapiens2_client.subscriber import FrameMessage, ReceiveTimeout, Subscriber

from pipeline.cli.args import overrides_from
from pipeline.cli.config import RECORD_CODECS, ConfigError, load_config
from pipeline.cli.main import build_parser
from pipeline.run.build import build_stages, fastpath_from
from pipeline.sinks.publisher import JpegEncoder, ZmqPublisher
from stages.sapiens2 import fastpath as fastpath_mod
from stages.sapiens2 import load_model
from stages.sapiens2.estimators import estimator_for
from stages.sapiens2.fastpath import BATCH_BUCKETS, FastPath
from stages.sapiens2.tiny import make_tiny
from stages.tasks import TASKS
from stages.types import Detections, Frame, FrameResult, StreamInfo

SIZE = (128, 96)


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    return {task: make_tiny(tmp_path_factory.mktemp(f"fp_{task}"), task, image_size=SIZE) for task in TASKS}


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(fastpath_mod, "_warned", set())


def _estimator(folder, task: str, fastpath: FastPath | None = None):
    return estimator_for(task)(load_model(folder, device="cpu"), fastpath=fastpath)


@torch.inference_mode()  # as in the pipeline: dynamo guards on inference vs normal tensors
def _pixels(est, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    image = est.image_tensor(rng.integers(0, 256, (90, 70, 3), dtype=np.uint8))  # (3, H, W) as frames arrive
    if est.task == "pose":
        boxes = torch.tensor([[5.0, 8.0, 60.0, 85.0], [0.0, 0.0, 69.0, 89.0], [20.0, 30.0, 40.0, 70.0]])
        return est.preprocess(image, boxes)  # (4, 3, h, w): three crops padded to a bucket
    return est.preprocess(image)


def _outputs(est, pixels: torch.Tensor) -> list[torch.Tensor]:
    with torch.inference_mode():
        maps, scale = est.forward(pixels)
    return [maps] if scale is None else [maps, scale]


@pytest.mark.parametrize("task", TASKS)
def test_channels_last_heads_match_default(tiny_dirs, task):
    base = _estimator(tiny_dirs[task], task)
    fast = _estimator(tiny_dirs[task], task, FastPath(channels_last=True))
    assert base.fastpath.channels_last is False and fast.fastpath.channels_last is True  # CPU default: off
    convs = [m for m in fast.model.decode_head.modules() if isinstance(m, torch.nn.Conv2d | torch.nn.ConvTranspose2d)]
    assert convs and all(m.weight.is_contiguous(memory_format=torch.channels_last) for m in convs)
    pixels = _pixels(base)
    for want, got in zip(_outputs(base, pixels), _outputs(fast, pixels), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("task", ["pose", "seg"])
def test_math_attention_matches_auto(tiny_dirs, task):
    base = _estimator(tiny_dirs[task], task)
    math = _estimator(tiny_dirs[task], task, FastPath(attention="math"))
    assert math.fastpath.attention == "math"
    pixels = _pixels(base)
    torch.testing.assert_close(_outputs(math, pixels)[0], _outputs(base, pixels)[0], rtol=1e-4, atol=1e-4)


def test_pose_without_buckets_runs_the_exact_count_and_matches(tiny_dirs):
    model = load_model(tiny_dirs["pose"], device="cpu")
    padded = estimator_for("pose")(model)
    exact = estimator_for("pose")(model, buckets=False)
    image = np.random.default_rng(1).integers(0, 256, (90, 70, 3), dtype=np.uint8)
    boxes = np.array([[5, 8, 60, 85], [0, 0, 69, 89], [20, 30, 40, 70]], np.float32)
    with torch.inference_mode():
        image_t, boxes_t = padded.image_tensor(image), torch.as_tensor(boxes)
        crops_padded, crops_exact = padded.preprocess(image_t, boxes_t), exact.preprocess(image_t, boxes_t)
        assert crops_padded.shape[0] == 4 and crops_exact.shape[0] == 3
        # Only the batch differs; keypoints on random weights can flip between near-tied heatmap
        # peaks from batch-size rounding alone, so the heatmaps are compared.
        torch.testing.assert_close(exact.infer(crops_exact, 3), padded.infer(crops_padded, 3), rtol=1e-4, atol=1e-5)
    assert exact.predict(image, boxes).xy.shape == (3, 308, 2)
    assert exact.warmup_batches(5) == [1, 2, 3, 4, 5] and padded.warmup_batches(5) == [1, 2, 4, 8]


def test_cuda_only_choices_fall_back_on_cpu_with_one_warning(tiny_dirs, caplog):
    caplog.set_level(logging.INFO, "stages.sapiens2")
    first = _estimator(tiny_dirs["pose"], "pose", FastPath(attention="flash"))
    second = _estimator(tiny_dirs["seg"], "seg", FastPath(attention="flash"))
    assert first.fastpath.attention == second.fastpath.attention == "auto"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "flash" in r.getMessage()]
    assert len(warnings) == 1 and "using 'auto'" in warnings[0].getMessage()
    # CUDA graphs need CUDA: compile stays on, without graphs (resolve() compiles nothing itself).
    assert FastPath(compile="reduce-overhead").resolve(first.model).compile == "default"
    assert FastPath(compile="max-autotune").resolve(first.model).compile == "max-autotune-no-cudagraphs"
    # The fallen-back estimator computes what an explicit "math" one does (a distinct SDPA path on the CPU).
    pixels = _pixels(first)
    math_est = _estimator(tiny_dirs["pose"], "pose", FastPath(attention="math"))
    assert math_est.fastpath.attention == "math"
    torch.testing.assert_close(_outputs(first, pixels)[0], _outputs(math_est, pixels)[0], rtol=1e-3, atol=1e-4)


def test_backend_that_cannot_run_the_model_falls_back_to_auto(tiny_dirs, monkeypatch, caplog):
    """What happens on a GPU whose flash/cuDNN kernels reject this head size, dtype or GQA."""
    def no_kernel(*args, **kwargs):
        raise RuntimeError("No available kernel. Aborting execution.")

    monkeypatch.setattr(fastpath_mod.F, "scaled_dot_product_attention", no_kernel)
    model = load_model(tiny_dirs["pose"], device="cpu")
    assert FastPath(attention="math").resolve(model).attention == "auto"
    assert "attention='math' cannot run this model here (No available kernel" in caplog.text


def test_attention_probe_runs_the_real_token_count_and_layouts(tiny_dirs, monkeypatch):
    """A kernel that takes a 16-token probe may still reject the real sequence or a strided q, k or v:
    the probe calls attention with the token count, layouts and GQA of the model's own calls."""
    seen = []
    real = fastpath_mod.F.scaled_dot_product_attention

    def record(q, k, v, **kwargs):
        seen.append(tuple((t.shape[2], t.is_contiguous(), t.transpose(1, 2).is_contiguous()) for t in (q, k, v))
                    + (kwargs.get("enable_gqa"),))
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(fastpath_mod.F, "scaled_dot_product_attention", record)
    model = load_model(tiny_dirs["pose"], device="cpu")
    assert FastPath(attention="math").resolve(model, SIZE).attention == "math"
    probed, seen[:] = set(seen), []
    with torch.inference_mode():
        model(torch.zeros(1, 3, *SIZE))
    assert probed == set(seen) and len(probed) == len(set(model.cfg.num_key_value_heads_per_layer)) == 2


def test_active_options_are_logged(tiny_dirs, caplog):
    caplog.set_level(logging.INFO, "stages.sapiens2")
    _estimator(tiny_dirs["pose"], "pose", FastPath(attention="math", channels_last=True))
    assert "pose fast path: attention=math channels_last=on compile=off" in caplog.text


@pytest.mark.parametrize("kwargs, key", [({"attention": "flashy"}, "attention"), ({"compile": "fast"}, "compile"),
                                         ({"channels_last": "yes"}, "channels_last")])
def test_fastpath_rejects_unknown_values(kwargs, key):
    with pytest.raises(ValueError, match=f"^{key}: "):
        FastPath(**kwargs)


def test_warmup_runs_every_bucket(tiny_dirs, monkeypatch):
    pose = _estimator(tiny_dirs["pose"], "pose")
    assert pose.warmup_batches(8) == [1, 2, 4, 8] and pose.warmup_batches(40) == [*BATCH_BUCKETS, 32, 48]
    seg = _estimator(tiny_dirs["seg"], "seg")
    assert seg.warmup_batches(1) == [1] and seg.warmup_batches(3) == [1, 2, 3]  # frames per step
    for est, max_batch, want in ((pose, 5, [1, 2, 4, 8]), (seg, 2, [1, 2])):
        seen: list[int] = []
        real = est.forward
        monkeypatch.setattr(est, "forward", lambda pixels, real=real, seen=seen: (seen.append(len(pixels)),
                                                                                   real(pixels))[1])
        assert est.warmup(max_batch=max_batch) > 0
        assert seen == want, f"{est.task}: the forward ran on batches {seen}, not on every one of {want}"
    monkeypatch.setattr(type(pose.fastpath), "graphs", property(lambda self: True))
    seen = []
    real = pose.forward
    monkeypatch.setattr(pose, "forward", lambda pixels: (seen.append(len(pixels)), real(pixels))[1])
    pose.warmup(max_batch=2)
    assert seen == [1, 1, 2, 2]  # CUDA graphs: every shape as it is, then captured (and replayed)


# -- run config and CLI ------------------------------------------------------------------------------
def test_cli_flags_reach_the_config_and_estimators(tmp_path):
    args = build_parser().parse_args(["run", "--attention", "math", "--channels-last", "on", "--compile", "off",
                                      "--gpu-jpeg", "on", "--record-codec", "h264_nvenc", "--tasks", "seg,pose",
                                      "--no-pose-buckets", "--no-pinned-memory", "--detector", "full-frame",
                                      "--checkpoint", f"seg={make_tiny(tmp_path / 'seg', 'seg', image_size=SIZE)}",
                                      "--checkpoint", f"pose={make_tiny(tmp_path / 'pose', 'pose', image_size=SIZE)}"])
    cfg = load_config(None, overrides_from(args))
    assert (cfg.attention, cfg.channels_last, cfg.compile, cfg.gpu_jpeg, cfg.record_codec) == (
        "math", True, "off", True, "h264_nvenc")
    assert (cfg.pose_buckets, cfg.pinned_memory) == (False, False)
    assert fastpath_from(cfg) == FastPath("math", True, "off", "auto")
    cfg.device = "cpu"
    stages = build_stages(cfg)
    est = stages.estimators["seg"]
    assert est.fastpath == FastPath("math", True, "off", "off") and est.model.channels_last  # no graphs on a CPU
    assert stages.estimators["pose"].buckets is False
    auto = load_config(None, overrides_from(build_parser().parse_args(["run", "--channels-last", "auto"])))
    assert auto.channels_last is None and auto.gpu_jpeg is None and auto.compile == "off"  # auto: the device decides
    assert auto.pose_buckets and auto.pinned_memory


def test_yaml_accepts_auto_for_channels_last(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("channels_last: auto\nattention: efficient\ncompile: max-autotune\n")
    cfg = load_config(path)
    assert (cfg.channels_last, cfg.attention, cfg.compile) == (None, "efficient", "max-autotune")


@pytest.mark.parametrize("key, value", [("attention", "flashy"), ("compile", "yes"), ("record_codec", "vp9"),
                                        ("channels_last", "sometimes"), ("gpu_jpeg", "on")])
def test_config_rejects_bad_fast_path_values_naming_the_key(key, value):
    with pytest.raises(ConfigError, match=key.replace("_", "[-_]")):  # as a flag (--record-codec) or a key
        load_config(None, {key: value})


def test_record_codecs_match_the_recorder():
    from pipeline.sinks.recorder import FALLBACKS

    assert set(RECORD_CODECS) == set(FALLBACKS)


# -- JPEG of published frames ------------------------------------------------------------------------
def _frame_result(h: int = 48, w: int = 64) -> FrameResult:
    yy, xx = np.mgrid[0:h, 0:w]
    image = np.stack([xx * 255 // w, yy * 255 // h, (xx + yy) * 255 // (h + w)], -1).astype(np.uint8)  # smooth
    frame = Frame(index=0, image=image, pts=0, time_base=Fraction(1, 90000), capture_ns=1, source_id="cam0")
    return FrameResult(frame, Detections.empty(), None, annotated=image.copy())


def _publish_one_frame(pub: ZmqPublisher, result: FrameResult) -> FrameMessage:
    pub.open(StreamInfo("cam0", result.frame.width, result.frame.height, 30.0, Fraction(1, 90000), live=True))
    try:
        with Subscriber(pub.endpoint, ["frame"], timeout_s=2) as sub:
            assert pub.wait_for_subscriber("frame.cam0", 5)
            pub.write(result)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                try:
                    msg = sub.recv(timeout_s=0.2)
                except ReceiveTimeout:
                    continue
                if isinstance(msg, FrameMessage):
                    return msg
    finally:
        pub.close()
    raise AssertionError("no frame message received")


def _assert_same_image(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape and got.dtype == np.uint8
    assert np.abs(got.astype(int) - want.astype(int)).mean() < 3.0  # JPEG at quality 90 on a smooth image


def test_gpu_jpeg_without_cuda_takes_the_cpu_path(caplog):
    caplog.set_level(logging.INFO, "pipeline.sinks.jpeg")
    result = _frame_result()
    pub = ZmqPublisher("tcp://127.0.0.1:*", jpeg_quality=90, gpu_jpeg=True)
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the GPU encoder is used (measured by bench/)")
    assert not pub.jpeg.active and "no CUDA device" in caplog.text
    msg = _publish_one_frame(pub, result)
    _assert_same_image(msg.image, result.annotated)


@pytest.mark.parametrize("device, gpu_jpeg, active", [("auto", None, "cuda:0"), ("cuda:0", None, "cuda:0"),
                                                      ("cuda:1", None, "cuda:1"), ("cuda", True, "cuda:0"),
                                                      ("cpu", None, None), ("auto", False, None)])
def test_published_frames_are_jpeg_encoded_on_the_gpu_by_default_on_cuda(device, gpu_jpeg, active, monkeypatch):
    """nvJPEG 0.84 ms vs OpenCV 9.4 ms per 1080p frame on an H200: on unless the run is on the CPU or says
    off, on the run's own device, indexed (the encoder runs on the sink thread, whose current device is
    device 0 whatever the run's is). (A machine with two GPUs stood in for: only whether CUDA is there,
    its devices and a stream are asked of it.)"""
    import threading

    from pipeline.sinks.build import build_outputs

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: object())
    cfg = load_config(None, {"publish": "tcp://127.0.0.1:*", "device": device, "gpu_jpeg": gpu_jpeg})
    (publisher,) = build_outputs(cfg, threading.Event()).sinks
    try:
        assert publisher.jpeg.device == (None if active is None else torch.device(active))
    finally:
        publisher.close()


def test_torch_encoder_frames_decode_like_cpu_ones():
    """The pre-encoded path (what CUDA uses), run with torchvision's CPU encoder: same wire format."""
    result = _frame_result()
    pub = ZmqPublisher("tcp://127.0.0.1:*", jpeg_quality=90)
    pub.jpeg = JpegEncoder(90, "cpu")
    msg = _publish_one_frame(pub, result)
    assert pub.jpeg.active
    assert msg.header["parts"] == [{"name": "image", "encoding": "jpeg", "dtype": "|u1", "shape": [48, 64, 3],
                                    "color": "rgb"}]
    _assert_same_image(msg.image, result.annotated)


@pytest.mark.parametrize("fault", ["colours swapped", "another size", "not a JPEG"])
def test_a_gpu_jpeg_that_disagrees_is_switched_off_and_the_frame_goes_out_right(fault, monkeypatch, caplog):
    """The first JPEG of each frame size is decoded again and held against the CPU encoder's: a GPU
    encoder that gets the layout or the colours wrong is switched off with one warning, and that frame
    (and every later one) is encoded on the CPU."""
    import torchvision.io

    real = torchvision.io.encode_jpeg

    def wrong(chw, quality=75):
        if fault == "colours swapped":
            return real(chw.flip(0).contiguous(), quality=quality)
        if fault == "another size":
            return real(chw[:, ::2, ::2].contiguous(), quality=quality)
        return torch.frombuffer(bytearray(b"\xff\xd8not a jpeg"), dtype=torch.uint8)

    monkeypatch.setattr(torchvision.io, "encode_jpeg", wrong)
    result = _frame_result()
    pub = ZmqPublisher("tcp://127.0.0.1:*", jpeg_quality=90)
    pub.jpeg = JpegEncoder(90, "cpu")
    with caplog.at_level(logging.WARNING, "pipeline.sinks.jpeg"):
        msg = _publish_one_frame(pub, result)
    _assert_same_image(msg.image, result.annotated)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warning.startswith("GPU JPEG switched off: its JPEG ") and warning.endswith("on the CPU from now on")
    assert {"colours swapped": "grey levels off the frame", "another size": "frame decodes to 24x32x3",
            "not a JPEG": "frame decodes to nothing"}[fault] in warning
    assert not pub.jpeg.active


def test_a_gpu_jpeg_that_agrees_is_checked_once_per_frame_size(monkeypatch):
    from sapiens2_client import images

    decoded = []
    real = images.decode_jpeg_rgb
    monkeypatch.setattr(images, "decode_jpeg_rgb", lambda data: decoded.append(1) or real(data))
    encoder = JpegEncoder(90, "cpu")
    for h, w in [(48, 64), (48, 64), (32, 40), (48, 64)]:
        _assert_same_image(images.decode_jpeg_rgb(encoder.encode(_frame_result(h, w).annotated)),
                           _frame_result(h, w).annotated)
    assert encoder.active and len(decoded) == 4 + 2 * 2  # the test's own 4, the check's 2 per size


def test_encoder_without_torchvision_jpeg_falls_back(monkeypatch, caplog):
    """torchvision deprecates its image codecs: a release without encode_jpeg must not break publishing."""
    import torchvision.io

    monkeypatch.delattr(torchvision.io, "encode_jpeg")
    encoder = JpegEncoder(90, "cpu")
    assert encoder.encode(_frame_result().annotated) is None and not encoder.active
    assert "GPU JPEG encoding failed (cannot import name 'encode_jpeg'" in caplog.text


def test_encoder_failure_falls_back_once(monkeypatch, caplog):
    import torchvision.io

    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("nvjpeg: simulated failure")

    monkeypatch.setattr(torchvision.io, "encode_jpeg", broken)
    encoder = JpegEncoder(90, "cpu")
    image = _frame_result().annotated
    assert encoder.encode(image) is None and encoder.encode(image) is None
    assert len(calls) == 1 and not encoder.active
    assert caplog.text.count("GPU JPEG encoding failed (nvjpeg: simulated failure)") == 1
    frames = wire.encode("frame", "cam0", {"frame_index": 0}, [wire.Part("image", image, "jpeg")], publish_ns=1)
    _assert_same_image(wire.decode(frames).arrays["image"], image)
