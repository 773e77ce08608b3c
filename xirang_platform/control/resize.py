"""An elastic run's resize on the live platform (DESIGN.md section 11): what the run is told, the
tags that record it, and when its allocation waits for its resumption. No Dagster here: the tick
(`sensors/scheduling_tick.py`, `sensors/notices.py`), reconcile and the release sensors read the same
rules.

A resize is the preemption notice, a checkpoint and a restart at the new size (TorchElastic's model):

1. the cycle's `Resize` is written to the ledger (`ledger/resizes.py`): the allocation of the new
   size is reserved under the run's id;
2. the run gets its notice (`xirang/notice`, with the grace of the preemptor's tier for a shrink, of
   its own tier for a grow), `xirang/resize` (old and new size), `xirang/size-history` and
   `xirang/resume=pending`, and is terminated through Dagster; it saves a checkpoint and ends;
3. its resumption (the resume sensors) claims it: the coordinator hands it the new allocation
   (`ledger/preemptions.claim_resumption`) and copies the size history; the tick's reconcile opens
   its gate with the ledger's placement (the local launcher's `CUDA_VISIBLE_DEVICES` of the new
   GPUs), and it resumes from its lineage's checkpoint at the new world size.

Between 2 and 3 the allocation belongs to no live run: reconcile and the release sensors keep it
while the run `awaits_resumption`, and release it once the run's resumption was requested elsewhere
or cannot come (the run succeeded).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from xirang_platform.control import run_tags as rt
from xirang_platform.control.notice import Notice, PreemptionGrace
from xirang_platform.scheduling.model import Resize, ResizeKind, Tier

SUCCEEDED = "SUCCESS"  # a run that finished has nothing left to resume


@dataclass(frozen=True)
class ResizeRecord:
    """What `xirang/resize` says on a resized run: its size before and after, which way, for whom
    (a shrink's preemptor), why and when."""

    old_gpus: int
    new_gpus: int
    kind: str
    by: str
    reason: str
    at: float

    @classmethod
    def of(cls, r: Resize) -> ResizeRecord:
        """The record of the cycle's decision `r`."""
        reason = r.reason.value if r.reason is not None else ""
        return cls(r.old.request.gpus, r.new.request.gpus, r.kind.value, r.by or "", reason, r.at)

    def tag(self) -> str:
        """The `xirang/resize` value."""
        return json.dumps(
            {
                "old_gpus": self.old_gpus,
                "new_gpus": self.new_gpus,
                "kind": self.kind,
                "by": self.by,
                "reason": self.reason,
                "at": self.at,
            },
            sort_keys=True,
        )

    def why(self) -> str:
        """One line for people: `resized from 4 to 8 GPUs (grow)`, naming a shrink's preemptor."""
        whom = f" for run {self.by}" + (f" ({self.reason})" if self.reason else "") if self.by else ""
        return f"resized from {self.old_gpus} to {self.new_gpus} GPUs ({self.kind}){whom}"


def grace_for(r: Resize, grace: PreemptionGrace, tiers: Mapping[str, Tier]) -> float:
    """The grace the resized run gets: its preemptor's tier's for a shrink (`tiers`: the tier of
    each request of the cycle), its own tier's for a grow (nobody waits for its units)."""
    if r.kind is ResizeKind.SHRINK and r.by is not None and r.by in tiers:
        return grace.for_tier(tiers[r.by])
    return grace.for_tier(r.old.request.tier)


def notice_of(r: Resize, grace_s: float, now: float) -> Notice:
    """The notice the resized run gets (`xirang/notice`): the grace's end is when it is killed."""
    return Notice(r.by or "the scheduler", f"resize-{r.kind.value}", grace_s, now)


def notice_message(r: Resize, notice: Notice) -> str:
    """The notice as the resized run's event log shows it."""
    return (
        f"resize notice: {ResizeRecord.of(r).why()}; save a checkpoint and stop within the grace of "
        f"{notice.grace_s:g} s: the platform resumes this run's work at {r.new.request.gpus} GPUs"
    )


def size_history(tags: Mapping[str, str], r: Resize) -> str:
    """The run's sizes so far with the new one (`4,8,6`): its `xirang/size-history`, else its size now."""
    before = tags.get(rt.SIZE_HISTORY) or str(r.old.request.gpus)
    return f"{before},{r.new.request.gpus}"


def resize_tags(tags: Mapping[str, str], r: Resize, notice: Notice) -> dict[str, str]:
    """The tags the tick writes on a run it resizes (`tags`: the run's own): the record, the size
    history, the notice, and its resumption pending."""
    return {
        rt.RESIZE: ResizeRecord.of(r).tag(),
        rt.SIZE_HISTORY: size_history(tags, r),
        rt.NOTICE: notice.tag(),
        rt.PREEMPTED_BY: ResizeRecord.of(r).why(),
        rt.RESUME: rt.RESUME_PENDING,
    }


def awaits_resumption(status: str, tags: Mapping[str, str]) -> bool:
    """Whether a resized run's allocation is held for its resumption: the run was resized, its
    resumption is still to be requested, and it did not finish its work (Dagster's `status` name)."""
    return bool(tags.get(rt.RESIZE)) and tags.get(rt.RESUME) == rt.RESUME_PENDING and status != SUCCEEDED


def inherited_history(parent_tags: Mapping[str, str]) -> dict[str, str]:
    """What a resumption of a resized run carries of it: its size history (none for a run never resized)."""
    history = parent_tags.get(rt.SIZE_HISTORY, "")
    return {rt.SIZE_HISTORY: history} if parent_tags.get(rt.RESIZE) and history else {}
