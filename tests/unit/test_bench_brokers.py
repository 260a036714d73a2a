"""The brokers benchmark's ratio table (pure: no broker is started here)."""

from __future__ import annotations

import pytest

from bench.brokers import PAIRS, paired_ratio, ratio_table


def test_a_ratio_is_the_median_of_the_per_round_ratios_with_their_quartiles() -> None:
    r = paired_ratio([100, 300, 200, 50], [100, 100, 100, 100])
    assert r["round_ratios"] == [1.0, 3.0, 2.0, 0.5]
    assert r["median_of_round_ratios"] == 1.5
    assert r["iqr"] == [0.875, 2.25]  # inclusive: within the measured ratios
    assert r["of_medians"] == 1.5


def test_one_round_gives_its_own_ratio_as_the_whole_range() -> None:
    r = paired_ratio([50], [100])
    assert r["median_of_round_ratios"] == r["iqr"][0] == r["iqr"][1] == 0.5


def test_rounds_must_pair_up() -> None:
    with pytest.raises(ValueError, match="as many rounds"):
        paired_ratio([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="as many rounds"):
        paired_ratio([], [])


def test_a_pair_with_a_variant_not_measured_is_left_out() -> None:
    samples = {
        key: {"noop": [2.0, 4.0], "sleep2ms": [1.0, 1.0]}
        for key in ("rmq-default", "rmq-fast", "redis-fast")
    }
    table = ratio_table(samples, PAIRS, ("noop", "sleep2ms"))
    assert set(table) == {
        "rmq-fast/rmq-default:noop",
        "rmq-fast/rmq-default:sleep2ms",
        "redis-fast/rmq-fast:noop",
        "redis-fast/rmq-fast:sleep2ms",
    }  # no cluster: its two pairs are absent, not zero
    assert table["redis-fast/rmq-fast:noop"]["median_of_round_ratios"] == 1.0
