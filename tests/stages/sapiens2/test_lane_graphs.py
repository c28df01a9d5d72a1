"""CUDA graphs, on by default on CUDA: each stage captures its forward per input shape on its own
stream, in its own memory pool, checks the replay against the forward, and goes on eagerly (one
warning) when a capture fails or disagrees.

No GPU here: CUDA's streams and graphs are stood in for (tests/fakecuda.py): a capture computes
nothing (its outputs are NaN until replayed), a replay computes the captured forward again.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import pipeline.run.streams
from pipeline.run.build import Stages
from pipeline.run.engine import FrameEngine
from stages.sapiens2.compiled import compile_model
from stages.sapiens2.estimators import PoseEstimator, Segmenter
from stages.sapiens2.fastpath import FastPath
from stages.sapiens2.forward import FastForward
from stages.sapiens2.model import Sapiens2
from stages.sapiens2.tiny import random_init, tiny_config
from tests.fakecuda import FakeCuda

SIZE = (64, 48)


def _graphed(est, cuda: FakeCuda):
    """The estimator with CUDA graphs on, as resolved on a GPU."""
    cuda.watch(est.model)
    est._forward = FastForward(est.model, replace(est.fastpath, cuda_graphs="on"), est.task)
    return est


def _seg(seed: int = 0) -> Segmenter:
    return Segmenter(random_init(Sapiens2(tiny_config("seg", image_size=SIZE)), seed=seed))


def _input(seed: int, batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 3, *SIZE, generator=torch.Generator().manual_seed(seed))


def _eager(est, x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return est.model(x)[0]


def test_each_stage_captures_on_its_own_stream_in_its_own_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = FakeCuda(monkeypatch)
    stages = {}
    for stream, seed in ((1, 0), (2, 1)):
        est = _graphed(_seg(seed), cuda)
        with cuda.on(stream), torch.inference_mode():
            for i in range(4):  # as it is, capture (+ replay), replay, replay
                x = _input(i + 10 * stream)
                torch.testing.assert_close(est.forward(x)[0], _eager(est, x))
        assert est._forward.graphs.captures == [("eager", (2, 3, *SIZE), stream)]
        stages[stream] = est
    first, second = cuda.graphs
    assert (first.stream, second.stream) == (1, 2)  # each captured on its own stage's stream ...
    assert first.replayed_on == [1, 1, 1] and second.replayed_on == [2, 2, 2]  # ... and replayed there
    assert first.pool is not second.pool and first.pool is stages[1]._forward.graphs.pool  # a pool of its own


def test_a_graph_warmed_on_one_thread_replays_on_another(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inductor's graph trees are per thread (a warm-up on another thread is recorded again while
    the stream runs); these are not."""
    cuda = FakeCuda(monkeypatch)
    est = _graphed(_seg(), cuda)
    with cuda.on(1), torch.inference_mode():
        est.forward(_input(0))
        est.forward(_input(1))
    seen = []

    def run() -> None:
        with cuda.on(1), torch.inference_mode():
            x = _input(2)
            seen.append(torch.allclose(est.forward(x)[0], _eager(est, x)))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == [True] and len(cuda.graphs) == 1


def test_the_estimator_hands_out_copies_of_the_static_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = FakeCuda(monkeypatch)
    est = _graphed(_seg(), cuda)
    with cuda.on(1), torch.inference_mode():
        outs = [est.forward(_input(seed))[0] for seed in range(4)]
    for seed, out in enumerate(outs):  # the later replays did not rewrite what the earlier ones gave
        torch.testing.assert_close(out, _eager(est, _input(seed)))


