"""The quota ledger: tenants, projects, accounts and append-only entries, on SQLite or PostgreSQL."""
