"""One-call GPU benchmark: correctness in bf16/fp16 (and where its peak memory comes from), model speed
vs the bf16 peak, the paths a run takes (eager, CUDA graphs, compiled), the real command end to end,
our path vs the reference and why, pipeline FPS and capture-to-publish latency, overlap, every
fast-path switch, peak memory, and the versions of every package it ran with.

The device call (15 minutes of device time per session; this leaves room for one rerun):

    run(command="bash bench/device_run.sh", carry=[".whl"], timeout_s=570)

bench/device_run.sh installs the carried wheels and calls this under one 540 s limit (the install
counted in it), with ``--budget-s 510`` (less when the install was slow): the DEFAULT phases. The
others (RERUNS), or what failed, in a second call: ``LIMIT_S=230 BUDGET_S=200 bash bench/device_run.sh
--phases e2e_more``.
Phases run in the order of PHASES below, each in a worker process under its own deadline
(bench/devicewatch.py): a phase that fails is reported with its traceback and the next one runs; a
phase that hangs or overruns its limit is ended by the watchdog, every thread's traceback goes to
the log, and the next phase runs in a fresh worker; a phase whose estimate no longer fits the
budget is skipped and says so.
The report is rewritten after every event, so a run cut short keeps what it measured. Runs on
the device image's torch (2.11 on 2026-12-04) and on ours (2.14).

``--smoke`` runs every phase on tiny models on the CPU (the syncs phase runs its engine path and
says that its measurement needs CUDA), so the script is tested where no GPU is. Results: a
markdown report on stdout and in OUT/device_bench.md, every number in OUT/device_bench.json. The
phases live in bench/device_model.py (checkpoints, correctness, forward, reference),
bench/device_compile.py (graphs, compile, fastpath), bench/device_cli.py (e2e, e2e_more: the real command; starts),
bench/device_stream.py (syncs, pipeline, transfers) and bench/device_sources.py (many sources in
one process); bench/devicekit.py holds the report and the run context, bench/devicewatch.py the
worker processes and the watchdog.

    python -m bench.device_bench --out $OUT            # on the GPU machine (device_run.sh does this)
    python -m bench.device_bench --smoke --out /tmp/x  # anywhere, tiny configs on the CPU
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

from bench.device_cli import MORE_ROWS, TARGET_ROWS, phase_e2e, phase_e2e_more, phase_starts
from bench.device_compile import phase_compile, phase_fastpath, phase_graphs
from bench.device_model import (
    TASKS,
    phase_checkpoints,
    phase_correctness,
    phase_forward,
    phase_reference,
)
from bench.device_sources import phase_sources
from bench.device_stream import phase_pipeline, phase_syncs, phase_transfers
from bench.devicekit import FAILED, REPO, Ctx, Outcome, Report, record_outcome, run_phase, sync_sites
from bench.devicewatch import Interrupted, Phase, Supervisor

BUDGET_S = 510.0  # what device_run.sh passes; its outer timeout is 540 s, the device call's 570 s
RERUN_BUDGET_S = 200.0  # a rerun of RERUNS: LIMIT_S=230 BUDGET_S=200 bash bench/device_run.sh --phases ...


# -- test-only phases (the watchdog's own test; run only when named in --phases) -----------------
def _sleep_past_the_deadline(seconds: float) -> None:
    time.sleep(seconds)


def phase_test_hang(ctx: Ctx) -> None:
    """Sleeps far past its 2 s limit in the main thread and in a helper thread."""
    ctx.say("\n## watchdog test: a phase that sleeps past its limit\n")
    threading.Thread(target=_sleep_past_the_deadline, args=(600,), name="test-hang-helper", daemon=True).start()
    _sleep_past_the_deadline(600)


def phase_test_wedge(ctx: Ctx) -> None:
    """Disarms its own watchdog timer and sleeps: only the parent's backstop (SIGABRT) can end it."""
    import faulthandler

    ctx.say("\n## watchdog test: a phase whose watchdog timer cannot fire\n")
    faulthandler.cancel_dump_traceback_later()
    _sleep_past_the_deadline(600)


