"""CUDA graphs in the compile modes that use them keep the stages on their own streams.

No GPU here: CUDA's streams and graphs are stood in for. A stand-in graph records the work a
forward queues while it is captured and does it again at each replay (a capture computes nothing,
so a graph that is captured but not replayed hands out NaN); streams are numbered.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from types import SimpleNamespace

import pytest
import torch

import pipeline.lanes
from pipeline.engine import FrameEngine
from pipeline.stages_setup import Stages
from stages.sapiens2.fastpath import FastPath, compile_model
from stages.sapiens2.graphs import LaneGraphs
from stages.sapiens2.model import Sapiens2
from stages.sapiens2.tiny import random_init, tiny_config


class FakeGraph:
    capturing: FakeGraph | None = None

    def __init__(self) -> None:
        self.work: list = []
        self.pool = self.stream = None
        self.replayed_on: list[int] = []

    def replay(self) -> None:
        self.replayed_on.append(Cuda.current[-1].cuda_stream)
        for fn, x, outs in self.work:
            for out, value in zip(outs, fn(x)):
                out.copy_(value)


class Cuda:
    """Streams (numbered), the current one, graphs and pools, as torch.cuda has them."""

    current: list[SimpleNamespace] = []

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        Cuda.current = [SimpleNamespace(cuda_stream=0)]
        self.graphs: list[FakeGraph] = []
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Cuda.current[-1])
        monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: self.graphs.append(FakeGraph()) or self.graphs[-1])
        monkeypatch.setattr(torch.cuda, "graph_pool_handle", object)
        monkeypatch.setattr(torch.cuda, "graph", self.capture)

    @contextlib.contextmanager
    def capture(self, graph: FakeGraph, pool=None, stream=None, capture_error_mode: str = "global"):
        graph.pool, graph.stream = pool, stream.cuda_stream
        FakeGraph.capturing = graph
        Cuda.current.append(stream)
        try:
            yield
        finally:
            FakeGraph.capturing = None
            Cuda.current.pop()

    @staticmethod
    @contextlib.contextmanager
    def on(stream: int):
        Cuda.current.append(SimpleNamespace(cuda_stream=stream))
        try:
            yield
        finally:
            Cuda.current.pop()


def model_fn(scale: float):
    """A forward: (maps, scale) of the input; queued (not computed) while a graph captures it."""
    def compute(x: torch.Tensor):
        return x * scale + 1.0, x.sum(dim=(1, 2, 3))

    def forward(x: torch.Tensor):
        if FakeGraph.capturing is None:
            forward.eager += 1
            return compute(x)
        outs = tuple(torch.full_like(t, float("nan")) for t in compute(x))
        FakeGraph.capturing.work.append((compute, x, outs))
        return outs

    forward.eager = 0
    return forward, compute


def _input(seed: int, batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 3, 8, 6, generator=torch.Generator().manual_seed(seed))


def test_each_stage_captures_on_its_own_stream_in_its_own_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = Cuda(monkeypatch)
    stages = {}
    for stream, (name, scale) in enumerate((("pose", 2.0), ("seg", 3.0)), start=1):
        fn, compute = model_fn(scale)
        graphs = LaneGraphs(fn, torch.device("cpu"))
        with Cuda.on(stream):
            for seed in range(4):  # compile (eager), capture + replay, replay, replay
                x = _input(seed + 10 * stream)
                maps, total = graphs(x)
                torch.testing.assert_close(maps, compute(x)[0])
                torch.testing.assert_close(total, compute(x)[1])
        assert fn.eager == 1 and graphs.captures == [((2, 3, 8, 6), stream)]
        stages[name] = graphs
    pose, seg = (g for g in cuda.graphs)
    assert (pose.stream, seg.stream) == (1, 2)  # each captured on its own stage's stream ...
    assert pose.replayed_on == [1, 1, 1] and seg.replayed_on == [2, 2, 2]  # ... and replayed there
    assert pose.pool is not seg.pool and pose.pool is stages["pose"].pool  # a pool of its own


def test_a_graph_warmed_on_one_thread_replays_on_another(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inductor's graph trees are per thread (a warm-up on another thread is recorded again while
    the stream runs); these are not."""
    cuda = Cuda(monkeypatch)
    fn, compute = model_fn(2.0)
    graphs = LaneGraphs(fn, torch.device("cpu"))
    with Cuda.on(1):
        graphs(_input(0))
        graphs(_input(1))
    seen = []

    def run() -> None:
        Cuda.current.append(SimpleNamespace(cuda_stream=1))
        x = _input(2)
        seen.append(torch.equal(graphs(x)[0], compute(x)[0]))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == [True] and len(cuda.graphs) == 1 and fn.eager == 1


def test_the_estimator_hands_out_copies_of_the_static_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    from stages.sapiens2.estimators import Segmenter

    Cuda(monkeypatch)
    est = Segmenter(random_init(Sapiens2(tiny_config("seg", image_size=(64, 48))), seed=0))
    fn, compute = model_fn(2.0)
    est._forward = LaneGraphs(fn, torch.device("cpu"))
    est.fastpath = FastPath(compile="reduce-overhead")  # as resolved on a GPU
    with Cuda.on(1):
        outs = [est.forward(_input(seed))[0] for seed in range(4)]
    for seed, out in enumerate(outs):  # the later replays did not rewrite what the earlier ones gave
        torch.testing.assert_close(out, compute(_input(seed))[0])


@pytest.mark.parametrize("mode, autotune", [("reduce-overhead", False), ("max-autotune", True)])
def test_graph_modes_compile_without_inductors_graphs(mode: str, autotune: bool,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict] = []
    monkeypatch.setattr(torch, "compile", lambda model, **kw: (seen.append(kw), model)[1])
    model = random_init(Sapiens2(tiny_config("pose", image_size=(64, 48))), seed=0)
    forward = compile_model(model, mode, (64, 48))
    assert isinstance(forward, LaneGraphs) and forward.fn is model
    (kwargs,) = seen
    assert "mode" not in kwargs and kwargs["options"]["triton.cudagraphs"] is False
    assert bool(kwargs["options"].get("max_autotune", False)) is autotune
    assert kwargs["fullgraph"] is True and kwargs["dynamic"] is False
    seen.clear()
    assert compile_model(model, "default", (64, 48)) is model and seen[0]["mode"] == "default"


def test_the_engine_keeps_its_lanes_apart_with_cuda_graphs(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    """reduce-overhead used to put every lane, the detector's included, on one stream."""
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: object())
    monkeypatch.setattr(pipeline.lanes, "_STREAMS", {})
    graphed = SimpleNamespace(fastpath=FastPath(compile="reduce-overhead"))
    with caplog.at_level(logging.INFO, "pipeline.engine"):
        engine = FrameEngine(Stages(torch.device("cuda", 0), None, {"pose": graphed, "seg": graphed}))
    streams = engine.lanes.streams
    assert len({id(s) for s in streams.values()}) == len(pipeline.lanes.STREAM_NAMES)
    assert streams["detect"] is not streams["seg"] and streams["pose"] is not streams["seg"]
    assert any("overlap, the detector beside them" in r.getMessage() for r in caplog.records)
    again = FrameEngine(Stages(torch.device("cuda", 0), None, {"pose": graphed}))
    assert again.lanes.streams == streams  # the same streams: graphs captured on them replay there
