"""Reported checkpoints: the ledger keeps the last checkpoint time of each live allocation, and
`allocations()` hands it to the snapshot as `Allocation.checkpointed_at` (victim cost counts from it)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.ledger.ledger_helpers import alloc, dump
from xirang_platform.ledger import Ledger


def two_running(ledger: Ledger) -> None:
    ledger.add_tenant("acme", 4000)
    ledger.add_project("acme", "vision")
    ledger.reserve(alloc("a", gpus=2, node="n0", start=100.0))
    ledger.commit("a")
    ledger.reserve(alloc("b", node="n1", start=200.0))


def checkpoints(ledger: Ledger) -> dict[str, float | None]:
    return {a.id: a.checkpointed_at for a in ledger.allocations()}


@pytest.mark.parametrize(
    ("reports", "want_recorded", "want"),
    [
        pytest.param(
            [{"a": 500.0}], ["a"], {"a": 500.0, "b": None}, id="a reported checkpoint rides on the allocation"
        ),
        pytest.param(
            [{"a": 500.0}, {"a": 400.0}], [], {"a": 500.0, "b": None}, id="an older report never moves it back"
        ),
        pytest.param(
            [{"a": 500.0, "b": 300.0}, {"b": 350.0}],
            ["b"],
            {"a": 500.0, "b": 350.0},
            id="several at once, then a later one of one of them",
        ),
        pytest.param(
            [{"gone": 500.0, "a": 600.0}],
            ["a"],
            {"a": 600.0, "b": None},
            id="a run the ledger holds nothing for is ignored, not an error",
        ),
    ],
)
def test_the_last_reported_checkpoint_is_kept_per_allocation(
    ledger: Ledger, reports: list[dict[str, float]], want_recorded: list[str], want: dict[str, float | None]
) -> None:
    two_running(ledger)
    recorded: list[str] = []
    for report in reports:
        recorded = ledger.checkpointed_many(report)
    assert recorded == want_recorded  # what the last report moved
    assert checkpoints(ledger) == want


def test_a_checkpoint_changes_no_balance_and_writes_no_entry(ledger: Ledger) -> None:
    two_running(ledger)
    before = dump(ledger)
    ledger.checkpointed_many({"a": 500.0})
    after = dump(ledger)
    assert after["entries"] == before["entries"]
    assert after["accounts"] == before["accounts"]
    assert ledger.rebuild().ok


def test_a_released_allocation_keeps_no_checkpoint_for_its_next_admission(ledger: Ledger) -> None:
    two_running(ledger)
    ledger.checkpointed_many({"b": 300.0})
    ledger.release("b")
    assert ledger.checkpointed_many({"b": 400.0}) == []
    again = alloc("b", node="n1", start=1_000.0)
    ledger.reserve(again)
    assert [a for a in ledger.allocations() if a.id == "b"] == [replace(again, checkpointed_at=None)]