# name, function, H200 estimate (s; skipped when less budget is left), watchdog limit (s), about.
# Estimates: the 2026-12-04 run on an H200 where a phase ran there (checkpoints 8-12 s, correctness 6 s
# before its capped decode, forward 13 s, pipeline 40 s, reference 59 s, sources 17 s, compile 45 s,
# fastpath 23 s, transfers 2 s), otherwise its parts: graphs compiles 4 shapes (35-39 s each measured
# for one shape), e2e sums its rows' estimates (bench/device_cli.py).
# Order: what a user runs and the targets first (correctness, the model's speed, the paths a
# run takes, the real command, the pipeline, the reference, many sources), then the figures behind
# them. DEFAULT (a call without --phases) is the first eight, within 0.85 of the 510 s budget (the
# first worker's start, ~5 s, and the phases' overruns on top); the others fit the reruns of RERUNS,
# each with the checkpoints rebuilt first, within 0.85 of RERUN_BUDGET_S.
PHASES: list[Phase] = [
    Phase("checkpoints", phase_checkpoints, 15, 90, "3 random 0.4B checkpoints (init on the GPU, 1.7 GB write each)",
          needs_ckpts=False),
    Phase("correctness", phase_correctness, 20, 90, "bf16/fp16 vs fp32 decoded outputs, 3 tasks; the peak memory of "
          "each decode and the fp32 one capped at 24 GiB"),
    Phase("forward", phase_forward, 15, 45, "8192^3 GEMM + pose forward at batch 1/2/4/8"),
    Phase("graphs", phase_graphs, 165, 240, "eager vs eager + CUDA graphs vs compiled + CUDA graphs: pose x1/x4/x8 "
          "and seg; the attention kernels of each; 4 background compiles"),
    Phase("e2e", phase_e2e, sum(r.estimate_s for r in TARGET_ROWS), 150, f"the real command on the demo clip: "
          f"{len(TARGET_ROWS)} runs that answer a target (pose + seg with YOLO, 4 sources of pose with YOLO, paced "
          "live)"),
    Phase("pipeline", phase_pipeline, 45, 90, "6 end-to-end rows of 5 s + warm-up"),
    Phase("reference", phase_reference, 60, 120, "2 transformers models built on the GPU + timed groups; kernel time "
          "by kind at pose x8, ours vs the reference"),
    Phase("sources", phase_sources, 20, 60, "1/2/4/8 1080p sources batched through one engine, pose 0.4B"),
    Phase("e2e_more", phase_e2e_more, sum(r.estimate_s for r in MORE_ROWS), 210, f"the real command on the demo "
          f"clip: {len(MORE_ROWS)} more runs (--compile default until it switched; full frame: pose + seg at 1 and 4 "
          "sources, pose, seg)"),
    Phase("starts", phase_starts, 60, 150, "first and second start of a compiled run (pose x1, a process each)"),
    Phase("syncs", phase_syncs, 10, 40, "host syncs in 3 engine submits"),
    Phase("compile", phase_compile, 45, 100, "pose x4 compiled in the background on its lane, then 2 x 30 steps: "
          "the lanes' spans, overlapped vs one stream"),
    Phase("fastpath", phase_fastpath, 25, 45, "the attention kernels, channels_last and buckets against the "
          "default, pose x4"),
    Phase("transfers", phase_transfers, 10, 30, "3D keypoint step, copies, JPEG, libx264 (NVENC probed)",
          needs_ckpts=False),
]
DEFAULT = [p.name for p in PHASES[:8]]  # one call without --phases: the targets and what a user runs
# The rest, in reruns while the machine is warm (each: bash bench/device_run.sh --phases NAME,...): one
# rerun fits in a session after the default call; the other waits for another session.
RERUNS = [["e2e_more"], ["starts", "syncs", "compile", "fastpath", "transfers"]]
TEST_PHASES: list[Phase] = [
    Phase("_hang", phase_test_hang, 0, 2, needs_ckpts=False, hidden=True),
    Phase("_wedge", phase_test_wedge, 0, 2, needs_ckpts=False, hidden=True),
]


def all_phases() -> list[Phase]:
    return PHASES + TEST_PHASES


# -- versions ------------------------------------------------------------------------------------
# (import name, distribution) of every package the phases use; the carried wheels among them.
PACKAGES = (("torch", "torch"), ("torchvision", "torchvision"), ("triton", "triton"),
            ("transformers", "transformers"), ("tokenizers", "tokenizers"), ("huggingface_hub", "huggingface-hub"),
            ("safetensors", "safetensors"), ("av", "av"), ("zmq", "pyzmq"), ("ultralytics", "ultralytics"),
            ("lap", "lap"), ("cv2", None), ("numpy", "numpy"), ("msgpack", "msgpack"), ("scipy", "scipy"),
            ("PIL", "pillow"), ("yaml", "PyYAML"), ("psutil", "psutil"))


