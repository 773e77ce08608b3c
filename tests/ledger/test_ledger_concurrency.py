"""Concurrent writers on one PostgreSQL ledger near its cap never over-admit.

8 processes x 500 random reserve/commit/release calls on one ledger of two tenants whose in-quota
demand is well past their caps (two tenants so that writers also run side by side, not only in
turn). Afterwards every intermediate state replayed from the entries is within the cap, every
admission within the cap of the ratio it was made under, and `rebuild()` agrees with the stored
balances.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine

from tests.ledger.ledger_helpers import drop_schema, new_schema, postgres_base_url, with_search_path
from xirang_platform.ledger import Ledger
from xirang_platform.ledger.loadgen import Workload, run_writers
from xirang_platform.ledger.rebuild import cap_violations
from xirang_platform.scheduling.quota import balances_from

WRITERS = 8
CALLS = 500


@pytest.fixture
def pg_ledger_url(pg_admin: Engine) -> Iterator[str]:
    """A fresh, migrated PostgreSQL schema of its own (dropped afterwards)."""
    schema = new_schema(pg_admin, "xirang_ledger_concurrency")
    url = with_search_path(postgres_base_url(), schema)
    Ledger(url).close()
    yield url
    drop_schema(pg_admin, schema)


@pytest.mark.postgres
@pytest.mark.stress
def test_eight_writers_near_the_cap_never_over_admit(pg_ledger_url: str) -> None:
    ledger = Ledger(pg_ledger_url, migrate=False)
    # acme: 8 GPUs (cap 9.6 at ratio 1.2); vision 4 (cap 4.8), nlp 5 (cap 6), misc without a quota.
    # beta: 4 GPUs (cap 4.8); web 3 (cap 3.6), etl without a quota.
    # Each writer aims at 3 live allocations of 1-2 GPUs: ~8 x 3 x 1.33 = 32 GPUs of demand for 14.4.
    ledger.add_tenant("acme", 8000)
    ledger.add_project("acme", "vision", 4000)
    ledger.add_project("acme", "nlp", 5000)
    ledger.add_project("acme", "misc")
    ledger.add_tenant("beta", 4000)
    ledger.add_project("beta", "web", 3000)
    ledger.add_project("beta", "etl")
    accounts = (("acme", "vision"), ("acme", "nlp"), ("acme", "misc"), ("beta", "web"), ("beta", "etl"))
    work = Workload(pg_ledger_url, accounts, calls=CALLS, seed=7)

    reports, _ = run_writers(work, WRITERS)

    assert [r.errors for r in reports] == [[]] * WRITERS
    assert sum(r.calls for r in reports) == WRITERS * CALLS
    # The workload really pushed past the cap: some P0 refused, some P1/P2 borrowed and returned.
    assert min(sum(r.refused for r in reports), sum(r.borrowed for r in reports), sum(r.returned for r in reports)) > 0
    entries = ledger.entries()
    # Every state of every capped account, replayed entry by entry, within quota x max ratio ...
    assert cap_violations(entries, ratio=ledger.policy.max_ratio) == []
    # ... and every admission within the cap at the ratio the cluster load gave it.
    assert cap_violations(entries) == []
    assert ledger.rebuild().differences == []
    book, balances = ledger.snapshot()
    assert balances == balances_from(book, ledger.allocations())
    ledger.close()


def test_sqlite_writers_take_turns_and_never_over_admit(tmp_path) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path / 'shared.sqlite'}"
    ledger = Ledger(url)
    ledger.add_tenant("acme", 3000)  # cap 3.6 GPUs for 4 writers aiming at ~4 GPUs each
    ledger.add_project("acme", "vision", 2000)
    ledger.add_project("acme", "misc")
    work = Workload(url, (("acme", "vision"), ("acme", "misc")), calls=150, seed=3)

    reports, _ = run_writers(work, 4)

    assert [r.errors for r in reports] == [[]] * 4
    entries = ledger.entries()
    assert sum(r.refused for r in reports) > 0
    assert cap_violations(entries, ratio=ledger.policy.max_ratio) == []
    assert cap_violations(entries) == []
    assert ledger.rebuild().differences == []
    ledger.close()
