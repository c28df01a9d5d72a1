"""Names of the fast-path switches (fastpath.FastPath), importable without torch: the command line
checks a run's options against them before anything heavy is imported."""

from __future__ import annotations

ATTENTION_NAMES = ("auto", "flash", "efficient", "cudnn", "math")
COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CUDA_GRAPHS = ("auto", "on", "off")
