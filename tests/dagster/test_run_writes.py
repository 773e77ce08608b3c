"""`write_run_tags` leaves the runs as Dagster's own `add_run_tags` would, one run at a time, on
SQLite and on dagster-postgres: the run's tags, its tag rows (what tag filters query), its partition
columns; a run deleted meanwhile is skipped, the others are written."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance, DagsterRun, RunsFilter, instance_for_test

from tests.dagster.engine_harness import fresh_postgres_database, storage_overrides
from xirang_platform.dagster_compat import PARTITION_NAME_TAG, sql_run_storage, write_run_tags

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
START = {"a": {"xirang/gate": "closed", "owner": "me"}, "b": {"xirang/gate": "closed"}, "c": {}}


@pytest.fixture(params=BACKENDS)
def instances(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[DagsterInstance, DagsterInstance]]:
    """Two empty instances on the backend: one written with `write_run_tags`, one with `add_run_tags`."""
    with contextlib.ExitStack() as stack:
        pair = []
        for name in ("batched", "one-by-one"):
            url = stack.enter_context(fresh_postgres_database()) if request.param == "postgres" else None
            (tmp_path / name).mkdir()
            overrides = storage_overrides(request.param, url)
            pair.append(stack.enter_context(instance_for_test(overrides=overrides, temp_dir=str(tmp_path / name))))
        yield pair[0], pair[1]


def add_runs(instance: DagsterInstance) -> None:
    for rid, tags in START.items():
        instance.add_run(DagsterRun(job_name="job", run_id=rid, tags=tags))


def state(instance: DagsterInstance) -> dict[str, Any]:
    """What a reader of the runs sees: each run's tags, and which runs each tag filter finds."""
    runs = {r.run_id: dict(r.tags) for r in instance.get_runs()}
    found = {
        f"{k}={v}": sorted(r.run_id for r in instance.get_runs(RunsFilter(tags={k: v})))
        for tags in runs.values()
        for k, v in tags.items()
    }
    partitions = sorted((p.run_id, p.partition) for p in instance.get_run_partition_data(RunsFilter()))
    return {"tags": runs, "found": found, "partitions": partitions}


WRITES: list[Any] = [
    pytest.param({"a": {"xirang/gate": "open", "xirang/allocation": "{}"}}, id="overwrite one tag, add another"),
    pytest.param(
        {"a": {"xirang/hold-reason": "quota"}, "b": {"xirang/gate": "open"}, "c": {"x": "1"}}, id="three runs at once"
    ),
    pytest.param({"b": {PARTITION_NAME_TAG: "2026-11-30"}}, id="a partition tag fills the partition column"),
    pytest.param({"a": {}, "c": {"owner": ""}}, id="an empty write and an empty value"),
]


@pytest.mark.parametrize("writes", WRITES)
def test_a_batch_leaves_the_runs_as_add_run_tags_does(
    instances: tuple[DagsterInstance, DagsterInstance], writes: Mapping[str, Mapping[str, str]]
) -> None:
    batched, one_by_one = instances
    for instance in instances:
        add_runs(instance)

    written = write_run_tags(batched, writes)
    for rid, tags in writes.items():
        if tags:
            one_by_one.add_run_tags(rid, tags)

    assert sql_run_storage(batched) is not None  # the one-transaction path, not the fallback
    assert written == sorted(rid for rid, tags in writes.items() if tags)
    assert state(batched) == state(one_by_one)


def test_a_run_deleted_meanwhile_is_skipped_and_the_others_written(
    instances: tuple[DagsterInstance, DagsterInstance],
) -> None:
    instance, _ = instances
    add_runs(instance)
    instance.delete_run("b")

    written = write_run_tags(instance, {"a": {"xirang/gate": "open"}, "b": {"xirang/gate": "open"}})

    assert written == ["a"]
    assert instance.get_run_by_id("a").tags["xirang/gate"] == "open"  # type: ignore[union-attr]
    assert not instance.has_run("b")
