"""The forward a Sapiens2 estimator runs, and the checks that keep its fast paths honest.

``FastForward(pixels)`` runs the model eagerly, or its compiled forward once that is ready for the
input shape, and on CUDA replays either as a CUDA graph (stages.sapiens2.graphs). Nothing fast is
used before it has agreed with eager on the user's own device (stages.sapiens2.verify):

- at warm-up (``check_switches``): float16 against bfloat16, a chosen attention kernel and
  channels_last against the plain eager forward, on one fixed picture;
- each CUDA graph at its capture, against the forward it captured;
- each compiled shape when it is first used, against eager on that step's input.

A fast path that raises or disagrees is switched off for the run (one warning); the step in hand
is computed eagerly, so a fast path never ends a run.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import torch
from torch import Tensor

from .compiled import BackgroundCompile, compile_model, use_persistent_cache
from .fastpath import FastPath, attention_context
from .graphs import GraphFailure, LaneGraphs, compiling
from .model import Sapiens2
from .verify import disagreement, mismatch, raised, switched_off

log = logging.getLogger(__name__)

Outputs = tuple[Tensor, Tensor | None]


class FastForward:
    """One estimator's forward under its resolved fast path (see the module docstring)."""

    def __init__(self, model: Sapiens2, fastpath: FastPath, task: str, cache_root: Path | None = None) -> None:
        self.model, self.fastpath, self.task, self.cache_root = model, fastpath, task, cache_root
        self.graphs = LaneGraphs(model.device) if fastpath.graphs else None
        self.compiler: BackgroundCompile | None = None
        self.off: dict[str, str] = {}  # fast path -> why it was switched off
        self.inputs: dict[tuple[int, ...], torch.dtype] = {}  # every input (shape, dtype) seen, warm-up first
        self._agreed: set[tuple[int, ...]] = set()  # shapes whose compiled forward agreed with eager

    # -- the forward ------------------------------------------------------------------------
    def eager(self, pixels: Tensor) -> Outputs:
        with attention_context(self.fastpath.attention):
            return self.model(pixels)

    def __call__(self, pixels: Tensor) -> Outputs:
        """pixels (B, 3, h, w) -> (maps, scale), tensors the caller may keep."""
        shape = tuple(pixels.shape)
        if shape not in self.inputs:
            self.inputs[shape] = pixels.dtype
        compiled = self._compiled_for(pixels)
        kind, fn = ("compiled", compiled) if compiled is not None else ("eager", self.eager)
        if self.graphs is not None:
            try:
                maps, scale = self.graphs(kind, fn, pixels)
                # Graph outputs are rewritten by the next replay: copies, made on this stream.
                return maps.clone(), None if scale is None else scale.clone()
            except GraphFailure as exc:
                self._switch_off("CUDA graphs", str(exc))
            except Exception as exc:  # a replay, or the compiled forward run before its capture
                if compiled is not None:
                    self._switch_off("compile", f"the compiled forward raised {raised(exc)}")
                    return self(pixels)  # eager, under its own graphs
                self._switch_off("CUDA graphs", f"a graph of input {shape} raised {raised(exc)}")
        try:
            return fn(pixels)
        except Exception as exc:
            if compiled is None:
                raise  # the eager forward itself: not a fast path
            self._switch_off("compile", f"the compiled forward raised {raised(exc)}")
            return self.eager(pixels)

    def _compiled_for(self, pixels: Tensor) -> Callable[[Tensor], Outputs] | None:
        """The compiled forward for this input once it is compiled and has agreed with eager, else None
        (a shape the stage uses goes to the front of the compile queue)."""
        compiler, shape = self.compiler, tuple(pixels.shape)
        if compiler is None:
            return None
        if compiler.failed is not None:
            self._switch_off("compile", compiler.failed)
            return None
        compiled = compiler.compiled_for(shape)
        if compiled is None or pixels.dtype != self.inputs[shape] or not torch.is_inference_mode_enabled():
            compiler.submit(shape, first=True)
            return None  # (another dtype or grad mode would compile again here, on the stage's thread)
        if shape not in self._agreed:
            if self.graphs is not None and compiling():
                return None  # its check and its graph wait for a step with no compile beside them
            if not self._agrees(compiled, pixels):
                return None
        return lambda x: compiled(x.contiguous())

    def _agrees(self, compiled: Callable[[Tensor], Outputs], pixels: Tensor) -> bool:
        shape = tuple(pixels.shape)
        try:
            got = compiled(pixels.contiguous())
        except Exception as exc:
            self._switch_off("compile", f"the compiled forward for input {shape} raised {raised(exc)}")
            return False
        reason = mismatch(got, self.eager(pixels), self.model.dtype)
        if reason is not None:
            self._switch_off("compile", f"input {shape}: {reason}")
            return False
        self._agreed.add(shape)
        log.info("%s: compiled forward in use for input %s (compiled in %.1f s, %.1f s after start-up; checked "
                 "against eager)", self.task, "x".join(map(str, shape)), self.compiler.seconds(shape),
                 time.perf_counter() - self.compiler.started)
        if self.graphs is not None:
            self.graphs.drop("eager", shape)
        return True

    def _switch_off(self, name: str, reason: str) -> None:
        if name in self.off:
            return
        self.off[name] = reason
        switched_off(self.task, name, reason)
        if name == "CUDA graphs":
            self.graphs = None
            self.fastpath = replace(self.fastpath, cuda_graphs="off")
        elif name == "compile":
            if self.compiler is not None:
                self.compiler.close()
            self.compiler = None
            if self.graphs is not None:
                for shape in list(self.inputs):
                    self.graphs.drop("compiled", shape)
            self.fastpath = replace(self.fastpath, compile="off")

    # -- warm-up ----------------------------------------------------------------------------
    def check_switches(self, pixels: Tensor) -> None:
        """Float16, the attention kernel and channels_last, each against the plain eager forward on
        ``pixels`` (1, 3, h, w); the ones that disagree are switched off before anything is captured."""
        fp = self.fastpath
        if self.model.dtype == torch.float16:
            reason = self._float16_disagrees(pixels)
            if reason is not None:
                self._switch_off("float16", f"{reason}; running in bfloat16")
                self.model.set_precision(torch.bfloat16)
        if fp.attention == "auto" and not fp.channels_last:
            return
        with self._plain():
            reference = self.model(pixels)
        dtype = self.model.dtype
        if fp.attention != "auto":
            with self._plain():
                reason = disagreement(lambda: self._run(pixels, attention=fp.attention), reference, dtype)
            if reason is not None:
                self._switch_off(f"attention={fp.attention}", f"{reason}; using auto")
                self.fastpath = replace(self.fastpath, attention="auto")
        if fp.channels_last:
            with self._plain():
                self.model.set_channels_last(True)
                reason = disagreement(lambda: self.model(pixels), reference, dtype)
            if reason is not None:
                self._switch_off("channels_last", reason)
                self.fastpath = replace(self.fastpath, channels_last=False)
            self.model.set_channels_last(bool(self.fastpath.channels_last))

    def _run(self, pixels: Tensor, attention: str) -> Outputs:
        with attention_context(attention):
            return self.model(pixels)

    @contextlib.contextmanager
    def _plain(self) -> Iterator[None]:
        """The plain eager forward: channels_last off (restored after)."""
        self.model.set_channels_last(False)
        try:
            yield
        finally:
            self.model.set_channels_last(bool(self.fastpath.channels_last))

    def _float16_disagrees(self, pixels: Tensor) -> str | None:
        """Why float16 cannot be trusted against bfloat16 on this input, or None. The float16
        weights wait on the host meanwhile, and come back unchanged."""
        with self._plain():
            try:
                half = self.model(pixels)
            except Exception as exc:  # any failure of a fast path turns it off
                return f"it raised {raised(exc)}"
            params = list(self.model.parameters())
            kept = [p.data.to("cpu") for p in params]
            residual = self.model.backbone.residual_dtype
            try:
                self.model.set_precision(torch.bfloat16)
                reference = self.model(pixels)
            finally:
                for param, data in zip(params, kept):
                    param.data = data.to(self.model.device) if data.device != self.model.device else data
                self.model.backbone.residual_dtype = residual
        return mismatch(half, reference, torch.bfloat16)

    def start_compile(self, make_input: Callable[[tuple[int, ...], torch.dtype], Tensor]) -> None:
        """Compile every input shape seen so far (and each new one as it comes) in the background."""
        if self.fastpath.compile == "off" or self.compiler is not None:
            return
        if self.cache_root is not None:
            folder = use_persistent_cache(self.cache_root, self.model.device)
            if folder is not None:
                log.debug("%s: compiled kernels kept in %s", self.task, folder)
        maker = compile_model(self.model, self.fastpath.compile, self.fastpath.attention)
        inputs = self.inputs

        def make(shape: tuple[int, ...]) -> Tensor:
            return make_input(shape, inputs.get(shape, torch.float32))

        self.compiler = BackgroundCompile(maker, make, self.model.device, self.task, self._compiled_log)
        for shape in list(self.inputs):
            self.compiler.submit(shape)

    def _compiled_log(self, shape: tuple[int, ...], seconds: float, from_cache: bool) -> None:
        log.info("%s: input %s compiled in %.1f s%s (in the background; used from its next step)", self.task,
                 "x".join(map(str, shape)), seconds, ", from the kept cache" if from_cache else "")

    def wait_compiled(self, timeout: float | None = None) -> bool:
        """Until every shape seen is compiled (True), compiling failed or ``timeout`` passed."""
        return self.compiler is not None and self.compiler.wait(timeout)

    def close(self) -> None:
        if self.compiler is not None:
            self.compiler.close()

    def describe(self) -> str:
        """One line for the log, e.g. ``attention=auto channels_last=off compile=off cuda_graphs=on``."""
        return self.fastpath.describe()


__all__ = ["FastForward"]
