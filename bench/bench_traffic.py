"""What one forward asks of a GPU, ours against the reference (transformers), by part of the model:
kernels (aten ops that are not views), bytes read and written by them, and multiply-adds.

Counted on the meta device (no memory, no math, no GPU needed), both models as they run: the published
architecture in bfloat16, transformers' SDPA attention. Bytes are each kernel's tensor inputs and
outputs, the traffic of a kernel that keeps nothing in cache between launches (an upper bound of what
reaches the GPU's memory; a fused kernel that keeps an intermediate on chip moves less). It answers
"why is the reference faster at batch 4-8" as far as it can be answered without a GPU: when the two
make the same GEMMs and attention, the difference left is in the kernels around them. Which attention
kernel SDPA picks is decided on the device (the device benchmark's graphs and reference phases).

    .venv/bin/python -m bench.bench_traffic [--size 0.4b] [--task pose] [--batch 1 4 8] [--json out.json]
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from bench.bench_stages import CONFIGS, NUM_LABELS, REF_CLASS
from bench.harness import dump_json, machine_info, table
from stages.sapiens2.configjson import config_from_json
from stages.sapiens2.model import Sapiens2

PARTS = ("norms", "attention: q/k/v and output GEMMs", "attention: RoPE and the rest", "attention: SDPA",
         "MLP", "residual and layer scale", "patch embedding", "decode head", "other")
GEMMS = ("aten.mm", "aten.addmm", "aten.bmm", "aten.linear", "aten.matmul", "aten.baddbmm")
CONVS = ("aten.conv2d", "aten.conv_transpose2d", "aten.convolution")


def part_of(module_path: list[str], op: str) -> str:
    """The part of the model an op belongs to, from the classes of the modules it runs inside
    (outermost first) and its own name; the two sides name their classes differently."""
    names = [name.lower() for name in module_path]
    inner = names[-1] if names else ""
    if "norm" in inner:
        return "norms"
    if any("head" in n for n in names):
        return "decode head"
    if any("attention" in n for n in names):
        if "scaled_dot_product" in op or "flash" in op or "efficient" in op:
            return "attention: SDPA"
        return "attention: q/k/v and output GEMMs" if op in GEMMS else "attention: RoPE and the rest"
    if any(k in n for n in names for k in ("mlp", "swiglu", "ffn")):
        return "MLP"
    if "layerscale" in inner or inner in ("block", "sapiens2layer"):
        return "residual and layer scale"
    if "embed" in inner or op in CONVS:
        return "patch embedding"
    return "other"


def _bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _macs(op: str, args: tuple, out: Any) -> int:
    """Multiply-adds of the GEMM-like ops (0 for the others)."""
    tensors = [a for a in tree_leaves(args) if isinstance(a, torch.Tensor)]
    if op == "aten.linear":
        x, w = tensors[0], tensors[1]
        return x.numel() * w.shape[0]
    if op in ("aten.mm", "aten.bmm", "aten.matmul"):
        return tensors[0].numel() * tensors[1].shape[-1]
    if op in ("aten.addmm", "aten.baddbmm"):
        return tensors[1].numel() * tensors[2].shape[-1]
    if op in CONVS:
        x, w = tensors[0], tensors[1]
        transposed = op == "aten.conv_transpose2d" or (op == "aten.convolution" and bool(args[6]))
        if transposed:  # weight (C_in, C_out / groups, kh, kw): every input value meets C_out/groups * kh*kw
            return x.numel() * w[0].numel()
        return out.numel() * w[0].numel()  # weight (C_out, C_in / groups, kh, kw)
    if "scaled_dot_product" in op:
        q, k = tensors[0], tensors[1]  # (B, H, Lq, D), (B, Hk, Lk, D)
        return 2 * q.numel() * k.shape[-2]  # q @ k^T and attn @ v
    return 0


class Traffic(TorchDispatchMode):
    """Per part of the model: kernels, bytes, multiply-adds; and per op inside each part."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.path: list[str] = []
        self.parts: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # kernels, bytes, macs
        self.ops: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self._hooks = []
        for module in model.modules():
            self._hooks.append(module.register_forward_pre_hook(self._enter))
            self._hooks.append(module.register_forward_hook(self._leave))

    def _enter(self, module: torch.nn.Module, _args: Any) -> None:
        self.path.append(type(module).__name__)

    def _leave(self, module: torch.nn.Module, _args: Any, _out: Any) -> None:
        self.path.pop()

    def remove(self) -> None:
        for hook in self._hooks:
            hook.remove()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        op = str(func.overloadpacket)
        returns_input = isinstance(out, torch.Tensor) and any(out is a for a in args)
        if returns_input or (func.is_view and op != "aten.to"):
            return out
        moved = _bytes([t for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)])
        part = part_of(self.path, op)
        totals = self.parts[part]
        totals[0] += 1
        totals[1] += moved
        totals[2] += _macs(op, args, out)
        self.ops[part][op.removeprefix("aten.")] += 1
        return out


