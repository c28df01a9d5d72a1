"""Every fast path checks itself against the eager forward before it is used, and one that is wrong
or raises is switched off for the run with one warning line naming it and the difference; the run
never ends for one. On the CPU, with a wrong or a raising fast path put in its place."""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

import stages.sapiens2.forward as forward_mod
from stages.sapiens2 import load_model
from stages.sapiens2.estimators import PoseEstimator, Segmenter
from stages.sapiens2.fastpath import FastPath
from stages.sapiens2.forward import FastForward
from stages.sapiens2.model import Sapiens2
from stages.sapiens2.tiny import make_tiny, random_init, tiny_config, write_checkpoint
from stages.sapiens2.verify import check_image, difference
from tests.fakecuda import FakeCuda

SIZE = (64, 48)
pytestmark = pytest.mark.timeout(300)


def _seg(fastpath: FastPath | None = None, dtype: str = "float32", folder: Path | None = None) -> Segmenter:
    model = (load_model(folder, device="cpu", dtype=dtype) if folder is not None else
             random_init(Sapiens2(tiny_config("seg", image_size=SIZE)), seed=0))
    return Segmenter(model, fastpath=fastpath)


def _frames(n: int = 3) -> list[torch.Tensor]:
    rng = np.random.default_rng(7)
    return [torch.from_numpy(rng.integers(0, 255, (90, 70, 3), dtype=np.uint8)).permute(2, 0, 1) for _ in range(n)]


def _maps(est, frames: list[torch.Tensor]) -> list[torch.Tensor]:
    with torch.inference_mode():
        return [est.forward(est.preprocess(f))[0] for f in frames]


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# -- float16 -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hot_seg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A seg model whose MLP overflows float16 on any picture (as the "massive activations" of ViTs)."""
    model = random_init(Sapiens2(tiny_config("seg", image_size=SIZE)), seed=5)
    with torch.no_grad():
        model.backbone.blocks[1].ffn.w3.weight.mul_(1e5)
    return write_checkpoint(model, tmp_path_factory.mktemp("hot-seg"))


def test_float16_that_overflows_is_switched_to_bfloat16_at_warm_up(hot_seg: Path, caplog) -> None:
    est = _seg(dtype="float16", folder=hot_seg)
    with caplog.at_level(logging.WARNING):
        est.warmup(max_batch=1)
    (warning,) = _warnings(caplog)
    assert warning.startswith("seg: fast path float16 switched off for this run: ")
    assert "not finite" in warning and warning.endswith("running in bfloat16")
    assert est.model.dtype == torch.bfloat16
    assert all(torch.isfinite(m).all() for m in _maps(est, _frames()))


def test_float16_that_agrees_stays_and_its_weights_come_back_unchanged(tmp_path: Path, caplog) -> None:
    est = _seg(dtype="float16", folder=make_tiny(tmp_path / "seg", "seg", image_size=SIZE))
    before = {k: v.clone() for k, v in est.model.state_dict().items()}
    with caplog.at_level(logging.WARNING):
        est.warmup(max_batch=1)
    assert not _warnings(caplog) and est.model.dtype == torch.float16
    after = est.model.state_dict()
    assert all(after[k].dtype == v.dtype and torch.equal(after[k], v) for k, v in before.items())


# -- attention kernel, channels_last ------------------------------------------------------
@pytest.mark.parametrize("fault", ["wrong", "raises"])
def test_an_attention_kernel_that_fails_its_check_falls_back_to_auto(fault: str, monkeypatch, caplog) -> None:
    """'math' stands in for a CUDA kernel that computes wrongly, or cannot run this model after all."""
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    @contextlib.contextmanager
    def broken(attention: str):
        if attention == "auto":
            yield
            return

        def sdpa(q, k, v, **kwargs):
            if fault == "raises":
                raise RuntimeError("No available kernel. Aborting execution.")
            return real_sdpa(q, k, v, **kwargs) * 0.0

        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa)
        try:
            yield
        finally:
            monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", real_sdpa)

    monkeypatch.setattr(forward_mod, "attention_context", broken)
    est, plain = _seg(FastPath(attention="math")), _seg()
    with caplog.at_level(logging.WARNING):
        est.warmup(max_batch=1)
    (warning,) = _warnings(caplog)
    assert warning.startswith("seg: fast path attention=math switched off for this run: ")
    assert ("raised RuntimeError: No available kernel" if fault == "raises" else "differs from the eager path by") \
        in warning
    assert est.fastpath.attention == "auto"
    for got, want in zip(_maps(est, _frames()), _maps(plain, _frames())):
        torch.testing.assert_close(got, want)


