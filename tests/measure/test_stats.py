"""Stats against NumPy on known samples, with trtexec's percentile and median conventions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from streamrt.measure.stats import PERCENTILES, Stats, median, percentile


def test_known_samples_1_to_100() -> None:
    rng = np.random.default_rng(0)
    samples = rng.permutation(np.arange(1.0, 101.0))  # order must not matter
    s = Stats.from_samples(samples)
    assert (s.count, s.min, s.max) == (100, 1.0, 100.0)
    assert s.mean == pytest.approx(50.5)
    assert s.median == 50.5  # mean of the two middle samples
    # trtexec excludes the top (1 - p) fraction: 10, 5 and 1 samples.
    assert (s.p90, s.p95, s.p99) == (90.0, 95.0, 99.0)


def test_p99_excludes_exactly_one_of_100_samples() -> None:
    # trtexec's single-precision arithmetic would exclude none here; the exact count is 1.
    assert percentile(list(range(100)), 99.0) == 98


@pytest.mark.parametrize("n", [1, 2, 3, 7, 10, 19, 20, 99, 101, 1000, 1234])
def test_percentiles_equal_numpy_inverted_cdf(n: int) -> None:
    """trtexec's rule sorted[n - 1 - floor((1 - p) n)] is NumPy's 'inverted_cdf' method."""
    samples = np.random.default_rng(n).exponential(2.0, size=n)
    s = Stats.from_samples(samples)
    for p, got in zip(PERCENTILES, (s.p90, s.p95, s.p99), strict=True):
        assert got == np.percentile(samples, p, method="inverted_cdf")
        assert got in samples  # always an observed sample, never interpolated
    assert s.median == pytest.approx(float(np.median(samples)), rel=1e-15)
    assert s.mean == pytest.approx(float(np.mean(samples)))
    assert s.std == pytest.approx(float(np.std(samples)))  # population std, as trtexec
    assert s.cov == pytest.approx(float(np.std(samples) / np.mean(samples) * 100))
    assert (s.min, s.max) == (samples.min(), samples.max())


def test_median_odd_and_even() -> None:
    assert median([1.0, 2.0, 9.0]) == 2.0
    assert median([1.0, 2.0, 4.0, 9.0]) == 3.0
    assert math.isinf(median([]))


def test_percentile_edges() -> None:
    assert percentile([5.0], 99) == 5.0
    assert percentile([1.0, 2.0, 3.0], 0) == 1.0
    assert percentile([1.0, 2.0, 3.0], 100) == 3.0
    assert math.isinf(percentile([], 90))
    with pytest.raises(ValueError, match="percentile must be in"):
        percentile([1.0], 101)


def test_constant_and_zero_samples_have_zero_cov() -> None:
    assert Stats.from_samples([2.0] * 5).cov == 0.0
    zero = Stats.from_samples([0.0] * 5)  # a CPU engine's H2D time
    assert zero.cov == 0.0 and zero.max == 0.0


def test_cov_of_a_known_spread() -> None:
    s = Stats.from_samples([9.0, 11.0])  # mean 10, population std 1
    assert s.cov == pytest.approx(10.0)


def test_empty_samples_raise() -> None:
    with pytest.raises(ValueError, match="empty"):
        Stats.from_samples([])


def test_format_and_dict() -> None:
    s = Stats.from_samples([1.0, 2.0, 3.0])
    text = s.format()
    assert text.startswith("min = 1 ms, max = 3 ms, mean = 2 ms, median = 2 ms")
    assert "percentile(90%) = 3 ms" in text and "percentile(99%)" in text
    assert s.to_dict()["p95"] == 3.0
