"""The one-call device benchmark must not rot between device sessions: run its CPU smoke mode.

This checks that every phase runs and writes its report, and that one failing phase or a short
time budget costs only that phase; the numbers of a smoke run on tiny configs mean nothing and
are not asserted beyond being produced.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bench import device_bench

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(400)
def test_device_bench_smoke_runs_every_phase(tmp_path: Path) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", YOLO_OFFLINE="1", PYTHONUNBUFFERED="1")
    ran = subprocess.run([sys.executable, str(REPO / "bench" / "device_bench.py"), "--smoke", "--seconds", "1.5",
                          "--out", str(tmp_path)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=380)
    assert ran.returncode == 0, ran.stderr[-3000:]
    report = (tmp_path / "device_bench.md").read_text()
    for heading in ("Correctness on the device", "Model forward", "Our path vs the reference", "End to end",
                    "Fast-path switches", "Transfers and encoders", "torch.compile"):
        assert heading in report
    results = json.loads((tmp_path / "device_bench.json").read_text())
    assert results["errors"] == {} and results["skipped"] == []
    assert all(row["finite"] for row in results["correctness"]) and len(results["correctness"]) == 6
    assert {r["batch"] for r in results["forward"]} == {1, 2, 4, 8}
    stages = {(r["stage"], r["path"]) for r in results["reference"]}
    assert ("pose x8", "image -> host result") in stages and ("seg", "image -> host result") in stages
    assert all(r["ref p50"] > 0 for r in results["reference"] if r["path"] == "image -> host result")
    assert len(results["pipeline"]) == 6 and all(r["fps"] > 0 and r["p95_ms"] > 0 for r in results["pipeline"])
    assert {(r["overlap"], r["pinned"]) for r in results["pipeline"]} == {(True, True), (False, True), (True, False)}
    rows = {r["variant"]: r for r in results["fastpath"]}
    assert len(rows) == 9 and rows["3 persons, no buckets (batch 3)"]["batch"] == 3
    # every switch computes what the default computes (fp32 on the CPU: to rounding)
    assert all(r["max_rel_diff"] < 1e-4 for r in rows.values() if r["max_rel_diff"] is not None)
    encoders = [r for r in results["transfers"] if r["what"] == "video encode per frame"]
    assert [r["note"].split(";")[0] for r in encoders] == [
        "encoder used: libx264 (requested one unavailable here)", "encoder used: libx264"]
    jpeg = [r for r in results["transfers"] if r["what"].startswith("JPEG")]
    assert len(jpeg) == 1 and "decodes; mean abs error" in jpeg[0]["note"]  # CPU only here
    assert results["compile"]["startup_s"] > 0 and results["compile"]["max_rel_diff"] < 1e-4


def _ctx(tmp_path: Path, budget_s: float) -> device_bench.Ctx:
    return device_bench.Ctx(torch.device("cpu"), True, 1, 1.0, time.perf_counter() + budget_s,
                            device_bench.Report(tmp_path))


def test_a_failing_phase_is_reported_and_the_next_one_runs(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, 60)

    def broken(c):
        c.say("## half done")
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    device_bench.run_phase(ctx, "broken", broken, 0)
    device_bench.run_phase(ctx, "fine", lambda c: c.say("## fine ran"), 0)
    report = (tmp_path / "device_bench.md").read_text()  # written after each phase, not only at the end
    assert "## half done" in report and "## fine ran" in report
    assert "**phase `broken` failed**: RuntimeError: CUDA error: an illegal memory access" in report
    results = json.loads((tmp_path / "device_bench.json").read_text())
    assert set(results["errors"]) == {"broken"} and "illegal memory access" in results["errors"]["broken"]


def test_a_phase_that_would_overrun_the_budget_is_skipped_and_says_so(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, 10)
    device_bench.run_phase(ctx, "compile", lambda c: pytest.fail("should not run"), 120)
    assert "phase `compile` skipped" in (tmp_path / "device_bench.md").read_text()
    assert json.loads((tmp_path / "device_bench.json").read_text())["skipped"] == ["compile"]


def test_sync_sites_name_the_line_of_our_code_that_synchronised() -> None:
    import warnings

    def our_stage() -> None:  # stands in for a line of stages/ or pipeline/ calling a syncing op
        warnings.warn("called a synchronizing CUDA operation", UserWarning)

    def caller() -> None:
        our_stage()
        our_stage()
        warnings.warn("something else", UserWarning)

    sites = device_bench.sync_sites(caller, ours=(__file__,))
    line = our_stage.__code__.co_firstlineno + 1
    assert sites == {f"tests/test_bench_smoke.py:{line}": 2}