def test_channels_last_that_disagrees_is_switched_off(monkeypatch, caplog) -> None:
    est, plain = _seg(FastPath(channels_last=True)), _seg()
    head = est.model.decode_head
    real = head.forward
    monkeypatch.setattr(head, "forward", lambda f: (real(f)[0] + (3.0 if est.model.channels_last else 0.0), None))
    with caplog.at_level(logging.WARNING):
        est.warmup(max_batch=1)
    (warning,) = _warnings(caplog)
    assert warning.startswith("seg: fast path channels_last switched off for this run: it differs")
    assert not est.model.channels_last and est.fastpath.channels_last is False
    for got, want in zip(_maps(est, _frames()), _maps(plain, _frames())):
        torch.testing.assert_close(got, want)


# -- compile -------------------------------------------------------------------------------
def _graphed(cuda: FakeCuda, est: Segmenter) -> Segmenter:
    """The estimator with CUDA graphs on, as resolved on a GPU (its model watched by the stand-in)."""
    cuda.watch(est.model)
    est._forward = FastForward(est.model, replace(est.fastpath, cuda_graphs="on"), "seg")
    return est


def _compiled_stand_in(monkeypatch, make) -> None:
    """compile_model's compiled forwards are ``make(model)`` instead of torch.compile's."""
    monkeypatch.setattr(forward_mod, "compile_model", lambda model, mode, attention="auto": lambda shape: make(model))


@pytest.mark.parametrize("fault", ["wrong", "raises when compiled", "raises when used"])
def test_a_compiled_forward_that_fails_its_check_is_switched_off(fault: str, monkeypatch, caplog) -> None:
    main = threading.current_thread()

    def make(model):
        def compiled(x):
            if fault == "raises when compiled" or (fault == "raises when used" and threading.current_thread() is main):
                raise RuntimeError("inductor: an internal error")
            maps, scale = model(x)
            return (maps * 2.0 if fault == "wrong" else maps), scale
        return compiled

    _compiled_stand_in(monkeypatch, make)
    est, plain = _seg(FastPath(compile="default")), _seg()
    frames = _frames()
    with caplog.at_level(logging.WARNING):
        est.warmup(max_batch=1)
        est._forward.compiler.wait(timeout=60)
        got = _maps(est, frames)  # the first step of the compiled shape: checked, refused, eager
    (warning,) = _warnings(caplog)
    assert warning.startswith("seg: fast path compile switched off for this run: ")
    assert {"wrong": "differs from the eager path", "raises when compiled": "compiling input (1, 3, 64, 48) raised "
            "RuntimeError: inductor: an internal error", "raises when used": "raised RuntimeError"}[fault] in warning
    assert est._forward.compiler is None and est.fastpath.compile == "off"
    for g, want in zip(got, _maps(plain, frames)):
        torch.testing.assert_close(g, want)


