"""The verdict rule, the noise band, the loss check and the ranking: pure functions, exact numbers."""

from __future__ import annotations

import math

import pytest

from fastops.doctor.report import (
    Band,
    Outcome,
    loss_problem,
    quantile,
    rank,
    speedup_band,
    verdict,
)


def test_quantile_interpolates() -> None:
    assert quantile([4.0, 1.0, 3.0, 2.0, 5.0], 0.2) == pytest.approx(1.8)
    assert quantile([4.0, 1.0, 3.0, 2.0, 5.0], 0.5) == 3.0
    assert quantile([7.0], 0.8) == 7.0
    with pytest.raises(ValueError, match="fastops.doctor"):
        quantile([], 0.5)


def test_band_is_p20_over_p80_and_p80_over_p20() -> None:
    base = [90.0, 95.0, 100.0, 105.0, 110.0]  # p20 94, p80 106
    lever = [180.0, 190.0, 200.0, 210.0, 220.0]  # p20 188, p80 212
    band = speedup_band(lever, base)
    assert band.speedup == pytest.approx(2.0)
    assert band.low == pytest.approx(188 / 106)
    assert band.high == pytest.approx(212 / 94)


@pytest.mark.parametrize(
    ("low", "high", "expected"),
    [
        (1.031, 1.2, "apply"),
        (1.03, 1.2, "no gain"),  # the whole band must be above 1.03x, strictly
        (0.99, 1.5, "no gain"),
        (0.5, 0.969, "slower"),
        (0.5, 0.97, "no gain"),
        (0.96, 1.04, "no gain"),
    ],
)
def test_verdict_rule(low: float, high: float, expected: str) -> None:
    assert verdict(Band((low + high) / 2, low, high)) == expected


def test_loss_problem() -> None:
    base = [2.0, 1.5, 1.0, 0.5]
    assert loss_problem([2.1, 1.4, 1.1, 0.6], base) is None
    assert "NaN/inf" in (loss_problem([2.0, math.nan, 1.0, 0.5], base) or "")
    assert "drifted" in (loss_problem([4.0, 4.0, 4.0, 4.0], base) or "")
    assert "drifted" in (loss_problem([0.1, 0.1, 0.1, 0.1], base) or "")
    # One-sided (a larger batch of real data): only a higher loss counts.
    assert loss_problem([0.1, 0.1, 0.1, 0.1], base, one_sided=True) is None
    assert loss_problem([4.0, 4.0, 4.0, 4.0], base, one_sided=True) is not None
    # Near zero the absolute tolerance rules.
    assert loss_problem([0.04, 0.04], [0.001, 0.001]) is None


def test_rank_fastest_first_failed_last() -> None:
    outcomes = [
        Outcome("a", "g", "failed: out of memory"),
        Outcome("b", "g", "no gain", speedup=1.01),
        Outcome("c", "g", "apply", speedup=1.5),
        Outcome("d", "g", "slower", speedup=0.5),
    ]
    assert [o.name for o in rank(outcomes)] == ["c", "b", "d", "a"]
