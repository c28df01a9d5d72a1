"""torch.compile of a stage's forward: compiled in a background thread while the stage runs eager,
its artefacts kept across runs in the user's cache folder.

- ``compile_model``: compiled forwards (the attention-kernel choice inside) with static shapes and
  ``fullgraph`` (a graph break is an error, not a silent slowdown), Inductor's own CUDA graphs off
  (the estimator captures its own: stages.sapiens2.graphs); one per input shape, each with a dynamo
  cache of its own, so the stage's thread runs compiled code while another shape compiles.
- ``use_persistent_cache``: Inductor's caches (FX graphs, Triton kernels, autotuning) in
  ``<cache>/compile/<torch version>/<device>/`` instead of a temporary folder, so a second start
  finds every shape compiled (Inductor keys each entry by graph, input shapes and settings).
- ``BackgroundCompile``: a daemon thread that compiles shape after shape on a stream of its own (the
  shapes a stage uses first; never beside CUDA-graph captures) and says when each is ready; the
  estimator switches a shape to its compiled forward only after checking it against eager
  (stages.sapiens2.forward).
- ``leave``: the end of a process while a shape compiles. The interpreter's own exit would end the
  compile thread inside torch's C++ code (an abort, "terminate called without an active exception"),
  and a compiler it started would go on writing into the kept cache after the process: the next start
  would load its half-written output. So the process waits for the compilers it started (seconds: one
  kernel each), then ends with its own exit code; the shapes compiled so far stay in the cache.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import sys
import threading
import time
import types
import weakref
from collections import deque
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from .fastpath import attention_context
from .graphs import compile_step, no_graph_options
from .model import Sapiens2
from .verify import raised

log = logging.getLogger(__name__)

Forward = Callable[[Tensor], tuple[Tensor, Tensor | None]]
_cache_lock = threading.Lock()
_turn = threading.Lock()  # one shape compiles at a time, whichever stage it is for
# Inductor's C++ toolchain probe logs "No CUDA runtime is found" on every CPU-only machine: not news to a user.
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
_USER_CACHE_DIR = os.environ.get("TORCHINDUCTOR_CACHE_DIR")  # set by the user before we ran: theirs is kept
_started: weakref.WeakSet[BackgroundCompile] = weakref.WeakSet()  # every one made in this process
COMPILER_WAIT_S = 120.0  # at exit, the longest wait for the compilers a compile started (one kernel each)
LIBRARY_WAIT_S = 600.0  # at a library user's exit, the longest wait for the shapes under way


def compile_model(model: Sapiens2, mode: str, attention: str = "auto") -> Callable[[tuple[int, ...]], Forward]:
    """A maker of compiled forwards of the model under ``attention``, one per input shape, each with a
    code object, and so a dynamo cache, of its own (named after the shape: the same name in every run,
    so Inductor's kept cache finds it): one that serves a shape never compiles again while another
    shape compiles in the background. Static shapes, ``fullgraph``; callers pass contiguous inputs
    (dynamo guards on strides and sizes)."""
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, 64)

    def forward(pixels: Tensor) -> tuple[Tensor, Tensor | None]:
        with attention_context(attention):  # traced into the graph: no global switch at run time
            return model(pixels)

    def make(shape: tuple[int, ...]) -> Forward:
        code = forward.__code__.replace(co_name=f"forward_{'x'.join(map(str, shape))}")
        fresh = types.FunctionType(code, forward.__globals__, code.co_name, forward.__defaults__,
                                   forward.__closure__)
        return torch.compile(fresh, options=no_graph_options(mode), dynamic=False, fullgraph=True)

    return make


def device_label(device: torch.device) -> str:
    """A folder-safe name of the device whose compiled kernels a cache folder holds."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        name = f"{torch.cuda.get_device_name(device)}-sm{major}{minor}"
    else:
        name = device.type
    return re.sub(r"[^\w.+-]+", "-", name).strip("-")


def use_persistent_cache(root: Path, device: torch.device) -> Path | None:
    """Point Inductor's caches at ``root/compile/<torch>/<device>`` (once per process); the folder, or
    None when the user set TORCHINDUCTOR_CACHE_DIR (theirs is kept) or it cannot be made."""
    if _USER_CACHE_DIR is not None:
        return None
    with _cache_lock:
        folder = root / "compile" / re.sub(r"[^\w.+-]+", "-", torch.__version__) / device_label(device)
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            log.warning("compiled kernels are not kept across runs: cannot create %s (%s)", folder, exc.strerror)
            return None
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
        return folder


class BackgroundCompile:
    """Compiles a forward for one input shape after another on a daemon thread and a stream of its own.

    ``submit(shape)`` queues a shape (each once; ``first=True``: ahead of the others, for a shape the
    stage is using now); ``compiled_for(shape)`` is its compiled forward once ready, else None.
    ``on_ready(shape, seconds, from_cache)`` is called from the thread as each shape is done.
    ``failed`` holds the reason once compiling raised: the thread stops and the caller switches
    compile off.
    """

    def __init__(self, make: Callable[[tuple[int, ...]], Forward], make_input: Callable[[tuple[int, ...]], Tensor],
                 device: torch.device, task: str,
                 on_ready: Callable[[tuple[int, ...], float, bool], None] | None = None) -> None:
        self.make, self.make_input, self.device, self.task = make, make_input, device, task
        self.on_ready = on_ready
        self.failed: str | None = None
        self.started = time.perf_counter()
        self._compiled: dict[tuple[int, ...], Forward] = {}
        self._seconds: dict[tuple[int, ...], float] = {}
        self._queued: set[tuple[int, ...]] = set()
        self._queue: deque[tuple[int, ...]] = deque()
        self._stop = False
        self._compiling: tuple[int, ...] | None = None  # the shape being compiled now
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"compile-{task}", daemon=True)
        _started.add(self)
        self._thread.start()

    def submit(self, shape: tuple[int, ...], first: bool = False) -> None:
        with self._changed:
            if self.failed is not None or shape in self._compiled:
                return
            if shape in self._queued:
                if first and shape in self._queue:
                    self._queue.remove(shape)
                    self._queue.appendleft(shape)
                return
            self._queued.add(shape)
            self._queue.appendleft(shape) if first else self._queue.append(shape)
            self._changed.notify_all()

    def compiled_for(self, shape: tuple[int, ...]) -> Forward | None:
        return self._compiled.get(shape)

    def seconds(self, shape: tuple[int, ...]) -> float:
        """How long compiling ``shape`` took (0 when it is not compiled)."""
        return self._seconds.get(shape, 0.0)

    def pending(self) -> int:
        """Shapes queued and not compiled yet."""
        return len(self._queued) - len(self._compiled)

    def wait(self, timeout: float | None = None) -> bool:
        """Until every queued shape is compiled, compiling failed, or ``timeout``; True when all are ready."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while self.pending() and self.failed is None and not self._stop:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._changed.wait(left)
        return not self.pending() and self.failed is None

    def close(self) -> None:
        """Stop after the shape being compiled (a compile in progress cannot be interrupted)."""
        with self._changed:
            self._stop = True
            self._changed.notify_all()

    def join(self, timeout: float) -> None:
        """Wait, at most ``timeout`` seconds, for the thread to end (after ``close``)."""
        self._thread.join(timeout)

    def compiling(self) -> tuple[int, ...] | None:
        """The input shape being compiled now, if any."""
        return self._compiling if self._thread.is_alive() else None

    def _next(self) -> tuple[int, ...] | None:
        with self._changed:
            while not self._queue and not self._stop:
                self._changed.wait()
            return None if self._stop else self._queue.popleft()

    def _run(self) -> None:
        stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        while (shape := self._next()) is not None:
            self._compiling = shape
            try:
                with _turn, compile_step(), torch.inference_mode(), _on(stream):
                    t0, before = time.perf_counter(), cache_counts()
                    compiled = self.make(shape)
                    compiled(self.make_input(shape))
                    if stream is not None:
                        stream.synchronize()
                    seconds, (hits, misses) = time.perf_counter() - t0, cache_counts(before)
            except Exception as exc:  # the stage stays on its eager forward; the caller says so once
                self.failed = f"compiling input {shape} raised {raised(exc)}"
                log.debug("%s: compile failed", self.task, exc_info=True)
            else:
                self._seconds[shape] = seconds
                self._compiled[shape] = compiled
                if self.on_ready is not None:
                    self.on_ready(shape, seconds, hits > 0 and misses == 0)
            self._compiling = None
            with self._changed:
                self._changed.notify_all()
            if self.failed is not None:
                break


def leave(code: int) -> None:
    """Where a process ends with ``code`` (the command line's last step): while a shape compiles, wait for
    the compilers it started, then end the process here with ``code``; otherwise return."""
    busy = _busy()
    if not busy:
        return
    log.info("stopped while compiling %s; what compiled before is kept for the next start", ", ".join(busy))
    deadline, running = time.monotonic() + COMPILER_WAIT_S, compilers_running()
    with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: end now
        while running and time.monotonic() < deadline:
            time.sleep(0.05)
            running = compilers_running()
    if running:
        log.warning("compiler processes %s still running: left to finish on their own", " ".join(map(str, running)))
    logging.shutdown()  # flushes the handlers, as the interpreter's exit would
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


@atexit.register
def _finish_compiles() -> None:
    """At a library user's exit (the command line leaves through ``leave``): each compile under way
    finishes its shape first, where the interpreter would otherwise abort inside it."""
    if busy := _busy():
        log.info("waiting for the compile of %s to finish before the process exits", ", ".join(busy))
    deadline = time.monotonic() + LIBRARY_WAIT_S
    for compiler in list(_started):
        compiler.close()
        compiler.join(max(0.0, deadline - time.monotonic()))


def _busy() -> list[str]:
    return [f"{c.task} input {'x'.join(map(str, shape))}" for c in list(_started) if (shape := c.compiling())]


def compilers_running(pid: int | None = None) -> list[int]:
    """The C/C++ compiler processes (Inductor's kernel builds) that are children of ``pid`` (this
    process), found in /proc: none where there is no /proc."""
    parent, found = str(pid or os.getpid()), []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = stat.read_text()
            name, fields = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
            if fields[1] == parent and fields[0] != "Z" and _is_compiler(name):
                found.append(int(stat.parent.name))
    return found


def _is_compiler(name: str) -> bool:
    """Whether a process name (at most 15 characters, as /proc gives it) is a C/C++ compiler driver."""
    return name in ("cc", "c++", "nvcc") or name.endswith(("gcc", "g++", "clang", "clang++"))


def cache_counts(since: tuple[int, int] = (0, 0)) -> tuple[int, int]:
    """Inductor's compiled-graph cache hits and misses in this process (less ``since``)."""
    from torch._dynamo.utils import counters

    hits = counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"]
    misses = counters["inductor"]["fxgraph_cache_miss"]
    return hits - since[0], misses - since[1]


def _on(stream: torch.cuda.Stream | None) -> contextlib.AbstractContextManager:
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


__all__ = ["BackgroundCompile", "cache_counts", "compile_model", "device_label", "use_persistent_cache"]
