"""Invariants of the ledger under random operation sequences (hypothesis), on SQLite and PostgreSQL:

- the balances equal what the core computes from the live allocations (`quota.balances_from`);
- every stored balance equals the sum of its entries (`rebuild`);
- no admission left an account past the cap it was admitted under (replayed from the entries);
- the ledger's reserve verdict is the core's `check` on the balances before it;
- a refused call changes nothing.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from tests.ledger.ledger_helpers import wipe
from tests.ledger.ledger_operations import apply, operations, setup
from xirang_platform.ledger import Ledger
from xirang_platform.ledger.rebuild import cap_violations
from xirang_platform.scheduling.quota import balances_from


def assert_invariants(ledger: Ledger) -> None:
    book, balances = ledger.snapshot()
    assert balances == balances_from(book, ledger.allocations())


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations)
def test_random_operations_keep_the_ledger_invariants(ledger: Ledger, ops: list[object]) -> None:
    wipe(ledger)
    setup(ledger)
    for step, op in enumerate(ops):
        apply(ledger, op, step)
        assert_invariants(ledger)
    report = ledger.rebuild()
    assert report.differences == []
    assert cap_violations(ledger.entries()) == []
