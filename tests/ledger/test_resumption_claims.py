"""A preempted run is resumed by one run only: the first to claim its preemption in the ledger, even
when several claim it at the same moment (the coordinator's check of the victim's tag alone let two
concurrent submissions both inherit). On SQLite and PostgreSQL."""

from __future__ import annotations

import threading

from tests.ledger.ledger_helpers import alloc
from xirang_platform.ledger import Ledger
from xirang_platform.ledger.preemptions import PreemptionRecord, claim_resumption, preemption_records


def preempted(ledger: Ledger, rid: str = "victim") -> PreemptionRecord:
    """`rid` admitted, launched and preempted; the ledger's record of that preemption."""
    if not ledger.quota_book().tenants:
        ledger.add_tenant("acme", 4000)
        ledger.add_project("acme", "vision", 4000)
    ledger.reserve(alloc(rid))
    ledger.commit(rid)
    ledger.preempt(rid, "urgent")
    return preemption_records(ledger.engine, [rid])[rid]


def test_the_first_claim_wins_and_only_its_run_may_claim_again(ledger: Ledger) -> None:
    record = preempted(ledger)
    claims = [("run-a", True), ("run-b", False), ("run-a", True), ("run-c", False)]
    assert [claim_resumption(ledger.engine, "victim", record, run, 2000.0) for run, _ in claims] == [
        won for _, won in claims
    ]


def test_a_later_preemption_of_the_same_request_is_claimed_afresh(ledger: Ledger) -> None:
    first = preempted(ledger)
    assert claim_resumption(ledger.engine, "victim", first, "run-a", 2000.0)
    second = preempted(ledger)  # resumed under its own id and preempted again
    assert second.at > first.at
    assert claim_resumption(ledger.engine, "victim", second, "run-b", 2001.0)
    assert not claim_resumption(ledger.engine, "victim", second, "run-a", 2002.0)


def test_of_runs_claiming_one_preemption_at_the_same_moment_exactly_one_wins(ledger: Ledger) -> None:
    record = preempted(ledger)
    runs = [f"run-{k}" for k in range(8)]
    start = threading.Barrier(len(runs))
    won: dict[str, bool] = {}

    def claim(run: str) -> None:
        start.wait()
        won[run] = claim_resumption(ledger.engine, "victim", record, run, 2000.0)

    threads = [threading.Thread(target=claim, args=(run,)) for run in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [run for run in runs if won[run]]
    assert len(winners) == 1, won
    assert [claim_resumption(ledger.engine, "victim", record, run, 2001.0) for run in runs] == [
        run in winners for run in runs
    ]
