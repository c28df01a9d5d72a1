"""CUDA streams and graphs stood in for on the CPU, as torch.cuda has them, for the code that only
runs on a GPU (stages.sapiens2.graphs, stages.sapiens2.forward).

Streams are numbered; ``FakeCuda.on(n)`` makes stream n current. A graph captures what a watched
model computes while it is captured, and computes it again at each replay. A capture computes
nothing: the outputs a model gives inside a capture are NaN until the graph is replayed, so a
graph that is captured but not replayed hands out NaN, as on a GPU. ``corrupt`` makes every replay
wrong, ``fail_capture`` makes every capture raise (a kernel that cannot be captured).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch


class FakeGraph:
    def __init__(self, cuda: FakeCuda) -> None:
        self.cuda = cuda
        self.work: list[tuple[torch.nn.Module, torch.Tensor, tuple]] = []
        self.pool: Any = None
        self.stream: int | None = None
        self.replayed_on: list[int] = []

    def replay(self) -> None:
        self.replayed_on.append(self.cuda.current[-1].cuda_stream)
        for module, x, outs in self.work:
            with self.cuda.not_capturing():
                fresh = module(x)
            for out, value in zip(outs, fresh):
                if out is not None:
                    out.copy_(value * 2.0 + 1.0 if self.cuda.corrupt else value)


class FakeCuda:
    """Installs the stand-ins with ``monkeypatch``; ``watch(model)`` makes a model's forward capturable."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.current = [SimpleNamespace(cuda_stream=0, synchronize=lambda: None)]
        self.graphs: list[FakeGraph] = []
        self.capturing: FakeGraph | None = None
        self.corrupt = False
        self.fail_capture = False
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: self.current[-1])
        monkeypatch.setattr(torch.cuda, "CUDAGraph", self._new_graph)
        monkeypatch.setattr(torch.cuda, "graph_pool_handle", object)
        monkeypatch.setattr(torch.cuda, "graph", self._capture)

    def _new_graph(self) -> FakeGraph:
        self.graphs.append(FakeGraph(self))
        return self.graphs[-1]

    def watch(self, model: torch.nn.Module) -> torch.nn.Module:
        """While a graph is captured, the model's outputs are recorded into it and handed out as NaN."""
        def hook(module: torch.nn.Module, inputs: tuple, output: tuple) -> tuple | None:
            if self.capturing is None:
                return None
            if self.fail_capture:
                raise RuntimeError("operation not permitted when stream is capturing")
            static = tuple(None if t is None else torch.full_like(t, float("nan")) for t in output)
            self.capturing.work.append((module, inputs[0], static))
            return static

        model.register_forward_hook(hook)
        return model

    @contextlib.contextmanager
    def _capture(self, graph: FakeGraph, pool: Any = None, stream: Any = None,
                 capture_error_mode: str = "global") -> Iterator[None]:
        graph.pool, graph.stream = pool, stream.cuda_stream
        self.capturing = graph
        self.current.append(stream)
        try:
            yield
        finally:
            self.capturing = None
            self.current.pop()

    @contextlib.contextmanager
    def not_capturing(self) -> Iterator[None]:
        capturing, self.capturing = self.capturing, None
        try:
            yield
        finally:
            self.capturing = capturing

    @contextlib.contextmanager
    def on(self, stream: int) -> Iterator[None]:
        self.current.append(SimpleNamespace(cuda_stream=stream, synchronize=lambda: None))
        try:
            yield
        finally:
            self.current.pop()
