"""CUDA streams and graphs stood in for on the CPU, as torch.cuda has them, for the code that only
runs on a GPU (stages.sapiens2.graphs, stages.sapiens2.forward; with FakeGpu the engine's lanes,
events, page-locked uploads and downloads too).

Streams are numbered; ``FakeCuda.on(n)`` makes stream n current; stream 0 is the default stream,
on which CUDA refuses to capture. A graph captures what a watched model computes while it is
captured, and computes it again at each replay. A capture computes nothing: the outputs a model
gives inside a capture are NaN until the graph is replayed, so a graph that is captured but not
replayed hands out NaN, as on a GPU. ``corrupt`` makes every replay wrong, ``fail_capture`` makes
every capture raise (a kernel that cannot be captured).
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
        self.current = [self._numbered(0)]
        self.graphs: list[FakeGraph] = []
        self.capturing: FakeGraph | None = None
        self.corrupt = False
        self.fail_capture = False
        self.waits: list[tuple[int, int]] = []  # (waiting stream, stream waited for) of each wait_stream
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: self.current[-1])
        monkeypatch.setattr(torch.cuda, "default_stream", lambda device=None: self.current[0])
        monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: self._numbered(100 + len(self.waits) + 1))
        monkeypatch.setattr(torch.cuda, "stream", self._enter)
        monkeypatch.setattr(torch.cuda, "CUDAGraph", self._new_graph)
        monkeypatch.setattr(torch.cuda, "graph_pool_handle", object)
        monkeypatch.setattr(torch.cuda, "graph", self._capture)

    def _numbered(self, number: int) -> SimpleNamespace:
        stream = SimpleNamespace(cuda_stream=number, synchronize=lambda: None)
        stream.wait_stream = lambda other: self.waits.append((number, other.cuda_stream))
        return stream

    @contextlib.contextmanager
    def _enter(self, stream: SimpleNamespace) -> Iterator[None]:
        self.current.append(stream)
        try:
            yield
        finally:
            self.current.pop()

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
        if stream.cuda_stream == 0:  # torch's own check (CUDAGraph::capture_begin)
            raise RuntimeError("CUDA graphs must be captured on a non-default stream. (However, after capture, "
                               "it's ok to replay them on the default stream.)")
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

    def on(self, stream: int) -> contextlib.AbstractContextManager:
        return self._enter(self._numbered(stream))


# -- streams, events and page-locked memory -------------------------------------------------------
def _cuda_index(device: Any, optional: bool = True) -> int | None:
    """torch.cuda's own reading of a device argument (torch.cuda._utils._get_device_index): a CPU device
    is refused, and an unindexed "cuda" only where the call takes the current device (``optional``)."""
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if device is None:
        index = None
    elif isinstance(device, torch.device):
        if device.type != "cuda":
            raise ValueError(f"Expected a cuda device, but got: {device}")
        index = device.index
    else:
        raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")
    if index is None and not optional:
        raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")
    return 0 if index is None else index


def _is_cuda(value: Any) -> bool:
    return (isinstance(value, torch.device) and value.type == "cuda") or \
        (isinstance(value, str) and value.split(":")[0] == "cuda")


class FakeStream:
    """A CUDA stream: what was queued on it, in order (events recorded, events waited for, copies), and
    how far the device got (``done``)."""

    def __init__(self, gpu: FakeGpu, number: int) -> None:
        self.gpu, self.cuda_stream = gpu, number
        self.device = torch.device("cuda", 0)
        self.items: list[tuple[str, Any]] = []
        self.done = 0

    def wait_event(self, event: FakeEvent) -> None:
        if not isinstance(event, FakeEvent):
            raise TypeError(f"wait_event(): argument 'event' must be torch.cuda.Event, not {type(event).__name__}")
        self.items.append(("wait", event))
        self.gpu.log.append(("wait", self, event))

    def synchronize(self) -> None:
        self.gpu.log.append(("stream.synchronize", self))
        self.gpu.complete(self, len(self.items))

    def query(self) -> bool:
        return self.done == len(self.items)

    def __repr__(self) -> str:
        return f"<stream {self.cuda_stream}>"


class FakeEvent:
    """A CUDA event: complete once the device has run its stream up to it (never by itself: only when
    the host waits for it, for a later event of its stream, or for the device)."""

    def __init__(self, gpu: FakeGpu, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False) -> None:
        self.gpu, self.timing = gpu, enable_timing
        self.stream: FakeStream | None = None
        self.position = 0  # where its record is in its stream's items
        self.tick = 0
        self.completed = False

    def record(self, stream: FakeStream | None = None) -> None:
        stream = self.gpu.current[-1] if stream is None else stream
        if not isinstance(stream, FakeStream):
            raise TypeError(f"record(): argument 'stream' must be torch.cuda.Stream, not {type(stream).__name__}")
        self.stream, self.completed, self.position = stream, False, len(stream.items)
        self.gpu.ticks += 1
        self.tick = self.gpu.ticks
        stream.items.append(("record", self))
        self.gpu.log.append(("record", stream, self))

    def query(self) -> bool:
        return self.stream is None or self.completed

    def synchronize(self) -> None:
        self.gpu.log.append(("event.synchronize", self))
        if self.stream is not None:
            self.gpu.complete(self.stream, self.position + 1)

    def elapsed_time(self, end: FakeEvent) -> float:
        if not (self.timing and end.timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self.stream is None or end.stream is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        if not (self.completed and end.completed):
            raise RuntimeError("Both events must be completed before calculating elapsed time.")
        return float(end.tick - self.tick)


class FakeGpu(FakeCuda):
    """CUDA's streams, events, device synchronisation and page-locked memory stood in for, on top of
    FakeCuda's graphs; "device" tensors are CPU tensors.

    The device computes a kernel the moment it is queued, but the host sees a copy to page-locked
    memory only once the device got there: ``host.copy_(device_tensor, non_blocking=True)`` fills
    ``host`` when its stream is completed up to the copy (the host waited for a later event, the
    stream or the device), so a result read before its event is waited for holds the fill value of
    a fresh page-locked buffer (NaN, False or 90), as unwritten memory would. A page-locked buffer
    that a copy to the device has not read yet must not be written by the host (AssertionError).
    ``.to("cuda...")`` returns a copy on the CPU. ``log`` records every stream operation in order.
    Current streams and the current device (of ``devices``) are per thread, as CUDA's are.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import threading

        self._local = threading.local()
        self.log: list[tuple] = []
        self.ticks = 0
        self.streams: list[FakeStream] = []
        self.default = self._stream()
        self.pinned: dict[int, torch.Tensor] = {}  # id -> page-locked tensor (kept: ids stay unique)
        self.reading: dict[int, int] = {}  # id of a page-locked buffer -> copies to the device not done
        super().__init__(monkeypatch)
        gpu = self
        monkeypatch.setattr(torch.cuda, "Stream", self._new_stream)
        monkeypatch.setattr(torch.cuda, "Event", lambda *a, **k: FakeEvent(self, *a, **k))
        monkeypatch.setattr(torch.cuda, "stream", self._use)
        monkeypatch.setattr(torch.cuda, "default_stream", lambda device=None: self.default)
        monkeypatch.setattr(torch.cuda, "synchronize", self._synchronize)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: self.devices)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: self.device_index)
        monkeypatch.setattr(torch.cuda, "set_device", self._set_device)
        monkeypatch.setattr(torch.cuda, "device", self._on_device)
        real_to, real_copy, real_cpu, real_empty = torch.Tensor.to, torch.Tensor.copy_, torch.Tensor.cpu, torch.empty

        def to(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            if not (any(_is_cuda(a) for a in args) or _is_cuda(kwargs.get("device"))):
                return real_to(tensor, *args, **kwargs)
            args = tuple("cpu" if _is_cuda(a) else a for a in args)
            if "device" in kwargs:
                kwargs["device"] = "cpu"
            non_blocking = bool(kwargs.get("non_blocking", False))
            stream = gpu.current[-1]
            pinned = id(tensor) in gpu.pinned
            gpu.log.append(("h2d", stream, "pinned" if pinned else "pageable", non_blocking))
            if pinned and non_blocking:  # the device reads the buffer later: the host must leave it alone
                gpu.reading[id(tensor)] = gpu.reading.get(id(tensor), 0) + 1
                stream.items.append(("read", id(tensor)))
            return real_to(tensor, *args, **{**kwargs, "copy": True})

        def copy_(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
            if gpu.reading.get(id(dst)):
                raise AssertionError("the host wrote a page-locked buffer that a copy to the device has not read yet")
            if non_blocking and id(dst) in gpu.pinned:  # device -> page-locked host: lands when the stream gets there
                stream, snapshot = gpu.current[-1], src.detach().clone()
                stream.items.append(("copy", lambda: gpu._land(real_copy, dst, snapshot)))
                gpu.log.append(("d2h", stream, dst))
                return dst
            return real_copy(dst, src, non_blocking=non_blocking)

        def empty(*args: Any, pin_memory: bool = False, **kwargs: Any) -> torch.Tensor:
            tensor = real_empty(*args, **kwargs)
            if pin_memory:
                fill = float("nan") if tensor.is_floating_point() else False if tensor.dtype == torch.bool else 90
                with torch.inference_mode():
                    tensor.fill_(fill)
                gpu.pinned[id(tensor)] = tensor
            return tensor

        def pin_memory(tensor: torch.Tensor, device: Any = None) -> torch.Tensor:
            out = tensor.detach().clone().contiguous()
            gpu.pinned[id(out)] = out
            return out

        def record_stream(tensor: torch.Tensor, stream: Any) -> None:
            if not isinstance(stream, FakeStream):
                raise TypeError(f"record_stream(): argument 's' must be torch.Stream, not {type(stream).__name__}")
            gpu.log.append(("record_stream", stream, tensor.untyped_storage().data_ptr()))

        def cpu(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            stream = gpu.current[-1]  # a blocking copy to pageable memory: the host waits for the stream
            gpu.log.append(("d2h.blocking", stream))
            gpu.complete(stream, len(stream.items))
            return real_cpu(tensor, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "to", to)
        monkeypatch.setattr(torch.Tensor, "cpu", cpu)
        monkeypatch.setattr(torch.Tensor, "copy_", copy_)
        monkeypatch.setattr(torch, "empty", empty)
        monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
        monkeypatch.setattr(torch.Tensor, "is_pinned", lambda tensor, device=None: id(tensor) in gpu.pinned)
        monkeypatch.setattr(torch.Tensor, "record_stream", record_stream)

    devices = 2  # cuda:0 and cuda:1

    # CUDA's current device is per thread: every thread starts on device 0.
    @property
    def device_index(self) -> int:
        return getattr(self._local, "device", 0)

    def _set_device(self, device: Any) -> None:
        index = _cuda_index(device, optional=False)
        if not 0 <= index < self.devices:
            raise RuntimeError("CUDA error: invalid device ordinal")
        self._local.device = index
        self.log.append(("set_device", index))

    @contextlib.contextmanager
    def _on_device(self, device: Any) -> Iterator[None]:
        before = self.device_index
        self._set_device(_cuda_index(device))
        try:
            yield
        finally:
            self._local.device = before

    # CUDA's current stream is per thread: every thread starts on the default stream.
    @property
    def current(self) -> list:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = [self.default]
        return stack

    @current.setter
    def current(self, value: list) -> None:
        pass

    def _new_stream(self, device: Any = None, priority: int = 0) -> FakeStream:
        _cuda_index(device)  # torch.cuda.Stream(device) reads it as torch.cuda.device does
        return self._stream()

    def _stream(self) -> FakeStream:
        self.streams.append(FakeStream(self, len(self.streams)))
        return self.streams[-1]

    @contextlib.contextmanager
    def _use(self, stream: FakeStream | None) -> Iterator[None]:
        if stream is None:  # torch.cuda.stream(None) is a no-op
            yield
            return
        self.current.append(stream)
        try:
            yield
        finally:
            self.current.pop()

    def _synchronize(self, device: Any = None) -> None:
        _cuda_index(device)
        self.log.append(("device.synchronize", device))
        for stream in self.streams:
            self.complete(stream, len(stream.items))

    @staticmethod
    def _land(copy: Any, dst: torch.Tensor, src: torch.Tensor) -> None:
        with torch.inference_mode():  # the buffer may be an inference tensor; the host reads it later, anywhere
            copy(dst, src)

    def complete(self, stream: FakeStream, upto: int) -> None:
        """The device runs ``stream`` up to item ``upto`` (and whatever that waited for)."""
        while stream.done < upto:
            kind, what = stream.items[stream.done]
            stream.done += 1
            if kind == "wait" and what.stream is not None:
                self.complete(what.stream, what.position + 1)
            elif kind == "record":
                what.completed = True
            elif kind == "copy":
                what()
            elif kind == "read":
                self.reading[what] -= 1

    def idle(self) -> None:
        """The device caught up with everything queued (no host call)."""
        for stream in self.streams:
            self.complete(stream, len(stream.items))

    def calls(self, kind: str) -> list[tuple]:
        return [entry for entry in self.log if entry[0] == kind]