def package_versions() -> list[dict[str, Any]]:
    """Version and location of each package, read from its installed metadata without importing it
    (the same resolution order as an import: the carried /tmp/site comes first on PYTHONPATH)."""
    carried = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != REPO]
    rows = []
    for module, dist in PACKAGES:
        spec = importlib.util.find_spec(module)
        row: dict[str, Any] = dict(package=module, version=None, location=None, carried=False)
        if spec is None or not spec.origin:
            row["version"] = "MISSING"
            rows.append(row)
            continue
        where = Path(spec.origin).resolve().parent.parent
        row["location"] = str(where)
        row["carried"] = any(str(where).startswith(str(Path(c).resolve())) for c in carried)
        names = [dist] if dist else importlib.metadata.packages_distributions().get(module, [])
        for name in names:
            try:
                found = next((d for d in importlib.metadata.distributions(name=name, path=[str(where)])), None)
                row["version"] = (found.version if found else None) or importlib.metadata.version(name)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
        rows.append(row)
    return rows


def nvidia_smi() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_mode",
                               "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=15)
        return done.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def report_versions(report: Report) -> None:
    versions = package_versions()
    report.results["versions"] = {r["package"]: r["version"] for r in versions}
    report.results["versions_detail"] = versions
    report.results["carried_wheels"] = sorted(p.name for p in (REPO / ".whl").glob("*.whl"))
    report.results["nvidia_smi"] = smi = nvidia_smi()
    report.say("\n## Versions\n")
    report.table(["package", "version", "from"],
                 [[r["package"], r["version"], "carried (.whl)" if r["carried"] else (r["location"] or "-")]
                  for r in versions])
    if smi:
        report.say(f"\nnvidia-smi: {smi}")
    if report.results["carried_wheels"]:
        report.say(f"\ncarried wheels: {', '.join(report.results['carried_wheels'])}")


# -- main ----------------------------------------------------------------------------------------
def select(names: str) -> tuple[list[Phase], list[str]]:
    """The phases named, in PHASES order (test phases first, so the phases after them show that a
    run goes on), with checkpoints added when a named phase needs them. Returns (phases, unknown)."""
    wanted = [n for n in names.split(",") if n]
    known = {p.name: p for p in all_phases()}
    unknown = [n for n in wanted if n not in known]
    chosen = [p for p in all_phases() if p.name in wanted]
    if any(p.needs_ckpts for p in chosen) and "checkpoints" not in wanted:
        chosen.insert(0, known["checkpoints"])
    order = {p.name: i for i, p in enumerate(all_phases())}
    tests = [p for p in chosen if p.hidden]
    return tests + sorted([p for p in chosen if not p.hidden], key=lambda p: order[p.name]), unknown


def work_dir() -> Path:
    """Where the checkpoints go (about 5 GB at 0.4B): /dev/shm when it has room, else the temp dir."""
    shm = Path("/dev/shm")
    try:
        if shm.is_dir() and os.access(shm, os.W_OK):
            stat = os.statvfs(shm)
            if stat.f_bavail * stat.f_frsize > 12 * 2**30:
                return Path(tempfile.mkdtemp(prefix="device_bench.", dir=shm))
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix="device_bench."))


