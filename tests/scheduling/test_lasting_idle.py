"""Idle quota that has lasted: `quota.IdleHistory` and `quota.lasting_lendable` (the reclaimed-borrower
rule of `SchedulerConfig.lend_after_s`)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from xirang_platform.scheduling.quota import AccountKey, Balance, IdleHistory, QuotaBook, lasting_lendable

BOOK = QuotaBook({"a": 8_000, "b": 4_000}, {("a", "default"): None, ("b", "default"): None})
A, B = AccountKey("a"), AccountKey("b")


def held(a: int, b: int, borrowed_a: int = 0) -> dict[AccountKey, Balance]:
    return {A: Balance(8_000, used=a, borrowed=borrowed_a), B: Balance(4_000, used=b)}


@pytest.mark.parametrize(
    ("records", "now", "want"),
    [
        pytest.param([], 100, {A: 8_000, B: 4_000}, id="never recorded: all idle"),
        pytest.param([(0, held(2_000, 4_000))], 5_000, {A: 6_000, B: 0}, id="one record holds from then on"),
        pytest.param(
            [(0, held(6_000, 0)), (1_000, held(1_000, 0))], 2_000, {A: 2_000, B: 4_000}, id="a drop has not lasted"
        ),
        pytest.param(
            [(0, held(6_000, 0)), (1_000, held(1_000, 0))], 2_800, {A: 7_000, B: 4_000}, id="a drop lasted the span"
        ),
        pytest.param(
            [(0, held(1_000, 0)), (500, held(7_000, 0)), (600, held(1_000, 0))],
            2_000,
            {A: 1_000, B: 4_000},
            id="a short peak inside the span counts",
        ),
        pytest.param(
            [(0, held(1_000, 0)), (500, held(7_000, 0)), (500, held(1_000, 0))],
            1_000,
            {A: 7_000, B: 4_000},
            id="two records at one instant: the last one holds",
        ),
    ],
)
def test_lasting_idle_is_the_least_idle_quota_over_the_span(records, now, want) -> None:
    history = IdleHistory(BOOK)
    for t, balances in records:
        history.record(t, balances)
    assert history.lasting_idle(now, 1_800) == want


def test_record_says_when_idle_quota_grew() -> None:
    history = IdleHistory(BOOK)
    assert [history.record(t, b) for t, b in [(0, held(1, 1)), (1, held(2, 1)), (2, held(2, 0)), (3, held(2, 0))]] == [
        False,
        False,
        True,
        False,
    ]


@pytest.mark.parametrize(
    ("tenant", "lasting", "balances", "pool", "want"),
    [
        pytest.param("a", {A: 8_000, B: 4_000}, held(0, 0), 12_000, 4_000, id="the other tenant's lasting idle"),
        pytest.param("a", {A: 8_000, B: 4_000}, held(0, 0, 3_000), 12_000, 1_000, id="less what is lent"),
        pytest.param("b", {A: 8_000, B: 4_000}, held(0, 0), 14_000, 10_000, id="plus the pool no tenant owns"),
        pytest.param("a", {A: 8_000, B: 0}, held(0, 0, 2_000), 12_000, -2_000, id="lent past what lasted"),
    ],
)
def test_lasting_lendable(tenant, lasting, balances, pool, want) -> None:
    assert lasting_lendable(BOOK, balances, lasting, pool, tenant) == want


@given(
    st.lists(st.tuples(st.integers(0, 50), st.integers(0, 8_000)), min_size=1, max_size=30),
    st.integers(0, 60),
)
def test_lasting_idle_matches_the_minimum_over_every_instant(steps, span) -> None:
    history = IdleHistory(QuotaBook({"a": 8_000}, {("a", "default"): None}))
    times, t = [], 0
    for gap, used in steps:
        t += gap
        history.record(t, {A: Balance(8_000, used=used)})
        times.append((t, used))
    now = t + 5

    # Brute force: the holding in effect at every instant of [now - span, now] (0 before the first record).
    def at(x: float) -> int:
        in_effect = [u for s, u in times if s <= x]
        return in_effect[-1] if in_effect else 0

    instants = [now - span, *(s for s, _ in times if now - span <= s <= now)]
    assert history.lasting_idle(now, span)[A] == max(0, 8_000 - max(at(x) for x in instants))
