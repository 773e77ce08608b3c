"""The lending forecast: `quota.forecast_idle`, `IdleHistory.idle_ahead` and `quota.lendable_ahead` (a
borrow takes only idle quota forecast to stay idle a checkpoint interval, `SchedulerConfig.lend_forecast_s`)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.scheduling.cycle_builders import Case, expected, job, node, outcome, quotas, running, snapshot_of
from xirang_platform.scheduling.config import SchedulerConfig
from xirang_platform.scheduling.cycle import cycle
from xirang_platform.scheduling.quota import (
    AccountKey,
    Balance,
    IdleHistory,
    QuotaBook,
    forecast_idle,
    lendable_ahead,
)

Q = 8_000  # the lender's quota, milli
HOUR = 3_600.0


@pytest.mark.parametrize(
    ("steps", "now", "want"),
    [
        pytest.param([(0, Q)], 500, 0, id="nothing idle"),
        pytest.param([(0, 2_000)], 5_000, 6_000, id="idle all along: forecast to stay idle"),
        pytest.param([(0, Q), (1_000, 2_000)], 1_000, 6_000, id="idle for the first time: no evidence it ends"),
        pytest.param(
            [(0, Q), (1_000, 2_000), (2_500, Q), (4_600, 2_000)],
            4_700,
            0,
            id="the last dip lasted 1,500 s: taken back before a checkpoint",
        ),
        pytest.param(
            [(0, Q), (1_000, 2_000), (2_500, Q), (4_600, 2_000)],
            6_200,
            6_000,
            id="the same dip 1,600 s on has outlasted the last one: no evidence left, lent",
        ),
        pytest.param(
            [(0, Q), (1_000, 2_000), (3_000, Q), (4_600, 2_000)],
            4_700,
            6_000,
            id="the last dip lasted 2,000 s: 1,900 s ahead, a checkpoint is reached",
        ),
        pytest.param(
            [(0, Q), (1_000, 2_000), (3_000, Q), (4_600, 2_000)],
            4_900,
            0,
            id="the same dip 200 s later: 1,700 s ahead, too short now",
        ),
        pytest.param(
            # Levels 4,000-8,000 were idle 1,000-4,000 (3,000 s); levels 1,000-4,000 only 2,000-2,300.
            [(0, Q), (1_000, 4_000), (2_000, 1_000), (2_300, 4_000), (4_000, Q), (6_000, 4_000), (6_100, 1_000)],
            6_200,
            4_000,
            id="a long shallow dip is lent, the short deep one inside it is not",
        ),
        pytest.param(
            [(0, 2_000), (1_000, Q), (4_600, 2_000)],
            4_700,
            6_000,
            id="the last dip began before the span: its length is unknown, lent",
        ),
        pytest.param(
            [(0, Q), (1_000, 4_000), (2_000, Q), (4_600, 1_000)],
            4_700,
            3_000,
            id="levels deeper than any earlier dip are lent, the ones that came back after 1,000 s are not",
        ),
    ],
)
def test_forecast_idle(steps, now, want) -> None:
    assert forecast_idle(steps, Q, now, 1_800) == want


def test_an_hourly_swing_lends_only_the_levels_that_stayed_idle_a_checkpoint_interval() -> None:
    # The lender holds 127 GPUs for most of each hour, 94 for 35 minutes, 70 for 5 of them.
    book = QuotaBook({"serving": 128_000}, {("serving", "default"): None})
    key = AccountKey("serving")
    history = IdleHistory(book)

    def until(end: float) -> None:
        for hour in range(3):
            for minute, gpus in ((0, 127), (10, 94), (20, 70), (25, 94), (45, 127)):
                t = hour * HOUR + minute * 60
                if t <= end:
                    history.record(t, {key: Balance(128_000, used=gpus * 1_000)})

    dip, deep = 2 * HOUR + 10 * 60, 2 * HOUR + 20 * 60
    until(dip)
    # At the top of the third hour's dip: 34 GPUs idle, 33 of them idle for 35 minutes last time and
    # one never used: all lent.
    assert history.idle_ahead(dip, 2 * HOUR, 1_800) == {key: 34_000}
    history.record(deep, {key: Balance(128_000, used=70_000)})
    # In its deep part: the 24 GPUs more were idle only 5 minutes last time, and the 33 have 25 minutes
    # left: only the GPU never used is lent; with a 20-minute horizon the 33 are lent again.
    assert history.idle_ahead(deep, 2 * HOUR, 1_800) == {key: 1_000}
    assert history.idle_ahead(deep, 2 * HOUR, 1_200) == {key: 34_000}


@pytest.mark.parametrize(
    ("tenant", "ahead", "free", "want"),
    [
        pytest.param("a", {AccountKey("b"): 3_000}, 5_000, 5_000, id="all of b's idle quota lasts: every free unit"),
        pytest.param("a", {AccountKey("b"): 1_000}, 5_000, 3_000, id="2,000 of b's idle quota comes back soon"),
        pytest.param("b", {AccountKey("b"): 1_000}, 5_000, 5_000, id="a tenant's own forecast does not bind it"),
        pytest.param("a", {AccountKey("b"): 0}, 2_000, -1_000, id="lent past what lasts"),
    ],
)
def test_lendable_ahead(tenant, ahead, free, want) -> None:
    # b holds 1,000 of its 4,000: 3,000 idle.
    balances = {AccountKey("a"): Balance(8_000, used=8_000), AccountKey("b"): Balance(4_000, used=1_000)}
    assert lendable_ahead(balances, ahead, free, tenant) == want


@given(
    st.lists(st.tuples(st.integers(1, 2_000), st.integers(0, Q)), min_size=1, max_size=25),
    st.integers(0, 4_000),
)
def test_forecast_idle_matches_the_last_episode_of_every_level(gaps_and_held, horizon) -> None:
    steps, t = [(0.0, Q)], 0.0
    for gap, held in gaps_and_held:
        t += gap
        steps.append((t, held))
    now = t + 1

    # Brute force, one level (one milli of the quota) at a time.
    def lends(level: int) -> bool:
        idle = [h <= level for _, h in steps]
        k = len(steps) - 1
        while k >= 0 and idle[k]:
            k -= 1
        if k < 0:
            return True
        began = steps[k + 1][0]
        j = k
        while j >= 0 and not idle[j]:
            j -= 1
        if j < 0:
            return True
        ended = steps[j + 1][0]
        while j >= 0 and idle[j]:
            j -= 1
        if j < 0:
            return True
        lasted = ended - steps[j + 1][0]
        return began + lasted - now >= horizon or now - began > lasted

    assert forecast_idle(steps, Q, now, horizon) == sum(lends(level) for level in range(steps[-1][1], Q))


def test_lend_forecast_must_be_positive() -> None:
    with pytest.raises(ValueError, match="lend_forecast_s must be > 0"):
        SchedulerConfig(lend_forecast_s=0)


# One cycle: serving (P0) holds 2 of its 8 GPUs on n0, training all 8 of its own on n1; training asks
# 4 GPUs more, past its cap, so it may only borrow serving's 6 idle GPUs.
_SERVING = running(job("replica-0").gpus(2).tier("inference").tenant("serving"), on={"n0": [0, 1]})
_TRAINING = running(job("own").gpus(8).tenant("train"), on={"n1": list(range(8))})


def _case(idle_ahead: dict[str, float] | None, **kw) -> Case:
    return Case(
        nodes=[node("n0"), node("n1")],
        book=quotas({"serving": 8, "train": 8}),
        running=[_SERVING, _TRAINING],
        now=5_000,
        config=SchedulerConfig(min_runtime_s=1_800, checkpoint_interval_s=1_800),
        idle_ahead=idle_ahead,
        **kw,
    )


_LENT = {"want_admit": {"more": {"n0": [2, 3, 4, 5]}}, "want_borrowed": {"more"}}


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(_case(None, pending=[job("more").gpus(4).tenant("train")], **_LENT), id="no forecast: lent"),
        pytest.param(
            _case({"serving": 6}, pending=[job("more").gpus(4).tenant("train")], **_LENT),
            id="all 6 idle GPUs forecast to stay idle a checkpoint interval: lent",
        ),
        pytest.param(
            _case({"serving": 2}, pending=[job("more").gpus(4).tenant("train")], want_hold={"more": "over-quota"}),
            id="4 of the 6 come back before a checkpoint: 2 lendable, the 4-GPU job waits",
        ),
        pytest.param(
            _case(
                {"serving": 2},
                pending=[job("more").gpus(2).tenant("train")],
                want_admit={"more": {"n0": [2, 3]}},
                want_borrowed={"more"},
            ),
            id="a 2-GPU job fits in what stays idle",
        ),
        pytest.param(
            _case(
                {"serving": 6},
                pending=[job("more").gpus(4).tenant("train").reclaimed(at=4_500)],
                lasting_idle={"serving": 0, "train": 0},
                **_LENT,
            ),
            id="within its back-off a reclaimed job borrows what is forecast to stay idle",
        ),
        pytest.param(
            _case(
                None,
                pending=[job("more").gpus(4).tenant("train").reclaimed(at=4_500)],
                lasting_idle={"serving": 0, "train": 0},
                want_hold={"more": "over-quota"},
            ),
            id="without a forecast it waits out its back-off",
        ),
    ],
)
def test_a_borrow_takes_only_idle_quota_forecast_to_stay_idle(case: Case) -> None:
    assert outcome(case) == expected(case)


def test_a_borrow_held_by_the_forecast_says_why() -> None:
    case = _case({"serving": 2}, pending=[job("more").gpus(4).tenant("train")])
    [hold] = cycle(snapshot_of(case), [b.build() for b in case.pending], case.now, case.config).holds
    assert hold.message.endswith(
        "its owners are forecast to take the idle units back within a checkpoint interval (1800 s), before a "
        "borrower's first checkpoint (2000 milli lendable that long now)"
    )
