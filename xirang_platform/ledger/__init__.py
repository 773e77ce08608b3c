"""The quota ledger: tenants, projects, accounts and append-only entries, on SQLite or PostgreSQL."""

from __future__ import annotations

from xirang_platform.ledger.admission import Reservation
from xirang_platform.ledger.balances import AccountView
from xirang_platform.ledger.errors import LedgerError, StaleCycle
from xirang_platform.ledger.ledger import Ledger
from xirang_platform.ledger.rebuild import EntryView, RebuildReport

__all__ = ["AccountView", "EntryView", "Ledger", "LedgerError", "RebuildReport", "Reservation", "StaleCycle"]