def reference_model(task: str, size: str) -> torch.nn.Module:
    import transformers

    spec = CONFIGS[size]
    cfg = transformers.Sapiens2Config(**spec["arch"], num_labels=NUM_LABELS[task], head_config=spec["heads"][task])
    cfg._attn_implementation = "sdpa"
    return getattr(transformers, REF_CLASS[task])(cfg)


def our_model(reference: torch.nn.Module) -> torch.nn.Module:
    """Ours as the pipeline builds it from the reference's config.json (on the meta device there are no
    weights to load: the modules are the ones a load fills)."""
    data = {**reference.config.to_dict(), "architectures": [type(reference).__name__]}
    return Sapiens2(config_from_json(data))


def count(model: torch.nn.Module, batch: int, hw: tuple[int, int], dtype: torch.dtype) -> Traffic:
    model = model.eval()
    if hasattr(model, "set_precision"):
        model.set_precision(dtype)
    else:
        model.to(dtype)
    pixels = torch.empty(batch, 3, *hw, device="meta", dtype=dtype)
    with torch.inference_mode():
        model(pixels)  # tables made once per input size (RoPE) are not the steady state
        traffic = Traffic(model)
        try:
            with traffic:
                model(pixels)
        finally:
            traffic.remove()
    return traffic


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="0.4b", choices=sorted(CONFIGS))
    parser.add_argument("--task", default="pose", choices=["pose", "seg"])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    hw = tuple(CONFIGS[args.size]["arch"]["image_size"])
    print(f"# Kernels, traffic and multiply-adds per forward: {args.task} {args.size} at {hw[0]}x{hw[1]}, "
          f"bfloat16, meta device ({machine_info()['torch']})")
    results: dict[str, Any] = {"task": args.task, "size": args.size, "input": list(hw), "rows": []}
    with torch.device("meta"):
        reference = reference_model(args.task, args.size)
        models = {"ours": our_model(reference), "reference": reference}
    for batch in args.batch:
        counted = {side: count(model, batch, hw, torch.bfloat16) for side, model in models.items()}
        rows = []
        for part in [*PARTS, "all"]:
            got = {side: ([sum(v[i] for v in c.parts.values()) for i in range(3)] if part == "all"
                          else c.parts.get(part, [0, 0, 0])) for side, c in counted.items()}
            if not any(got["ours"]) and not any(got["reference"]):
                continue
            (ok, ob, om), (rk, rb, rm) = got["ours"], got["reference"]
            rows.append({"part": part, "kernels": ok, "ref kernels": rk, "GB": ob / 1e9, "ref GB": rb / 1e9,
                         "G MACs": om / 1e9, "ref G MACs": rm / 1e9})
            results["rows"].append({"batch": batch, "part": part, **got})
        print(f"\n## batch {batch}\n")
        print(table(rows))
        for side in ("ours", "reference"):
            rest = counted[side].ops.get("attention: RoPE and the rest", {})
            norms = counted[side].ops.get("norms", {})
            print(f"\n{side}: attention besides its GEMMs and SDPA: "
                  f"{', '.join(f'{k} {v}' for k, v in sorted(rest.items(), key=lambda kv: -kv[1])) or 'nothing'}; "
                  f"norms: {', '.join(f'{k} {v}' for k, v in sorted(norms.items(), key=lambda kv: -kv[1]))}")
    if args.json:
        dump_json(args.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
