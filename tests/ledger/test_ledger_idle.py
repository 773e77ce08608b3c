"""The idle history the live tick rebuilds from the ledger's entries (`Ledger.idle_history`) is the one
the simulator records as its cycles run (`quota.IdleHistory`), on SQLite and PostgreSQL."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.ledger.ledger_helpers import alloc, wipe
from tests.ledger.ledger_operations import apply, batches, on_live, reserves, returns, setup
from xirang_platform.ledger import Ledger
from xirang_platform.scheduling.model import Tier
from xirang_platform.scheduling.quota import AccountKey, IdleHistory

ACME, BETA = AccountKey("acme"), AccountKey("beta")


class Clock:
    """A clock the test moves: every ledger transaction is written at `now`."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def on_clock(ledger: Ledger) -> Clock:
    clock = Clock()
    ledger.clock = clock
    return clock


def lasting(ledger: Ledger, now: float, span: float) -> dict[AccountKey, int]:
    """What the live tick puts in `Snapshot.lasting_idle`."""
    return ledger.idle_history(now - span).lasting_idle(now, span)


GAPS = st.sampled_from([0.0, 1.0, 300.0, 600.0, 1800.0, 2400.0])
cycles = st.lists(
    st.tuples(GAPS, st.lists(st.one_of(reserves, on_live, on_live, batches, returns), max_size=4)),
    min_size=1,
    max_size=7,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cycles=cycles, span=st.sampled_from([0.0, 600.0, 1800.0]), last_gap=GAPS)
def test_the_ledger_idle_history_is_the_simulators(
    ledger: Ledger, cycles: list[tuple[float, list[object]]], span: float, last_gap: float
) -> None:
    wipe(ledger)
    clock = on_clock(ledger)
    setup(ledger)
    simulated = IdleHistory(ledger.quota_book())
    step = 0
    for gap, ops in cycles:
        clock.now += gap
        # A cycle decides on the history up to its start, then its decisions are written at one instant.
        assert lasting(ledger, clock.now, span) == simulated.lasting_idle(clock.now, span)
        for op in ops:
            apply(ledger, op, step)
            step += 1
        simulated.record(clock.now, ledger.balances())
    clock.now += last_gap
    assert lasting(ledger, clock.now, span) == simulated.lasting_idle(clock.now, span)


def test_idle_quota_lasts_from_the_release_that_made_it_idle(ledger: Ledger) -> None:
    clock = on_clock(ledger)
    setup(ledger)  # acme 3 GPUs, beta 1
    ledger.reserve(alloc("a1", "acme", "vision", Tier.OFFLINE_TRAINING, gpus=2))
    clock.now = 100.0
    ledger.commit("a1")  # reserved -> used: in-quota unchanged
    clock.now = 1000.0
    ledger.release("a1")
    # acme held 2 GPUs until t=1000: idle 1 GPU over any span reaching before it, 3 after 1800 s.
    assert lasting(ledger, 1000.0, 1800.0) == {ACME: 1000, BETA: 1000}
    assert lasting(ledger, 2799.0, 1800.0) == {ACME: 1000, BETA: 1000}
    assert lasting(ledger, 2800.0, 1800.0) == {ACME: 3000, BETA: 1000}


def test_borrowed_milli_is_not_in_quota_until_it_is_returned(ledger: Ledger) -> None:
    clock = on_clock(ledger)
    setup(ledger)
    ledger.reserve(alloc("b1", "beta", "web", Tier.OFFLINE_TRAINING, gpus=2), 0.95)  # past beta's cap of 1 GPU
    assert lasting(ledger, 400.0, 600.0)[BETA] == 1000  # all of beta's quota, though it holds 2 GPUs
    clock.now = 500.0
    ledger.set_tenant_quota("beta", 4000)
    ledger.set_project_quota("beta", "web", None)
    assert ledger.return_borrowed("beta", 0.95) == ["b1"]
    assert lasting(ledger, 600.0, 600.0)[BETA] == 2000