def test_a_compiled_forward_that_agrees_takes_over_each_shape_when_ready(monkeypatch, caplog) -> None:
    """The stage starts eager; the compiled forward is used for a shape from the step after it is ready."""
    used = []
    release = threading.Event()

    def make(model):
        def compiled(x):
            if threading.current_thread().name.startswith("compile-"):
                assert release.wait(60)  # still compiling: the stage must go on without it
            else:
                used.append(tuple(x.shape))
            return model(x)
        return compiled

    _compiled_stand_in(monkeypatch, make)
    est, plain = _seg(FastPath(compile="default")), _seg()
    frames = _frames()
    with caplog.at_level(logging.INFO, "stages.sapiens2"):
        est.warmup(max_batch=1)
        early = _maps(est, frames)  # compiling: eager
        assert not used
        release.set()
        assert est.wait_compiled(timeout=60)
        late = _maps(est, frames)
    assert used and set(used) == {(1, 3, *SIZE)}
    assert "seg: input 1x3x64x48 compiled in" in caplog.text and "compiled forward in use for input 1x3x64x48" \
        in caplog.text and not _warnings(caplog)
    for a, b, want in zip(early, late, _maps(plain, frames)):
        torch.testing.assert_close(a, want)
        torch.testing.assert_close(b, want)
    est.close()


def test_compiled_graphs_replace_the_eager_graphs_once_checked(monkeypatch, caplog) -> None:
    """On CUDA: eager graphs from the start, the compiled forward's graph for a shape once it agreed."""
    cuda = FakeCuda(monkeypatch)
    _compiled_stand_in(monkeypatch, lambda model: (lambda x: model(x)))
    est, plain = _graphed(cuda, _seg(FastPath(compile="default"))), _seg()
    frames = _frames(4)
    with cuda.on(2), caplog.at_level(logging.WARNING):
        est.warmup(max_batch=1)
        assert est.wait_compiled(timeout=60)
        got = _maps(est, frames)
    kinds = [(kind, stream) for kind, _, stream in est._forward.graphs.captures]
    assert kinds == [("eager", 2), ("compiled", 2)] and not _warnings(caplog)
    assert not est._forward.graphs.has("eager", torch.zeros(1, 3, *SIZE))  # the eager graph was let go
    for g, want in zip(got, _maps(plain, frames)):
        torch.testing.assert_close(g, want)


@pytest.mark.parametrize("fault", ["compiled forward raises after its check", "compiled graph's replay raises"])
def test_a_compiled_forward_that_raises_later_under_graphs_never_ends_the_run(fault: str, monkeypatch,
                                                                               caplog) -> None:
    """On CUDA a compiled shape that passed its check runs again uncaptured (its graph's first call)
    and then replays: either raising switches compile off (one warning) and the step is computed
    eagerly, under the eager graphs, which stay on."""
    from tests.fakecuda import FakeGraph

    cuda = FakeCuda(monkeypatch)
    main, calls = threading.current_thread(), []

    def make(model):
        def compiled(x):
            if threading.current_thread() is main:
                calls.append(1)
                if fault.startswith("compiled forward") and len(calls) > 1:  # the check was its first call
                    raise RuntimeError("CUDA error: an illegal memory access was encountered")
            return model(x)
        return compiled

    replay = FakeGraph.replay

    def replay_or_raise(graph: FakeGraph) -> None:
        if fault.endswith("replay raises") and graph in compiled_graphs and len(graph.replayed_on) >= 1:
            raise RuntimeError("CUDA error: an illegal instruction was encountered")
        replay(graph)

    compiled_graphs: list = []
    monkeypatch.setattr(FakeGraph, "replay", replay_or_raise)
    _compiled_stand_in(monkeypatch, make)
    est, plain = _graphed(cuda, _seg(FastPath(compile="default"))), _seg()
    frames = _frames(5)
    with cuda.on(2), caplog.at_level(logging.WARNING):
        est.warmup(max_batch=1)
        assert est.wait_compiled(timeout=60)
        got = []
        for frame in frames:
            got += _maps(est, [frame])
            if est._forward.graphs is not None:
                compiled_graphs[:] = [cuda.graphs[i] for i, (kind, _, _) in
                                      enumerate(est._forward.graphs.captures) if kind == "compiled"]
    (warning,) = _warnings(caplog)
    assert warning.startswith("seg: fast path compile switched off for this run: the compiled forward raised "
                              "RuntimeError: CUDA error: an illegal")
    assert est.fastpath.compile == "off" and est._forward.graphs is not None and est.fastpath.cuda_graphs == "on"
    for g, want in zip(got, _maps(plain, frames)):
        torch.testing.assert_close(g, want)