def _interrupt(signum, frame) -> None:
    raise Interrupted(signal.Signals(signum).name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".", help="folder for device_bench.md / .json")
    ap.add_argument("--smoke", action="store_true", help="tiny configs on the CPU (tests the script)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=5.0, help="per end-to-end configuration")
    ap.add_argument("--budget-s", type=float, default=BUDGET_S,
                    help="seconds from the start: a phase whose estimate no longer fits is skipped, and every "
                         "phase is ended at this point at the latest")
    ap.add_argument("--phases", default=",".join(DEFAULT),
                    help=f"comma-separated, from {', '.join(p.name for p in PHASES)} (default: {','.join(DEFAULT)}; "
                         "all: every phase)")
    args = ap.parse_args()
    started = time.monotonic()
    phases, unknown = select(",".join(p.name for p in PHASES) if args.phases == "all" else args.phases)
    if unknown:
        ap.error(f"unknown phases {unknown}; choose from {', '.join(p.name for p in PHASES)}")
    cuda = not args.smoke and torch.cuda.is_available()
    report = Report(Path(args.out))
    signal.signal(signal.SIGTERM, _interrupt)
    report.say(f"# device_bench {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
               + (" (smoke run: tiny configs on the CPU, numbers meaningless)" if args.smoke else ""))
    report.say("\nAll Sapiens2 weights are random: speeds are real, outputs are not meaningful. Matting rows are "
               "the matting head on the 0.4B backbone (matting is published at 1B only).")
    report.results.update(budget_s=args.budget_s, smoke=args.smoke, started_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                             time.gmtime()))
    report_versions(report)
    report.say(f"\n## Plan: time budget {args.budget_s:.0f} s\n")
    report.table(["phase", "H200 estimate s", "watchdog limit s", "what"],
                 [[p.name, p.estimate_s, p.limit(args.smoke), p.about] for p in phases])
    report.results["plan"] = [dict(phase=p.name, estimate_s=p.estimate_s, limit_s=p.limit(args.smoke), about=p.about)
                              for p in phases]
    report.save()
    state = work_dir()
    # Ultralytics writes its settings where YOLO_CONFIG_DIR says, else into ~/.config; our compiled kernels go to
    # SAPIENS2_STREAM_CACHE, else ~/.cache. device_run.sh sets both; a run started otherwise uses folders of its
    # own (the workers are spawned with this environment, the commands of the e2e phases get their own).
    os.environ.setdefault("YOLO_CONFIG_DIR", str(state / "yolo"))
    os.environ.setdefault("SAPIENS2_STREAM_CACHE", str(state / "cache"))
    config = dict(device="cuda" if cuda else "cpu", smoke=args.smoke, iters=3 if args.smoke else args.iters,
                  seconds=min(args.seconds, 3.0) if args.smoke else args.seconds,
                  ckpts={task: str(state / "ckpt" / task) for task in TASKS}, state_dir=str(state / "watch"),
                  phases_module="bench.device_bench")

    def on_ready(info: dict[str, Any]) -> None:
        report.results["device"] = info.get("device")
        report.results["worker"] = info
        report.say(f"\ndevice: {info.get('device')}; torch {info.get('torch')} (built for CUDA {info.get('cuda')}), "
                   f"cuDNN {info.get('cudnn', '-')}, Python {info.get('python')}, {info.get('cpus')} CPUs"
                   + (f", compute capability {info['capability']}, {info['memory_gib']} GiB" if "capability" in info
                      else ""))
        report.save()

    supervisor = Supervisor(report, config, args.smoke, on_ready=on_ready)
    interrupted = None
    try:
        supervisor.run(phases, started + args.budget_s)
    except (Interrupted, KeyboardInterrupt) as exc:
        interrupted = str(exc) or type(exc).__name__
    finally:
        supervisor.close()
        shutil.rmtree(state, ignore_errors=True)
    summarise(report, time.monotonic() - started, supervisor.workers_started, interrupted)
    return 1 if report.results["errors"] or interrupted else 0


def summarise(report: Report, total: float, workers: int, interrupted: str | None) -> None:
    res = report.results
    report.say("\n## Phases\n")
    report.table(["phase", "status", "seconds", "H200 estimate", "limit", "peak GPU GiB", "note"],
                 [[n, e["status"], e["seconds"], e.get("estimate_s"), e.get("limit_s"), e.get("peak_gib"),
                   e.get("error") or e.get("note") or ""] for n, e in res["phases"].items()])
    res["total_s"] = round(total, 1)
    res["workers_started"] = workers
    failed = [n for n, e in res["phases"].items() if e["status"] in FAILED]
    report.say(f"\ntotal {total:.0f} s ({workers} worker process(es)); failed phases: {', '.join(failed) or 'none'}; "
               f"skipped: {', '.join(res['skipped']) or 'none'}"
               + (f"; the run was stopped ({interrupted})" if interrupted else ""))
    report.save()


__all__ = ["DEFAULT", "PHASES", "RERUNS", "Ctx", "Outcome", "Report", "all_phases", "main", "record_outcome",
           "run_phase", "select", "sync_sites"]


if __name__ == "__main__":
    sys.exit(main())
