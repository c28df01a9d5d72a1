"""bench/harness.py, the one timing implementation of the benchmarks (the device benchmark's phases
time through it too): percentiles as numpy computes them, warm-up excluded, calls interleaved."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.devicekit import Ctx, Report
from bench.harness import Stats, measure, measure_interleaved, percentile

VALUES = [7.0, 1.0, 4.0, 9.5, 2.0, 3.0, 8.0]  # not sorted: the callers pass raw latencies


@pytest.mark.parametrize("q", [0, 5, 50, 90, 95, 100])
def test_percentile_is_numpys_linear_percentile_of_values_in_any_order(q: float) -> None:
    assert percentile(VALUES, q) == pytest.approx(float(np.percentile(VALUES, q)), rel=1e-12)


@pytest.mark.parametrize("values, q, expected", [([3.0], 95, 3.0), ([2.0, 1.0], 50, 1.5), ([1.0, 2.0], 95, 1.95)])
def test_percentile_of_one_and_two_values(values: list[float], q: float, expected: float) -> None:
    assert percentile(values, q) == pytest.approx(expected)


@pytest.mark.parametrize("make", [lambda: percentile([], 50), lambda: Stats.from_samples([])])
def test_no_values_is_an_error(make) -> None:
    with pytest.raises(ValueError, match="no"):
        make()


def test_stats_take_their_percentiles_from_percentile() -> None:
    stats = Stats.from_samples(VALUES, items=2)
    assert (stats.p50, stats.p95) == (percentile(VALUES, 50), percentile(VALUES, 95))
    assert stats.samples_ms == sorted(VALUES) and stats.n == len(VALUES)
    assert stats.throughput == pytest.approx(2 * 1000.0 / np.mean(VALUES))


def test_measure_excludes_the_warm_up_and_times_each_call() -> None:
    calls = []

    def fn() -> None:
        calls.append(None)
        if len(calls) > 2:  # the timed calls sleep, the two warm-up calls do not
            time.sleep(0.002)

    stats = measure(fn, iters=4, warmup=2)
    assert len(calls) == 6 and stats.n == 4 and len(stats.samples_ms) == 4
    assert min(stats.samples_ms) >= 2.0


@pytest.mark.parametrize("iters", [0, -1])
def test_measure_needs_one_timed_call(iters: int) -> None:
    with pytest.raises(ValueError, match="iters must be >= 1"):
        measure(lambda: None, iters=iters)
    with pytest.raises(ValueError, match="iters must be >= 1"):
        measure_interleaved({"a": lambda: None}, iters=iters)


def test_measure_interleaved_calls_the_paths_in_turn() -> None:
    order: list[str] = []
    stats = measure_interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, iters=3, warmup=1)
    assert order == ["a", "b"] * 4
    assert set(stats) == {"a", "b"} and all(s.n == 3 for s in stats.values())


def test_the_device_context_measures_with_the_harness(tmp_path: Path) -> None:
    ctx = Ctx(torch.device("cpu"), smoke=True, iters=5, seconds=1.0, deadline=time.monotonic() + 60,
              report=Report(tmp_path))
    calls = []
    stats = ctx.measure(lambda: calls.append(None), warmup=1)
    assert isinstance(stats, Stats) and stats.n == 5 and len(calls) == 6
    assert ctx.measure(lambda: None, iters=2).n == 2
