"""One-Euro filtering: jitter is reduced at rest, steps are followed, state is per track id."""

from __future__ import annotations

import numpy as np
import pytest

from stages.smoothing import KeypointSmoother, OneEuroFilter

FPS = 30.0


def _run(filt: OneEuroFilter, samples: np.ndarray) -> np.ndarray:
    return np.stack([filt(x, i / FPS) for i, x in enumerate(samples)])


def test_reduces_jitter_on_constant_signal() -> None:
    rng = np.random.default_rng(0)
    truth = np.full((17, 2), 100.0)
    noisy = truth + rng.normal(0, 3.0, (300, 17, 2))  # (T, K, 2)
    out = _run(OneEuroFilter(min_cutoff=1.0, beta=0.0), noisy)
    raw_err = np.abs(noisy[30:] - truth).mean()
    out_err = np.abs(out[30:] - truth).mean()
    assert out_err < 0.5 * raw_err
    assert out.dtype == np.float32 and out.shape == noisy.shape


def test_follows_a_step() -> None:
    samples = np.concatenate([np.zeros((30, 1, 2)), np.full((30, 1, 2), 200.0)])
    slow = _run(OneEuroFilter(min_cutoff=1.0, beta=0.0), samples)
    fast = _run(OneEuroFilter(min_cutoff=1.0, beta=0.05), samples)
    assert abs(fast[-1, 0, 0] - 200.0) < 2.0  # converged within one second
    # speed raises the cutoff: the adaptive filter lags less right after the step
    assert abs(fast[33, 0, 0] - 200.0) < abs(slow[33, 0, 0] - 200.0)


def test_first_sample_passes_through_and_repeated_time_holds() -> None:
    filt = OneEuroFilter()
    x = np.array([[1.0, 2.0]])
    np.testing.assert_array_equal(filt(x, 0.0), x)
    held = filt(x + 10, 0.0)  # same timestamp: no update
    np.testing.assert_array_equal(held, x)


def test_non_finite_input_does_not_poison_state() -> None:
    filt = OneEuroFilter()
    filt(np.array([1.0, 5.0]), 0.0)
    held = filt(np.array([3.0, 7.0]), 1 / FPS)  # both coordinates move towards the new values
    out = filt(np.array([np.nan, 9.0]), 2 / FPS)
    assert out[0] == pytest.approx(held[0]), "a lost coordinate holds its last filtered value"
    assert held[1] < out[1] < 9.0  # the finite one is filtered as usual
    after = filt(np.array([3.0, 9.0]), 3 / FPS)
    assert np.isfinite(after).all() and held[0] <= after[0] < 3.0  # and the held one goes on from where it was


@pytest.mark.parametrize(
    "kwargs", [{"min_cutoff": 0.0}, {"d_cutoff": -1.0}, {"beta": -0.1}]
)
def test_invalid_parameters(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="OneEuroFilter"):
        OneEuroFilter(**kwargs)


def test_smoother_keeps_state_per_track_id() -> None:
    smoother = KeypointSmoother(min_cutoff=0.5, beta=0.0, max_age_s=0.5)
    a = np.zeros((1, 3, 2), np.float32)
    b = np.full((1, 3, 2), 500.0, np.float32)
    smoother(np.concatenate([a, b]), np.array([1, 2]), 0.0)
    # ids swap places in the array: each must be smoothed against its own history
    out = smoother(np.concatenate([b + 10, a + 10]), np.array([2, 1]), 1 / FPS)
    assert 500.0 < out[0, 0, 0] < 510.0
    assert 0.0 < out[1, 0, 0] < 10.0
    assert smoother.track_ids == [1, 2]


def test_untracked_persons_pass_through_and_stale_ids_expire() -> None:
    smoother = KeypointSmoother(max_age_s=0.5)
    xy = np.full((1, 2, 2), 5.0, np.float32)
    smoother(xy, np.array([3]), 0.0)
    raw = np.full((1, 2, 2), 50.0, np.float32)
    np.testing.assert_array_equal(smoother(raw, np.array([-1]), 0.1), raw)
    assert smoother.track_ids == [3]
    smoother(raw, np.array([-1]), 1.0)  # id 3 unseen for 1 s > max_age_s
    assert smoother.track_ids == []
    # a returning id starts afresh: its first sample passes through unchanged
    np.testing.assert_array_equal(smoother(raw, np.array([3]), 1.1), raw)


def test_smoother_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="KeypointSmoother"):
        KeypointSmoother()(np.zeros((2, 3, 2)), np.array([1]), 0.0)
