"""The runs waiting behind the closed gate, read from the Dagster instance for the exporter and the
queue view: who asks, in which tier, why it is held and since when."""

from __future__ import annotations

from dataclasses import dataclass

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from xirang_platform.platform import run_tags as rt

# The kinds a hold text starts with (`tick_plan.hold_text`, the coordinator's and reconcile's texts):
# a bounded label set for metrics. Any other text counts as `other`.
HOLD_KINDS = ("capacity", "quota", "queued", "reconcile", "reserved")


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
    """What kind of hold a `xirang/hold-reason` text names: the word before its first `:`."""
    head = text.split(":", 1)[0].strip()
    return head if ":" in text and head in HOLD_KINDS else "other"


def waiting_runs(instance: DagsterInstance) -> list[WaitingRun]:
    """Every queued run behind the closed gate, oldest first (then by run id)."""
    records = instance.get_run_records(RunsFilter(statuses=[DagsterRunStatus.QUEUED], tags={rt.GATE: rt.GATE_CLOSED}))
    out = []
    for record in records:
        tags = dict(record.dagster_run.tags)
        since = _float(tags.get(rt.SUBMIT_TIME)) or record.create_timestamp.timestamp()
        out.append(
            WaitingRun(
                record.dagster_run.run_id,
                tags.get(rt.TENANT, ""),
                tags.get(rt.PROJECT, ""),
                tags.get(rt.TIER, ""),
                tags.get(rt.HOLD_REASON, ""),
                since,
                tags,
            )
        )
    return sorted(out, key=lambda w: (w.since, w.run_id))


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None
