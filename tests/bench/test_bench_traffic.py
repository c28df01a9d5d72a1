"""bench.bench_traffic: kernels, bytes and multiply-adds per forward, ours against the reference, by part."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("task", ["pose", "seg"])
def test_ours_does_the_references_math_with_fewer_kernels_and_less_traffic(tmp_path: Path, task: str) -> None:
    out = tmp_path / "traffic.json"
    ran = subprocess.run([sys.executable, "-m", "bench.bench_traffic", "--size", "tiny", "--task", task,
                          "--batch", "1", "2", "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                         timeout=600, check=False)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "## batch 2" in ran.stdout and "attention: SDPA" in ran.stdout
    rows = json.loads(out.read_text())["rows"]
    for batch in (1, 2):
        part = {r["part"]: r for r in rows if r["batch"] == batch}
        ours, ref = part["all"]["ours"], part["all"]["reference"]
        assert ours[2] == ref[2] > 0  # the same multiply-adds: the same model, counted the same way
        assert ours[0] < ref[0] and ours[1] < ref[1]  # fewer kernels, fewer bytes
        assert part["norms"]["ours"][0] < part["norms"]["reference"][0] / 3  # one fused kernel per norm
        assert part["attention: SDPA"]["ours"] == part["attention: SDPA"]["reference"]
    two = {r["part"]: r for r in rows if r["batch"] == 2}["all"]["ours"]
    one = {r["part"]: r for r in rows if r["batch"] == 1}["all"]["ours"]
    assert two[0] == one[0] and two[2] == 2 * one[2]  # kernels per forward do not grow with the batch
