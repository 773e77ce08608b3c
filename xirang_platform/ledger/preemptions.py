"""What the ledger recorded of preempted requests: the record a resumption inherits from (DESIGN.md
section 7).

A preemption is the `preempt` entries of an allocation (written with its release, in one
transaction): the allocation row keeps the request as the cycle admitted it (its tenant, original
submit time, preemptions and reclaims so far), the entries say why (`details.reason`), for whom
(`details.by`) and when (`at`). Nothing a run carries can write these rows, so the coordinator and the
resume sensor trust them where they trust no run tag.

An elastic run's resize (DESIGN.md section 11) is recorded the same way, by the `resize` entries of
the row it released (`end_cause` `resize`): the run stops on its notice and its resumption takes over
the allocation of the new size, which the ledger holds for it under the resized run's id.

The one write here is a resumption's claim (`claim_resumption`): the first run to claim a
preemption is its resumption, and any other claim of it is refused, even one made at the same moment.
Claiming a resize also hands the new allocation over to the resumption (its request id becomes the
resumption's run id) in the same transaction.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, and_, insert, or_, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from xirang_platform.ledger.errors import LedgerError
from xirang_platform.ledger.placements import request_of
from xirang_platform.ledger.resizes import RESIZE_CAUSE
from xirang_platform.ledger.tables import ALLOCATIONS, ENTRIES, RESUMPTIONS, AllocState, EntryKind
from xirang_platform.scheduling.model import PreemptReason, Request

_CHUNK = 500  # request ids per IN list


@dataclass(frozen=True)
class PreemptionRecord:
    """One preemption the ledger recorded: the victim's request as admitted, why, by whom, when;
    `resized`: a resize of an elastic run (`reason` None for a grow), whose new allocation its
    resumption takes over."""

    request: Request
    reason: PreemptReason | None
    by: str
    at: float
    resized: bool = False

    def resumed(self) -> Request:
        """The victim's request as its resumption inherits it: one more preemption and, after a
        reclaim, its borrow back-off from `at` (`Request.requeued`); a resize keeps the lineage as it
        was (the run was not stopped for good, only restarted at another size)."""
        if self.resized or self.reason is None:
            return self.request
        return self.request.requeued(self.reason, self.at)


def preemption_records(engine: Engine, request_ids: Collection[str]) -> dict[str, PreemptionRecord]:
    """The latest preemption of each of `request_ids` (a `Ledger`'s `engine`); a request the ledger
    never preempted has none. `LedgerError` when the ledger cannot be read."""
    try:
        return _read(engine, sorted(set(request_ids)))
    except SQLAlchemyError as e:
        raise LedgerError(f"could not read the ledger's preemptions: {e}") from e


def claim_resumption(engine: Engine, victim: str, record: PreemptionRecord, run_id: str, now: float) -> bool:
    """Record `run_id` as the resumption of `victim`'s preemption `record`; whether it is (it claimed
    first, or claims again), False when another run claimed it before. `LedgerError` when the ledger
    cannot be written."""
    row = {"victim": victim, "preempted_at": record.at, "run_id": run_id, "claimed_at": now}
    try:
        with engine.begin() as conn:
            conn.execute(insert(RESUMPTIONS).values(**row))
            if record.resized:
                _hand_over(conn, victim, run_id)
        return True
    except IntegrityError:  # the row exists: whose claim is it?
        pass
    except SQLAlchemyError as e:
        raise LedgerError(f"could not record the resumption of preempted run {victim}: {e}") from e
    try:
        with engine.connect() as conn:
            claimed = conn.execute(
                select(RESUMPTIONS.c.run_id).where(
                    RESUMPTIONS.c.victim == victim, RESUMPTIONS.c.preempted_at == record.at
                )
            ).scalar_one_or_none()
    except SQLAlchemyError as e:
        raise LedgerError(f"could not read the resumption of preempted run {victim}: {e}") from e
    return claimed == run_id


def _hand_over(conn: Connection, victim: str, run_id: str) -> None:
    """The resized run's live allocation becomes its resumption's (none when it was released or
    preempted since: the resumption then waits in the queue like any other)."""
    conn.execute(
        update(ALLOCATIONS)
        .where(ALLOCATIONS.c.request_id == victim, ALLOCATIONS.c.state != AllocState.RELEASED.value)
        .values(request_id=run_id)
    )


def _read(engine: Engine, wanted: list[str]) -> dict[str, PreemptionRecord]:
    out: dict[str, PreemptionRecord] = {}
    with engine.connect() as conn:
        for start in range(0, len(wanted), _CHUNK):
            chunk = wanted[start : start + _CHUNK]
            query = (
                select(ALLOCATIONS, ENTRIES.c.at.label("preempted_at"), ENTRIES.c.details.label("preempt_details"))
                .join(ENTRIES, ENTRIES.c.allocation_id == ALLOCATIONS.c.id)
                .where(
                    ALLOCATIONS.c.request_id.in_(chunk),
                    ALLOCATIONS.c.state == AllocState.RELEASED.value,
                    or_(
                        ENTRIES.c.kind == EntryKind.PREEMPT.value,
                        and_(ENTRIES.c.kind == EntryKind.RESIZE.value, ENTRIES.c.amount < 0),  # the old size's
                    ),
                    ENTRIES.c.account == ALLOCATIONS.c.tenant,  # one entry per preemption: the tenant's
                )
                .order_by(ALLOCATIONS.c.id)
            )
            for row in conn.execute(query):
                details = json.loads(row.preempt_details or "{}")
                resized = row.end_cause == RESIZE_CAUSE
                reason = details.get("reason", None if resized else row.end_cause)
                out[row.request_id] = PreemptionRecord(  # later rows (ordered by id) replace earlier ones
                    request_of(row),
                    PreemptReason(reason) if reason is not None else None,
                    str(details.get("by", "")),
                    float(row.preempted_at),
                    resized,
                )
    return out
