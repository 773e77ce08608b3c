"""The tick's run-tag writes in one storage transaction (what Dagster's `add_run_tags` does, for many runs).

Dagster writes tags one run at a time: `DagsterInstance.add_run_tags` opens a connection, reads the
run, rewrites its body and its tag rows and commits (on SQLite a new connection and a disk sync per
call), so a tick that admits many runs spent seconds there before the last gate opened (figures:
docs/design-notes.md, record D5). `write_run_tags` does the same writes for every run of a tick in
one connection and one transaction: the admitted runs' placements and open gates, the held runs'
hold reasons. All gates of a tick open together, so the queue daemon sees them at once and launches
them in priority order.

It writes Dagster's own tables through Dagster's storage objects (the run storage's connection, its
table definitions), statement for statement as `SqlRunStorage.add_run_tags` (Dagster 1.13.27,
pinned in pyproject.toml) does; `tests/dagster/test_run_writes.py` checks that both give the same runs, on
SQLite and on PostgreSQL. A run storage that is not SQL (none ships with Dagster) gets one
`add_run_tags` per run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dagster import DagsterRun, DagsterRunStatus
from dagster._core.storage.legacy_storage import LegacyRunStorage
from dagster._core.storage.runs.schema import RunsTable, RunTagsTable
from dagster._core.storage.runs.sql_run_storage import SqlRunStorage
from dagster._core.storage.sqlalchemy_compat import db_fetch_mappings, db_select
from dagster._core.storage.tags import PARTITION_NAME_TAG, PARTITION_SET_TAG
from dagster._serdes import deserialize_value, serialize_value
from dagster._time import get_current_datetime


def write_run_tags(instance: Any, tags_by_run: Mapping[str, Mapping[str, str]]) -> list[str]:
    """Add `tags_by_run[run_id]` to each run (new keys added, existing keys overwritten), in one
    transaction where the run storage is SQL. Returns the ids written, sorted; a run that no longer
    exists (deleted since the tick read it) is skipped."""
    wanted = {rid: dict(tags) for rid, tags in tags_by_run.items() if tags}
    if not wanted:
        return []
    storage = sql_run_storage(instance)
    if storage is None:
        written = [rid for rid in sorted(wanted) if instance.has_run(rid)]
        for rid in written:
            instance.add_run_tags(rid, wanted[rid])
        return written
    with storage.connect() as conn:
        rows = db_fetch_mappings(
            conn,
            db_select([RunsTable.c.run_id, RunsTable.c.run_body, RunsTable.c.status]).where(
                RunsTable.c.run_id.in_(sorted(wanted))
            ),
        )
        runs = {
            row["run_id"]: deserialize_value(row["run_body"], DagsterRun).with_status(DagsterRunStatus(row["status"]))
            for row in rows
        }
        now = get_current_datetime()
        added = []
        for rid in sorted(runs):
            current = dict(runs[rid].tags or {})
            new = wanted[rid]
            merged = {**current, **new}
            conn.execute(
                RunsTable.update()
                .where(RunsTable.c.run_id == rid)
                .values(
                    run_body=serialize_value(runs[rid].with_tags(merged)),
                    partition=merged.get(PARTITION_NAME_TAG),
                    partition_set=merged.get(PARTITION_SET_TAG),
                    update_timestamp=now,
                )
            )
            for key, value in sorted(new.items()):
                if key in current:
                    conn.execute(
                        RunTagsTable.update()
                        .where((RunTagsTable.c.run_id == rid) & (RunTagsTable.c.key == key))
                        .values(value=value)
                    )
                else:
                    added.append({"run_id": rid, "key": key, "value": value})
        if added:
            conn.execute(RunTagsTable.insert(), added)
    return sorted(runs)


def sql_run_storage(instance: Any) -> SqlRunStorage | None:
    """The instance's SQL run storage (SQLite or PostgreSQL, unwrapped from a `storage:` config), else None."""
    storage = getattr(instance, "run_storage", None)
    if isinstance(storage, LegacyRunStorage):
        storage = storage._storage.run_storage  # noqa: SLF001 (the wrapper exposes no accessor)
    return storage if isinstance(storage, SqlRunStorage) else None