def test_warm_up_captures_every_shape_once(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    cuda = FakeCuda(monkeypatch)
    pose = _graphed(PoseEstimator(random_init(Sapiens2(tiny_config("pose", image_size=SIZE)), seed=0)), cuda)
    with cuda.on(3), caplog.at_level(logging.INFO, "stages.sapiens2.estimators"):
        pose.warmup(max_batch=5)
    assert [c[1][0] for c in pose._forward.graphs.captures] == [1, 2, 4, 8]  # every bucket up to 5 persons
    assert {c[2] for c in pose._forward.graphs.captures} == {3}
    assert "4 CUDA graphs captured" in caplog.text and "cuda_graphs=on" in caplog.text
    image = pose.image_tensor(np.random.default_rng(0).integers(0, 255, (90, 70, 3), dtype=np.uint8))
    boxes = torch.tensor([[5.0, 8.0, 60.0, 85.0], [0.0, 0.0, 69.0, 89.0], [20.0, 30.0, 40.0, 70.0]])
    with cuda.on(3), torch.inference_mode():
        got = pose.infer(pose.preprocess(image, boxes), 3)  # 3 persons: the bucket of 4, replayed
        want = pose.model(pose.preprocess(image, boxes))[0][:3]
    torch.testing.assert_close(got, want)
    assert len(cuda.graphs) == 4 and cuda.graphs[2].replayed_on[-1] == 3


@pytest.mark.parametrize("fault", ["wrong replay", "capture raises"])
def test_a_graph_that_fails_its_check_is_switched_off_and_the_run_goes_on(fault: str, monkeypatch, caplog) -> None:
    cuda = FakeCuda(monkeypatch)
    cuda.corrupt, cuda.fail_capture = fault == "wrong replay", fault == "capture raises"
    est = _graphed(_seg(), cuda)
    with cuda.on(1), torch.inference_mode(), caplog.at_level(logging.WARNING):
        outs = [est.forward(_input(seed)) for seed in range(4)]
    for seed, (maps, _) in enumerate(outs):  # every step computed: the one whose capture failed eagerly
        torch.testing.assert_close(maps, _eager(est, _input(seed)))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "seg: fast path CUDA graphs switched off for this run" in warnings[0]
    assert ("differs from the eager path" if fault == "wrong replay" else "raised RuntimeError") in warnings[0]
    assert est._forward.graphs is None and est.fastpath.cuda_graphs == "off"
    assert len(cuda.graphs) == 1  # no second try


def test_an_estimator_used_outside_the_engine_keeps_its_cuda_graphs(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    """On the default stream (Segmenter.predict from a user's script) CUDA refuses to capture: the graphs
    live on a side stream that waits for the caller's, and the caller's waits for it."""
    cuda = FakeCuda(monkeypatch)
    est = _graphed(_seg(), cuda)
    with torch.inference_mode(), caplog.at_level(logging.WARNING):
        for seed in range(3):  # on the default stream, as a user's own script calls the estimator
            x = _input(seed)
            torch.testing.assert_close(est.forward(x)[0], _eager(est, x))
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert est._forward.graphs is not None and len(cuda.graphs) == 1
    side = cuda.graphs[0].stream
    assert side != 0 and cuda.graphs[0].replayed_on == [side, side]
    assert cuda.waits == [(side, 0), (0, side)] * 3  # each call ordered both ways with the caller's stream


@pytest.mark.parametrize("mode, autotune", [("default", False), ("reduce-overhead", False), ("max-autotune", True)])
def test_compile_modes_compile_without_inductors_graphs(mode: str, autotune: bool,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict] = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: (seen.append(kw), fn)[1])
    model = random_init(Sapiens2(tiny_config("pose", image_size=SIZE)), seed=0)
    make = compile_model(model, mode)
    forward, another = make((1, 3, *SIZE)), make((2, 3, *SIZE))
    assert forward.__code__ is not another.__code__  # a dynamo cache per shape: none recompiles for another
    assert forward.__code__.co_name == "forward_1x3x64x48"  # the same in every run: the kept cache finds it
    kwargs = seen[0]
    assert "mode" not in kwargs and kwargs["options"]["triton.cudagraphs"] is False
    assert bool(kwargs["options"].get("max_autotune", False)) is autotune
    assert kwargs["fullgraph"] is True and kwargs["dynamic"] is False
    x = _input(0, 1)
    with torch.inference_mode():
        torch.testing.assert_close(forward(x)[0], model(x)[0])  # the model's forward, under its attention choice


def test_the_engine_keeps_its_lanes_apart_with_cuda_graphs(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    """reduce-overhead used to put every lane, the detector's included, on one stream."""
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: object())
    monkeypatch.setattr(pipeline.run.streams, "_STREAMS", {})
    graphed = SimpleNamespace(fastpath=FastPath(cuda_graphs="on"))
    with caplog.at_level(logging.INFO, "pipeline.run.engine"):
        engine = FrameEngine(Stages(torch.device("cuda", 0), None, {"pose": graphed, "seg": graphed}))
    streams = engine.streams.cuda_streams
    assert len({id(s) for s in streams.values()}) == len(pipeline.run.streams.stream_names())
    assert streams["detect"] is not streams["seg"] and streams["pose"] is not streams["seg"]
    assert any("overlap, the detector beside them" in r.getMessage() for r in caplog.records)
    again = FrameEngine(Stages(torch.device("cuda", 0), None, {"pose": graphed}))
    assert again.streams.cuda_streams == streams  # the same streams: graphs captured on them replay there
