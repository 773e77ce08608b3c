"""The tier table of DESIGN.md section 4, as data: every tier rule the scheduler applies is read here.

Placement, preemption, quota, the cycle and the event-log checker ask a tier's `rules` (single node,
whole GPUs, mixed fallback, may borrow, may preempt, preemptible when) instead of comparing tier
numbers. `tier_table_markdown()` renders the table as DESIGN.md prints it; a test compares the two.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Preemptible(StrEnum):
    """Which allocations of a tier may be preempted (the words are DESIGN.md's)."""

    NEVER = "never"
    BORROWED_PART = "only the part it borrowed"
    ALWAYS = "yes"


@dataclass(frozen=True)
class TierRules:
    """One row of the tier table, plus the flags the code reads.

    - `rank`: queue order (0 first); also the tier's number in P0/P1/P2.
    - `preemptible`: which of its allocations may be stopped.
    - `may_borrow`: past its cap it may run on idle units as borrowed work.
    - `may_preempt`: when it does not fit, it may plan a preemption for priority (and, past its own
      cap, stop its own tenant's preemptible work to get back under it); a tier without it only
      reclaims other tenants' borrowed work.
    - `single_node`: every request sits on one node (an inference replica), whatever its GPU count.
    - `whole_gpus`: a fraction of a GPU is placed on, and charged for, a whole GPU.
    - `mixed_fallback`: a gang that fits no (domain, model) group may take a mix of free GPUs.
    - `preemption_grace_s`: when a request of this tier preempts, how long each victim has between
      its notice and being killed, to save a checkpoint and stop (the platform config may override
      it, `notice.PreemptionGrace`); the preemptor's units wait for it that long at most.
    """

    rank: int
    order: str
    preemptible: Preemptible
    may_borrow: bool
    borrow_text: str
    may_preempt: bool
    single_node: bool
    whole_gpus: bool
    mixed_fallback: bool
    placement: str
    preemption_grace_s: float

    @property
    def level(self) -> str:
        """ "P0", "P1" or "P2"."""
        return f"P{self.rank}"

    def preemptible_when(self, borrowed: bool) -> bool:
        """Whether an allocation of this tier may be preempted, given whether it is borrowed."""
        if self.preemptible is Preemptible.BORROWED_PART:
            return borrowed
        return self.preemptible is Preemptible.ALWAYS


class Tier(StrEnum):
    """The tag values of `xirang/tier`."""

    INFERENCE = "inference"
    ONLINE_TRAINING = "online-training"
    OFFLINE_TRAINING = "offline-training"
    BATCH_INFERENCE = "batch-inference"

    @property
    def rules(self) -> TierRules:
        """This tier's row of the tier table."""
        return TIER_RULES[self]

    @property
    def rank(self) -> int:
        """0 for P0 (inference), 1 for P1 (online training), 2 for P2 (offline, batch): queue order."""
        return TIER_RULES[self].rank

    @property
    def may_borrow(self) -> bool:
        """Whether a request of this tier may run past its cap on idle units."""
        return TIER_RULES[self].may_borrow


P0 = TierRules(
    rank=0,
    order="first every cycle",
    preemptible=Preemptible.NEVER,
    may_borrow=False,
    borrow_text="no: must fit its tenant's cap",
    may_preempt=True,
    single_node=True,
    whole_gpus=False,
    mixed_fallback=False,
    placement=(
        "memory-fit per replica (GPU memory tracked per GPU), packed for density by the project's best "
        "single-node placement policy (the default, chosen by the placement benchmark across workload mixes; "
        "unit-rounding waste counts); any model at or above the requested compute level"
    ),
    preemption_grace_s=15.0,  # inference latency: a victim gets a short notice
)
P1 = TierRules(
    rank=1,
    order="second",
    preemptible=Preemptible.BORROWED_PART,
    may_borrow=True,
    borrow_text="yes",
    may_preempt=True,
    single_node=False,
    whole_gpus=True,
    mixed_fallback=False,
    placement=(
        "gang, all-or-nothing: whole GPUs of one model in one domain, fewest nodes; among models, the tier's "
        "preference order first (below)"
    ),
    preemption_grace_s=120.0,
)
P2 = TierRules(
    rank=2,
    order="last",
    preemptible=Preemptible.ALWAYS,
    may_borrow=True,
    borrow_text="yes",
    may_preempt=False,
    single_node=False,
    whole_gpus=False,
    mixed_fallback=True,
    placement="P1's rule when it fits, else a heterogeneous mix of free units",
    preemption_grace_s=120.0,  # P2 preempts only to reclaim borrowed units: nothing is urgent
)

TIER_RULES: dict[Tier, TierRules] = {
    Tier.INFERENCE: P0,
    Tier.ONLINE_TRAINING: P1,
    Tier.OFFLINE_TRAINING: P2,
    Tier.BATCH_INFERENCE: P2,
}

TIERS_IN_ORDER: tuple[TierRules, ...] = (P0, P1, P2)


def tiers_of(rules: TierRules) -> tuple[Tier, ...]:
    """The tag values that share one row of the table, in declaration order."""
    return tuple(t for t in Tier if TIER_RULES[t] is rules)


def tier_table_markdown() -> str:
    """The tier table as DESIGN.md section 4 prints it (header, separator, one row per level)."""
    lines = [
        "| tier | tag value | order | preemptible | may borrow | placement |",
        "|---|---|---|---|---|---|",
    ]
    for rules in TIERS_IN_ORDER:
        tags = ", ".join(f"`{t.value}`" for t in tiers_of(rules))
        row = (rules.level, tags, rules.order, rules.preemptible.value, rules.borrow_text, rules.placement)
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)
