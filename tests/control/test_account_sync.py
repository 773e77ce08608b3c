"""Two processes that sync the platform config's accounts at once (every code server's sensors do
at start-up) both succeed: the one that finds an account already added by the other goes on."""

from __future__ import annotations

from pathlib import Path

import pytest

from xirang_platform.control.accounts import sync_accounts
from xirang_platform.ledger.ledger import Ledger
from xirang_platform.scheduling.quota import QuotaBook

BOOK = QuotaBook(tenants={"product": 8000, "research": 12000}, projects={("research", "llm"): 6000})


def accounts(ledger: Ledger) -> dict[tuple[str, str | None], int | None]:
    return {(v.key.tenant, v.key.project): v.quota for v in ledger.accounts()}


def test_a_sync_that_read_the_ledger_before_another_sync_added_its_accounts_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    ours, theirs = Ledger(url), Ledger(url, migrate=False)
    before = ours.accounts()  # both read an empty ledger; the other process adds everything first
    assert sync_accounts(theirs, BOOK) == [
        "tenant product added",
        "tenant research added",
        "project research/llm added",
    ]
    reads = [before]  # our first read is the one from before theirs; later ones are fresh
    fresh = ours.accounts
    monkeypatch.setattr(ours, "accounts", lambda: reads.pop() if reads else fresh())
    assert sync_accounts(ours, BOOK) == []
    monkeypatch.undo()
    assert accounts(ours) == {("product", None): 8000, ("research", None): 12000, ("research", "llm"): 6000}
