"""CUDA graphs of a stage's forward (eager or compiled), each captured on the stage's own stream in
the stage's own memory pool, and checked against the forward it replays.

- One graph per forward kind ("eager", "compiled"), input (shape, dtype) and stream: a graph replays
  on the stream it was captured on. Called from the default stream (which CUDA does not capture), an
  estimator's graphs live on a side stream of its own, ordered with the caller's.
- One private memory pool per estimator, whose graphs replay in order, never at the same time; the
  compile modes run Inductor's kernels without Inductor's own graphs (``no_graph_options``).
- A key's first call runs the forward as it is; the second captures, replays and compares the replay
  with the forward outside the graph. A capture that fails or disagrees raises ``GraphFailure``: the
  caller switches graphs off for the run.
- Captures and background compiles never overlap (a compile's autotuning synchronises the device,
  which a capture on another thread cannot survive): a compile starts only when no warm-up is under
  way (``warming_up``), and a key due for capture while one compiles (``compiling``) runs as it is
  and is captured at a later call.

The outputs are the graph's static tensors, rewritten by its next replay: callers copy them.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .verify import mismatch, raised

log = logging.getLogger(__name__)

Forward = Callable[[Tensor], tuple[Tensor, Tensor | None]]


class GraphFailure(RuntimeError):
    """A CUDA graph could not be captured, or its replay disagreed with the forward it captured."""


_quiet = threading.Condition()  # guards the two counts below
_warming = 0  # warm-ups under way (their captures come first: compiles wait)
_compiling = 0  # background compiles under way (captures wait)


@contextlib.contextmanager
def warming_up() -> Iterator[None]:
    """Around a warm-up (nested ones count once each): no background compile starts meanwhile."""
    global _warming
    with _quiet:
        _warming += 1
    try:
        yield
    finally:
        with _quiet:
            _warming -= 1
            _quiet.notify_all()


@contextlib.contextmanager
def compile_step() -> Iterator[None]:
    """Around one background compile: waits until no warm-up is under way; captures wait meanwhile."""
    global _compiling
    with _quiet:
        _quiet.wait_for(lambda: _warming == 0)
        _compiling += 1
    try:
        yield
    finally:
        with _quiet:
            _compiling -= 1
            _quiet.notify_all()


def compiling() -> bool:
    """Whether a background compile is under way (a capture now would overlap it)."""
    return _compiling > 0


def no_graph_options(mode: str) -> dict[str, Any]:
    """Inductor's options of a compile mode with its own CUDA graphs switched off (the same kernels)."""
    from torch._inductor import list_mode_options

    return {**list_mode_options(mode), "triton.cudagraphs": False}


@dataclass
class _Captured:
    graph: Any  # torch.cuda.CUDAGraph
    pixels: Tensor  # the static input, copied into before each replay
    outputs: tuple[Tensor, Tensor | None]  # the static outputs


class LaneGraphs:
    """Forwards replayed as CUDA graphs: see the module docstring."""

    def __init__(self, device: torch.device, warm_runs: int = 1) -> None:
        self.device, self.warm_runs = device, warm_runs
        self.pool: Any = None  # this estimator's private memory pool (made at the first capture)
        self.graphs: dict[tuple, _Captured] = {}
        self.runs: dict[tuple, int] = {}
        self.captures: list[tuple[str, tuple[int, ...], int]] = []  # (kind, shape, stream) of each capture
        self._side: Any = None  # the stream of graphs called from the default stream (made when first needed)

    def __call__(self, kind: str, fn: Forward, pixels: Tensor) -> tuple[Tensor, Tensor | None]:
        current = torch.cuda.current_stream(self.device)
        if current.cuda_stream != torch.cuda.default_stream(self.device).cuda_stream:
            return self._on(kind, fn, pixels, current)
        # CUDA captures nothing on the default stream (an estimator called outside the engine's lanes, a
        # user's script): its graphs live on a side stream of their own, ordered with the caller's.
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        side = self._side
        side.wait_stream(current)
        with torch.cuda.stream(side):
            outputs = self._on(kind, fn, pixels, side)
        current.wait_stream(side)
        for tensor in outputs:
            if tensor is not None and tensor.is_cuda:
                tensor.record_stream(current)  # made on the side stream, read on the caller's
        return outputs

    def _on(self, kind: str, fn: Forward, pixels: Tensor, stream: Any) -> tuple[Tensor, Tensor | None]:
        key = (kind, tuple(pixels.shape), pixels.dtype, stream.cuda_stream)
        captured = self.graphs.get(key)
        if captured is None:
            if self.runs.get(key, 0) < self.warm_runs:
                self.runs[key] = self.runs.get(key, 0) + 1
                return fn(pixels.contiguous())  # the layout the capture will have: no recompile in it
            if compiling():
                return fn(pixels.contiguous())  # captured at a call with no compile beside it
            captured = self._capture(kind, fn, pixels, stream)
            self.graphs[key] = captured
            return captured.outputs
        captured.pixels.copy_(pixels)  # (B, 3, h, w)
        captured.graph.replay()
        return captured.outputs

    def has(self, kind: str, pixels: Tensor) -> bool:
        """Whether a graph of this kind is captured for this input on the current stream (or, called
        from the default stream, on the side stream)."""
        stream = torch.cuda.current_stream(self.device)
        if stream.cuda_stream == torch.cuda.default_stream(self.device).cuda_stream and self._side is not None:
            stream = self._side
        return (kind, tuple(pixels.shape), pixels.dtype, stream.cuda_stream) in self.graphs

    def drop(self, kind: str, shape: tuple[int, ...]) -> None:
        """Forget the graphs of a kind for an input shape (replaced by another kind's)."""
        for key in [k for k in self.graphs if k[0] == kind and k[1] == shape]:
            del self.graphs[key]

    def _capture(self, kind: str, fn: Forward, pixels: Tensor, stream: Any) -> _Captured:
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        static = pixels.contiguous().clone()  # (B, 3, h, w): holds this call's input already
        graph = torch.cuda.CUDAGraph()
        try:
            # thread_local: another thread's CUDA calls (a sink's JPEG encode) do not break the capture
            with torch.cuda.graph(graph, pool=self.pool, stream=stream, capture_error_mode="thread_local"):
                outputs = fn(static)
            graph.replay()
            expected = fn(static.clone())  # the same forward outside the graph, on the same input
        except Exception as exc:  # a capture that fails leaves the forward as it was: the caller goes on without
            raise GraphFailure(f"capturing the {kind} forward for input {tuple(pixels.shape)} raised "
                               f"{raised(exc)}") from exc
        reason = mismatch(outputs, expected, outputs[0].dtype)
        if reason is not None:
            raise GraphFailure(f"the {kind} graph for input {tuple(pixels.shape)}: {reason}")
        self.captures.append((kind, tuple(pixels.shape), stream.cuda_stream))
        log.debug("CUDA graph captured: %s forward, input %s on stream %#x", kind, tuple(pixels.shape),
                  stream.cuda_stream)
        return _Captured(graph, static, outputs)


__all__ = ["GraphFailure", "LaneGraphs", "compile_step", "compiling", "no_graph_options", "warming_up"]
