"""Builders and helpers of the ledger tests: allocation builder, clock, table dumps, schemas."""

from __future__ import annotations

import itertools
import os
import uuid

from sqlalchemy import Engine, delete, select, text
from sqlalchemy.engine import make_url

from xirang_platform.ledger import Ledger
from xirang_platform.ledger.tables import ledger_registry
from xirang_platform.scheduling.model import Allocation, GpuSlice, NodeShare, Placement, Request, Tier

DEFAULT_PG = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"


def postgres_base_url() -> str:
    """The PostgreSQL server the tests use: `XIRANG_TEST_POSTGRES_URL`, else 127.0.0.1:5432."""
    return os.environ.get("XIRANG_TEST_POSTGRES_URL", DEFAULT_PG)


def with_search_path(url: str, schema: str) -> str:
    """`url` with every connection's search_path set to `schema`."""
    return make_url(url).update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(hide_password=False)


def new_schema(admin: Engine, prefix: str = "xirang_ledger_test") -> str:
    """Create a fresh, uniquely named schema and return its name."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{name}"'))
    return name


def drop_schema(admin: Engine, name: str) -> None:
    """Drop a schema made by `new_schema`, with everything in it."""
    with admin.begin() as conn:
        conn.execute(text(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))


def wipe(ledger: Ledger) -> None:
    """Empty every ledger table (children first): a clean ledger without re-migrating."""
    with ledger.engine.begin() as conn:
        for table in reversed(ledger_registry.metadata.sorted_tables):
            conn.execute(delete(table))


class Ticker:
    """A deterministic clock: 1000.0, 1001.0, ... one second per call."""

    def __init__(self, start: float = 1000.0) -> None:
        self._next = itertools.count()
        self.start = start

    def __call__(self) -> float:
        return self.start + next(self._next)


class SetClock:
    """A clock the test sets: `clock.t = ...` before each ledger operation."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def dump(ledger: Ledger) -> dict[str, list[tuple]]:
    """Every row of every ledger table, in key order: compared whole to prove nothing changed."""
    out = {}
    with ledger.engine.connect() as conn:
        for table in ledger_registry.metadata.sorted_tables:
            out[table.name] = [tuple(r) for r in conn.execute(select(table).order_by(*table.primary_key.columns))]
    return out


def alloc(
    rid: str,
    tenant: str = "acme",
    project: str = "vision",
    tier: Tier = Tier.OFFLINE_TRAINING,
    gpus: int = 1,
    milli: int = 1000,
    node: str = "n0",
    borrowed: bool = False,
    start: float = 0.0,
) -> Allocation:
    """An admitted allocation with safe defaults: one whole GPU of offline training for acme/vision
    on node `node` (GPUs 0, 1, ...), as a cycle returns it (unconfirmed)."""
    request = Request(rid, tenant, project, tier, submit_time=0.0, gpus=gpus, milli_per_gpu=milli)
    placement = Placement(tuple(GpuSlice(node, g, milli) for g in range(gpus)), (NodeShare(node, 0, 0),))
    return Allocation(request, placement, start=start, borrowed=borrowed, confirmed=False)
