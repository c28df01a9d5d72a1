"""Fast-path options of a Sapiens2 estimator, the attention kernels, and the batch buckets.

    fp = FastPath(attention="flash", compile="max-autotune")   # cuda_graphs="auto": on for CUDA
    pose = PoseEstimator(model, fastpath=fp)
    seconds = pose.warmup(max_batch=8)       # checks each fast path, captures every batch bucket

``attention``: the scaled-dot-product-attention kernels allowed ("auto": PyTorch chooses; one this
model cannot use here falls back to "auto" with one warning). ``channels_last``: the decode head in
NHWC. ``compile``: ``torch.compile`` with static shapes and ``fullgraph``, compiled in the background
while the stage runs eager (stages.sapiens2.compiled). ``cuda_graphs``: one graph per input shape
(stages.sapiens2.graphs). Every fast path is checked against eager on the user's device and switched
off for the run if it disagrees. Person batches are padded to ``BATCH_BUCKETS`` (``bucket``). The
option names are in stages.sapiens2.fastpath_options (torch-free).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .fastpath_options import ATTENTION_NAMES, COMPILE_MODES, CUDA_GRAPHS
from .model import Sapiens2

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
    """Fast-path switches of one estimator; each is checked against eager before it is used."""

    attention: str = "auto"  # auto | flash | efficient | cudnn | math
    channels_last: bool | None = None  # None: auto (off)
    compile: str = "off"  # one of COMPILE_MODES
    cuda_graphs: str = "auto"  # auto (on for CUDA) | on | off

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_BACKENDS:
            raise ValueError(f"attention: {self.attention!r} is not one of {', '.join(ATTENTION_BACKENDS)}")
        if self.compile not in COMPILE_MODES:
            raise ValueError(f"compile: {self.compile!r} is not one of {', '.join(COMPILE_MODES)}")
        if self.channels_last not in (None, True, False):
            raise ValueError(f"channels_last: expected true, false or auto (null), got {self.channels_last!r}")
        if self.cuda_graphs not in CUDA_GRAPHS:
            raise ValueError(f"cuda_graphs: {self.cuda_graphs!r} is not one of {', '.join(CUDA_GRAPHS)}")

    @property
    def graphs(self) -> bool:
        """Whether forwards are replayed as CUDA graphs (after ``resolve``: only on CUDA)."""
        return self.cuda_graphs == "on"

    def resolve(self, model: Sapiens2, input_size: tuple[int, int] | None = None) -> FastPath:
        """Concrete options for this model on its device (at this input size): auto filled in,
        choices the device cannot run dropped with one warning each."""
        device = model.device
        cuda = device.type == "cuda"
        attention = self.attention
        if not cuda and attention not in ("auto", "math"):
            _warn_once(f"attention={attention!r} needs CUDA; using 'auto' on {device.type}")
            attention = "auto"
        elif attention != "auto":
            problem = probe_attention(attention, model, input_size)
            if problem:
                _warn_once(f"attention={attention!r} cannot run this model here ({problem}); using 'auto'")
                attention = "auto"
        compile_mode = self.compile
        if not cuda and compile_captures_cuda_graphs(compile_mode):
            fallback = {"reduce-overhead": "default", "max-autotune": "max-autotune-no-cudagraphs"}[compile_mode]
            _warn_once(f"compile={compile_mode!r} is tuned for CUDA graphs, which need CUDA; using "
                       f"compile={fallback!r} on {device.type}")
            compile_mode = fallback
        graphs = self.cuda_graphs
        if graphs == "on" and not cuda:
            _warn_once(f"cuda_graphs='on' needs CUDA; off on {device.type}")
        graphs = "on" if cuda and graphs in ("on", "auto") else "off"
        return replace(self, attention=attention, channels_last=bool(self.channels_last), compile=compile_mode,
                       cuda_graphs=graphs)

    @property
    def needs_warm_up(self) -> bool:
        """Whether a warm-up has anything to check, capture or compile (after ``resolve``)."""
        return self.graphs or self.compile != "off" or self.attention != "auto" or bool(self.channels_last)

    def describe(self) -> str:
        """One line for the log, e.g. ``attention=flash channels_last=off compile=off cuda_graphs=on``."""
        onoff = {True: "on", False: "off", None: "auto"}
        return (f"attention={self.attention} channels_last={onoff[self.channels_last]} compile={self.compile} "
                f"cuda_graphs={self.cuda_graphs}")


def compile_captures_cuda_graphs(mode: str) -> bool:
    """True when ``torch.compile(mode=mode)`` would make Inductor record CUDA graphs (its own: ours
    replace them, see stages.sapiens2.graphs)."""
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

    The probe uses the real token count (at ``input_size``) and the real layouts: q and k (B, H, T, hd)
    views of (B, T, H, hd) tensors as RoPE leaves them, v a strided view of the fused projection.
    """
    cfg = model.cfg
    # Attention inputs are in the compute dtype (float16 included: only the residual stays float32).
    dtype, device = model.dtype, model.device
    patch = cfg.patch_size
    tokens = cfg.num_prefix_tokens + (16 if input_size is None else (input_size[0] // patch) * (input_size[1] // patch))
    hd, heads = cfg.head_dim, cfg.num_attention_heads
    for kv_heads in sorted(set(cfg.num_key_value_heads_per_layer)):
        q = torch.randn(1, tokens, heads, hd, device=device, dtype=dtype).transpose(1, 2)
        k = torch.randn(1, tokens, kv_heads, hd, device=device, dtype=dtype).transpose(1, 2)
        projected = torch.randn(1, tokens, (heads + 2 * kv_heads) * hd, device=device, dtype=dtype)
        v = projected[..., (heads + kv_heads) * hd:].view(1, tokens, kv_heads, hd).transpose(1, 2)
        try:
            with torch.inference_mode(), attention_context(attention):
                F.scaled_dot_product_attention(q, k, v, enable_gqa=kv_heads != heads)
        except RuntimeError as exc:
            return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return None


# Person batches are padded to a few fixed sizes so that cuDNN autotuning, compiled graphs and CUDA
# graphs each see a handful of shapes, not one per person count.
BATCH_BUCKETS = (1, 2, 4, 8, 16)


def bucket(n: int, buckets: tuple[int, ...] = BATCH_BUCKETS) -> int:
    """Smallest bucket holding n (multiples of the largest beyond it)."""
    for b in buckets:
        if n <= b:
            return b
    top = buckets[-1]
    return -(-n // top) * top


def bucket_sizes(max_batch: int, buckets: tuple[int, ...] = BATCH_BUCKETS) -> list[int]:
    """Every bucket a batch of 1..max_batch lands in, ascending."""
    return sorted({bucket(n, buckets) for n in range(1, max(1, max_batch) + 1)})


__all__ = ["ATTENTION_BACKENDS", "BATCH_BUCKETS", "COMPILE_MODES", "FastPath", "attention_context", "bucket",
           "bucket_sizes", "compile_captures_cuda_graphs", "probe_attention"]