def test_cuda_graph_captures_and_background_compiles_never_overlap(monkeypatch, caplog) -> None:
    """A compile's autotuning synchronises the device, which a capture on another thread would not
    survive: the compiles of a warm-up start once every stage of the engine's warm-up captured its
    graphs, and a shape due for capture while one compiles runs as it is, captured once it is done."""
    from stages.sapiens2.graphs import LaneGraphs, warming_up

    cuda = FakeCuda(monkeypatch)
    events: list[str] = []
    started, release = threading.Event(), threading.Event()

    def make(model):
        def compiled(x):
            if threading.current_thread().name.startswith("compile-"):
                events.append("compile")
                started.set()
                assert release.wait(60)
            return model(x)
        return compiled

    capture = LaneGraphs._capture

    def recorded(graphs, kind, fn, pixels, stream):
        events.append(f"capture {kind} {pixels.shape[0]} on {stream.cuda_stream}")
        return capture(graphs, kind, fn, pixels, stream)

    monkeypatch.setattr(LaneGraphs, "_capture", recorded)
    _compiled_stand_in(monkeypatch, make)
    first, second, plain = _graphed(cuda, _seg(FastPath(compile="default"))), _graphed(cuda, _seg()), _seg()
    x = torch.randn(2, 3, *SIZE, generator=torch.Generator().manual_seed(3))
    try:
        with caplog.at_level(logging.WARNING), torch.inference_mode():
            with warming_up():  # as FrameEngine.warm_up: one stage after the other
                with cuda.on(2):
                    first.warmup(max_batch=1)
                with cuda.on(3):
                    second.warmup(max_batch=1)
            assert started.wait(60)
            assert events == ["capture eager 1 on 2", "capture eager 1 on 3", "compile"]
            with cuda.on(3):  # a new shape while the compile runs: computed, not captured
                during = [second.forward(x)[0] for _ in range(3)]
            assert events == ["capture eager 1 on 2", "capture eager 1 on 3", "compile"]
            release.set()
            assert first.wait_compiled(timeout=60)
            with cuda.on(3):
                after = second.forward(x)[0]
            want = plain.model(x)[0]
        assert events[3:] == ["capture eager 2 on 3"] and not _warnings(caplog)
        for got in [*during, after]:
            torch.testing.assert_close(got, want)
    finally:
        release.set()
        first.close()


# -- the check itself ------------------------------------------------------------------------
def test_difference_is_relative_and_catches_what_is_not_finite() -> None:
    a = torch.ones(2, 3)
    assert difference((a, None), (a, None)) == 0.0
    assert difference((a * 1.01, None), (a, None)) == pytest.approx(0.01)
    assert difference((a.clone().fill_(float("nan")), None), (a, None)) == float("inf")
    assert difference((a, torch.ones(1)), (a, None)) == float("inf")
    assert difference((torch.ones(3, 2), None), (a, None)) == float("inf")


def test_the_check_picture_has_structure() -> None:
    image = check_image((96, 64))
    assert image.shape == (96, 64, 3) and image.dtype == np.uint8 and image.std() > 30
    assert np.array_equal(image, check_image((96, 64)))  # the same every time


def test_pose_checks_its_switches_on_a_full_frame_crop(monkeypatch) -> None:
    pose = PoseEstimator(random_init(Sapiens2(tiny_config("pose", image_size=SIZE)), seed=0),
                         fastpath=FastPath(attention="math"))
    seen = []
    monkeypatch.setattr(FastForward, "check_switches", lambda self, pixels: seen.append(tuple(pixels.shape)))
    pose.warmup(max_batch=1)
    assert seen == [(1, 3, *SIZE)]
