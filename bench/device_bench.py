"""One-call GPU benchmark: correctness in bf16/fp16, model speed vs the bf16 peak, our path vs the
reference, end-to-end pipeline FPS and capture-to-publish latency, overlap gain, every fast-path
switch on and off, peak memory.

Runs within ~8 minutes on one H200 (bench/device_run.sh installs the carried wheels first and
calls this). Phases run in order of importance, each isolated: a phase that fails is reported with
its error and the next one runs; the report is rewritten after every phase, so a run cut short
still leaves what it measured; a phase that would overrun the time budget is skipped and says so.
``--smoke`` runs every phase on tiny configs on the CPU, so the script itself is tested where no
GPU is. Results: a markdown report on stdout and in OUT/device_bench.md, all numbers in
OUT/device_bench.json. The phases live in bench/device_model.py (correctness, forward, reference,
fastpath, compile) and bench/device_stream.py (syncs, pipeline, transfers); bench/devicekit.py
holds the report, the run context and the phase runner.

    python bench/device_bench.py --out $OUT            # on the GPU machine
    python bench/device_bench.py --smoke --out /tmp/x  # anywhere, tiny configs on the CPU
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.device_model import (  # noqa: E402
    make_checkpoints,
    phase_compile,
    phase_correctness,
    phase_fastpath,
    phase_forward,
    phase_reference,
)
from bench.device_stream import phase_pipeline, phase_syncs, phase_transfers  # noqa: E402
from bench.devicekit import Ctx, Report, run_phase, sync_sites  # noqa: E402

PHASES: list[tuple[str, Callable[[Ctx], None], float]] = [  # name, function, seconds it needs (H200 estimate)
    ("correctness", phase_correctness, 20),
    ("forward", phase_forward, 20),
    ("syncs", phase_syncs, 10),
    ("reference", phase_reference, 90),
    ("pipeline", phase_pipeline, 75),
    ("fastpath", phase_fastpath, 30),
    ("transfers", phase_transfers, 15),
    ("compile", phase_compile, 120),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".", help="folder for device_bench.md / .json")
    ap.add_argument("--smoke", action="store_true", help="tiny configs on the CPU (tests the script)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=8.0, help="per end-to-end configuration")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="seconds from the start: a phase that would end after this is skipped")
    ap.add_argument("--phases", default=",".join(name for name, _, _ in PHASES))
    args = ap.parse_args()
    started = time.perf_counter()
    unknown = set(args.phases.split(",")) - {name for name, _, _ in PHASES}
    if unknown:
        ap.error(f"unknown phases {sorted(unknown)}; choose from {', '.join(n for n, _, _ in PHASES)}")
    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    report = Report(Path(args.out))
    ctx = Ctx(device, args.smoke, 3 if args.smoke else args.iters, min(args.seconds, 3.0) if args.smoke else args.seconds,
              started + args.budget_s, report)
    name = torch.cuda.get_device_name() if ctx.cuda else "CPU (smoke run: tiny configs, numbers meaningless)"
    report.say(f"# device_bench {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {name}, torch {torch.__version__}")
    report.say("\nAll Sapiens2 weights are random: speeds are real, outputs are not meaningful.\n")
    report.results["device"] = name
    report.results["torch"] = torch.__version__
    with tempfile.TemporaryDirectory() as tmp:
        make_checkpoints(ctx, Path(tmp))
        report.save()
        for phase, fn, needs in PHASES:
            if phase in args.phases.split(","):
                run_phase(ctx, phase, fn, 0 if args.smoke else needs)
    total = time.perf_counter() - started
    report.say(f"\ntotal {total:.0f} s; failed phases: {', '.join(report.results['errors']) or 'none'}; "
               f"skipped: {', '.join(report.results['skipped']) or 'none'}")
    report.save()
    return 1 if report.results["errors"] else 0


__all__ = ["PHASES", "Ctx", "Report", "main", "run_phase", "sync_sites"]


if __name__ == "__main__":
    sys.exit(main())
