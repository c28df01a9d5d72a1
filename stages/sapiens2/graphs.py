"""CUDA graphs of a compiled forward, each captured on its stage's own stream in its stage's own pool.

Inductor's own CUDA graphs (``reduce-overhead``, ``max-autotune``) keep one tree of graphs per thread
and device with one memory pool, and assume its graphs replay one after another: the graphs of two
stages replayed at once on two streams could overwrite each other's memory, so every stage had to
run on one stream and the detector waited behind the dense work. Here Inductor compiles the same
kernels without graphs (``no_graph_options``) and each estimator captures its own (``LaneGraphs``):

- one graph per input (shape, dtype) and stream, captured on the stream current at capture (in the
  engine, the stage's lane: the graph replays where it was captured; cuBLAS keeps one workspace per
  stream, and a graph captured on one stream and replayed on another beside eager work on the first
  would share it with that work);
- one private memory pool per estimator: its graphs share memory with each other only, and they
  replay in order on their stage's stream, never at the same time as each other;
- the first call of a shape runs the compiled function (compiling, autotuning, cuDNN and cuBLAS set
  up: nothing of that may happen inside a capture), the second captures and replays, later ones
  replay. A graph is not tied to a thread: a warm-up on one thread serves replays on another.

The outputs are the graph's static tensors, rewritten by its next replay: the estimator copies them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

log = logging.getLogger(__name__)

Forward = Callable[[Tensor], tuple[Tensor, Tensor | None]]


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
    """``fn`` (a compiled forward) replayed as CUDA graphs: see the module docstring."""

    def __init__(self, fn: Forward, device: torch.device, warm_runs: int = 1) -> None:
        self.fn, self.device, self.warm_runs = fn, device, warm_runs
        self.pool: Any = None  # this estimator's private memory pool (made at the first capture)
        self.graphs: dict[tuple, _Captured] = {}
        self.runs: dict[tuple, int] = {}
        self.captures: list[tuple[tuple[int, ...], int]] = []  # (shape, stream) of each capture, for reports

    def __call__(self, pixels: Tensor) -> tuple[Tensor, Tensor | None]:
        stream = torch.cuda.current_stream(self.device)
        key = (tuple(pixels.shape), pixels.dtype, stream.cuda_stream)
        captured = self.graphs.get(key)
        if captured is None:
            if self.runs.get(key, 0) < self.warm_runs:
                self.runs[key] = self.runs.get(key, 0) + 1
                return self.fn(pixels.contiguous())  # the layout the capture will have: no recompile in it
            captured = self._capture(pixels, stream)
            self.graphs[key] = captured
        else:
            captured.pixels.copy_(pixels)  # (B, 3, h, w)
        captured.graph.replay()
        return captured.outputs

    def _capture(self, pixels: Tensor, stream: Any) -> _Captured:
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        static = pixels.contiguous().clone()  # (B, 3, h, w): holds this call's input already
        graph = torch.cuda.CUDAGraph()
        # thread_local: another thread's CUDA calls (a sink's JPEG encode) do not break the capture
        with torch.cuda.graph(graph, pool=self.pool, stream=stream, capture_error_mode="thread_local"):
            outputs = self.fn(static)
        self.captures.append((tuple(pixels.shape), stream.cuda_stream))
        log.debug("CUDA graph captured: input %s on stream %#x", tuple(pixels.shape), stream.cuda_stream)
        return _Captured(graph, static, outputs)


__all__ = ["LaneGraphs", "no_graph_options"]
