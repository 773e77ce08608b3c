"""Stalled writers on PostgreSQL: every wait is bounded (issue 10, item 4).

A writer stopped inside a transaction (SIGSTOP, a hung process) holds its tenant's row locks. Every
other writer of that tenant used to wait with no limit. Now a waiter gets `LedgerBusy` (retryable,
nothing written) after `lock_timeout`, and the server ends the stalled session after
`idle_in_transaction_session_timeout`, which frees its locks. The stall here is real: a second
connection holding the rows with SELECT ... FOR UPDATE inside an open transaction, as a writer does.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Connection, text
from typer.testing import CliRunner

from tests.ledger.ledger_helpers import dump, wipe
from xirang_platform.cli.quota import EXIT_RETRY, quota_app
from xirang_platform.ledger import Ledger, db
from xirang_platform.ledger.errors import LedgerBusy

pytestmark = pytest.mark.postgres


@pytest.fixture
def ledger(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ledger]:
    """An empty PostgreSQL ledger whose sessions wait at most 0.3 s for a lock, with tenant acme."""
    monkeypatch.setattr(db, "PG_LOCK_TIMEOUT_MS", 300)
    ledger = Ledger(postgres_url, migrate=False)
    wipe(ledger)
    ledger.add_tenant("acme", 8000)
    ledger.add_project("acme", "vision", 4000)
    yield ledger
    ledger.close()


def hold_rows(conn: Connection, tenant: str) -> None:
    """Lock `tenant`'s account rows in an open transaction, as a writer does, and stall there."""
    conn.execute(text("SELECT key FROM accounts WHERE tenant = :t ORDER BY key FOR UPDATE"), {"t": tenant})


def test_a_writer_behind_a_stalled_transaction_gets_a_retryable_error_and_writes_nothing(
    ledger: Ledger, postgres_url: str
) -> None:
    stalled = db.make_engine(postgres_url)
    with stalled.connect() as conn:
        hold_rows(conn, "acme")
        before = dump(ledger)
        with pytest.raises(LedgerBusy, match=r"the quota ledger is busy: .* more than 0.3 s \(lock_timeout\)") as err:
            ledger.set_tenant_quota("acme", 9000)
        assert err.value.retryable
        assert "idle in transaction" in str(err.value)
        conn.rollback()
    stalled.dispose()
    assert dump(ledger) == before
    ledger.set_tenant_quota("acme", 9000)  # the retry, once the stall is gone, succeeds
    assert ledger.quota_book().tenants == {"acme": 9000}


def test_the_cli_says_busy_and_exits_with_the_retry_code(
    ledger: Ledger, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(db.URL_ENV, postgres_url)
    stalled = db.make_engine(postgres_url)
    with stalled.connect() as conn:
        hold_rows(conn, "acme")
        result = CliRunner().invoke(quota_app, ["project", "set", "acme", "vision", "--quota", "2"])
        conn.rollback()
    stalled.dispose()
    assert result.exit_code == EXIT_RETRY
    assert "the quota ledger is busy" in result.output
    assert "Traceback" not in result.output
    assert ledger.quota_book().projects == {("acme", "vision"): 4000}


def test_the_server_ends_a_stalled_session_and_the_waiting_writer_goes_on(
    ledger: Ledger, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(db, "PG_LOCK_TIMEOUT_MS", 0)  # 0: this writer waits for the lock without limit
    patient = Ledger(postgres_url, migrate=False)
    stalled = db.make_engine(postgres_url, idle_timeout_ms=500)
    conn = stalled.connect()
    hold_rows(conn, "acme")

    patient.set_tenant_quota("acme", 9000)  # waits until the server ends the stalled session

    assert patient.quota_book().tenants == {"acme": 9000}
    with pytest.raises(LedgerBusy, match="it stayed idle for more than 0.5 s and the server ended it"):
        conn.execute(text("SELECT 1"))
    conn.close()
    stalled.dispose()
    patient.close()
