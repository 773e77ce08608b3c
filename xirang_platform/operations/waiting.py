"""The runs waiting behind the closed gate, read from the Dagster instance for the exporter and the
queue view: who asks, in which tier, why it is held and since when."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dagster import DagsterInstance

from xirang_platform.control import run_tags as rt
from xirang_platform.dagster_compat import held_filter


@dataclass(frozen=True)
class WaitingRun:
    """One run behind the closed gate."""

    run_id: str
    tenant: str
    project: str
    tier: str
    hold_reason: str  # the run's `xirang/hold-reason` text
    since: float  # its original submit time (a resumption keeps its parent's), Unix seconds
    tags: dict[str, str]

    @property
    def hold_kind(self) -> str:
        """The hold text's kind (`quota`, `capacity`, ...; `other` for a text of no known kind)."""
        return hold_kind(self.hold_reason)


def hold_kind(text: str) -> str:
    """What kind of hold a `xirang/hold-reason` text names (`run_tags.HOLD_KINDS`, a bounded label set
    for metrics), `other` for a text of no known kind."""
    return rt.hold_kind(text) or "other"


def waiting_run(run_id: str, tags: Mapping[str, str], created: float) -> WaitingRun:
    """One gated run as the queue view reads it from its tags; `created`: when Dagster created it (its
    wait starts there unless its `xirang/submit-time` says otherwise)."""
    return WaitingRun(
        run_id,
        tags.get(rt.TENANT, ""),
        tags.get(rt.PROJECT, ""),
        tags.get(rt.TIER, ""),
        tags.get(rt.HOLD_REASON, ""),
        _float(tags.get(rt.SUBMIT_TIME)) or created,
        dict(tags),
    )


def waiting_runs(instance: DagsterInstance) -> list[WaitingRun]:
    """Every queued run behind the closed gate, oldest first (then by run id)."""
    records = instance.get_run_records(held_filter())
    out = [waiting_run(r.dagster_run.run_id, r.dagster_run.tags, r.create_timestamp.timestamp()) for r in records]
    return sorted(out, key=lambda w: (w.since, w.run_id))


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None
