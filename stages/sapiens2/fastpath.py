"""GPU fast-path options of a Sapiens2 estimator, each switchable and each numerically equivalent.

    fp = FastPath(attention="flash", channels_last=True, compile="reduce-overhead")
    pose = PoseEstimator(model, fastpath=fp)
    seconds = pose.warmup(max_batch=8)       # compiles/records every batch bucket once

- ``attention``: which scaled-dot-product-attention kernels the forward may use ("auto" lets PyTorch
  choose). A backend that cannot run this model here (CPU, unsupported head size, dtype or GQA) falls
  back to "auto" with one warning instead of failing mid-stream.
- ``channels_last``: the decode head's convolutions run in NHWC (faster cuDNN kernels on tensor
  cores). ``None`` means on for CUDA, off for CPU.
- ``compile``: ``torch.compile`` of the whole model forward with static shapes and ``fullgraph``
  (the pose batch buckets keep the number of shapes small). "reduce-overhead" and "max-autotune"
  replay CUDA graphs (Inductor says which modes do): Inductor compiles their kernels without its
  own graphs and the estimator captures one per shape on its stage's stream, in its own memory
  pool (stages.sapiens2.graphs), so the stages keep running side by side. Opt-in: the first call
  of every shape compiles, which the estimators' ``warmup()`` does up front (on the stream that
  replays) and times.

"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from .graphs import LaneGraphs, no_graph_options
from .model import Sapiens2
from .switches import ATTENTION_NAMES, COMPILE_MODES

log = logging.getLogger(__name__)

ATTENTION_BACKENDS = {
    "auto": None,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}
assert tuple(ATTENTION_BACKENDS) == ATTENTION_NAMES
_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


@dataclass(frozen=True)
class FastPath:
    """Fast-path switches of one estimator; every combination computes the same outputs."""

    attention: str = "auto"  # auto | flash | efficient | cudnn | math
    channels_last: bool | None = None  # None: on for CUDA, off for CPU
    compile: str = "off"  # one of COMPILE_MODES

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_BACKENDS:
            raise ValueError(f"attention: {self.attention!r} is not one of {', '.join(ATTENTION_BACKENDS)}")
        if self.compile not in COMPILE_MODES:
            raise ValueError(f"compile: {self.compile!r} is not one of {', '.join(COMPILE_MODES)}")
        if self.channels_last not in (None, True, False):
            raise ValueError(f"channels_last: expected true, false or auto (null), got {self.channels_last!r}")

    @property
    def cuda_graphs(self) -> bool:
        """Whether Inductor captures CUDA graphs in this compile mode (asked of Inductor itself:
        reduce-overhead and max-autotune both do)."""
        return compile_captures_cuda_graphs(self.compile)

    def resolve(self, model: Sapiens2, input_size: tuple[int, int] | None = None) -> FastPath:
        """Concrete options for this model on its device (at this input size): auto filled in,
        unusable choices dropped."""
        device = model.device
        channels_last = device.type == "cuda" if self.channels_last is None else self.channels_last
        attention = self.attention
        if device.type != "cuda" and attention not in ("auto", "math"):
            _warn_once(f"attention={attention!r} needs CUDA; using 'auto' on {device.type}")
            attention = "auto"
        elif attention != "auto":
            problem = probe_attention(attention, model, input_size)
            if problem:
                _warn_once(f"attention={attention!r} cannot run this model here ({problem}); using 'auto'")
                attention = "auto"
        compile_mode = self.compile
        if self.cuda_graphs and device.type != "cuda":
            fallback = {"reduce-overhead": "default", "max-autotune": "max-autotune-no-cudagraphs"}[compile_mode]
            _warn_once(f"compile={compile_mode!r} captures CUDA graphs, which need CUDA; using compile={fallback!r}")
            compile_mode = fallback
        return replace(self, attention=attention, channels_last=channels_last, compile=compile_mode)

    def describe(self, model: Sapiens2 | None = None) -> str:
        """One line for the log, e.g. ``attention=flash channels_last=on compile=off``."""
        onoff = {True: "on", False: "off", None: "auto"}
        parts = [f"attention={self.attention}", f"channels_last={onoff[self.channels_last]}",
                  f"compile={self.compile}"]
        return " ".join(parts)


def compile_captures_cuda_graphs(mode: str) -> bool:
    """True when ``torch.compile(mode=mode)`` makes Inductor record and replay CUDA graphs."""
    if mode == "off":
        return False
    from torch._inductor import list_mode_options

    return bool(list_mode_options(mode).get("triton.cudagraphs", False))


def attention_context(attention: str) -> contextlib.AbstractContextManager:
    """Context manager restricting SDPA to one backend ("auto": no restriction)."""
    backend = ATTENTION_BACKENDS[attention]
    return contextlib.nullcontext() if backend is None else sdpa_kernel(backend)


def probe_attention(attention: str, model: Sapiens2, input_size: tuple[int, int] | None = None) -> str | None:
    """Why ``attention`` cannot run this model's attention on its device, or None if it can.

    The probe uses the real token count (at ``input_size``) and the real layouts: q and k
    contiguous (B, H, T, hd) as RoPE leaves them, v a strided view of the projection output.
    """
    cfg = model.cfg
    # Attention inputs are in the compute dtype (float16 included: only the residual stays float32).
    dtype, device = model.dtype, model.device
    patch = cfg.patch_size
    tokens = cfg.num_prefix_tokens + (16 if input_size is None else (input_size[0] // patch) * (input_size[1] // patch))
    hd = cfg.head_dim
    for kv_heads in sorted(set(cfg.num_key_value_heads_per_layer)):
        q = torch.randn(1, cfg.num_attention_heads, tokens, hd, device=device, dtype=dtype)
        k = torch.randn(1, kv_heads, tokens, hd, device=device, dtype=dtype)
        projected = torch.randn(1, tokens, 2 * kv_heads * hd, device=device, dtype=dtype)
        v = projected[..., kv_heads * hd:].view(1, tokens, kv_heads, hd).transpose(1, 2)
        try:
            with torch.inference_mode(), attention_context(attention):
                F.scaled_dot_product_attention(q, k, v, enable_gqa=kv_heads != cfg.num_attention_heads)
        except RuntimeError as exc:
            return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return None


def compile_model(model: Sapiens2, mode: str,
                  input_size: tuple[int, int]) -> Callable[[Tensor], tuple[Tensor, Tensor | None]]:
    """The model's forward, compiled with static shapes (``mode="off"``: the model itself).

    Callers pass contiguous inputs of ``input_size``: dynamo guards on strides and sizes, so any
    other layout or size compiles again.
    """
    if mode == "off":
        return model
    # Every Sapiens2 instance shares one code object, and so one recompile budget (8 by default):
    # pose buckets (x2 with flip test) plus the dense tasks need more before dynamo gives up.
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, 64)
    # Fill the RoPE table first: a lookup that misses inside the graph guards on the miss and
    # compiles again once the table is there.
    patch = model.cfg.patch_size
    model.backbone.rope(input_size[0] // patch, input_size[1] // patch, model.device)
    # fullgraph: a graph break is an error at warm-up, not a silent slowdown on every frame.
    if not compile_captures_cuda_graphs(mode):
        return torch.compile(model, mode=mode, dynamic=False, fullgraph=True)
    # Inductor's graphs share one pool per thread and replay in order: not on several streams at once.
    compiled = torch.compile(model, options=no_graph_options(mode), dynamic=False, fullgraph=True)
    return LaneGraphs(compiled, model.device)


__all__ = ["ATTENTION_BACKENDS", "COMPILE_MODES", "FastPath", "attention_context", "compile_model",
           "probe_attention"]
