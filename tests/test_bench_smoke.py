"""The one-call device benchmark must not rot between device sessions: run its CPU smoke mode.

This checks that every phase runs and writes its report; the numbers of a smoke run on tiny
configs mean nothing and are not asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(300)
def test_device_bench_smoke_runs_every_phase(tmp_path: Path) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    ran = subprocess.run([sys.executable, str(REPO / "bench" / "device_bench.py"), "--smoke", "--seconds", "1.5",
                          "--out", str(tmp_path)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=280)
    assert ran.returncode == 0, ran.stderr[-3000:]
    report = (tmp_path / "device_bench.md").read_text()
    for heading in ("Correctness on the device", "Model forward", "Pose path vs the reference", "End to end"):
        assert heading in report
    results = json.loads((tmp_path / "device_bench.json").read_text())
    assert all(row["finite"] for row in results["correctness"])
    assert {r["batch"] for r in results["forward"]} == {1, 2, 4, 8}
    assert len(results["pipeline"]) == 5 and all(r["fps"] > 0 for r in results["pipeline"])
