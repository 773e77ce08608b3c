"""The tier table lives in one place (`scheduling/tiers.py`) and says what DESIGN.md section 4 says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from xirang_platform.scheduling.config import SchedulerConfig
from xirang_platform.scheduling.tiers import TIER_RULES, Tier, tier_table_markdown

DESIGN = Path(__file__).resolve().parents[2] / "docs" / "DESIGN.md"


def design_tier_table() -> str:
    """The table under DESIGN.md's `## 4. Tiers` heading, as its lines."""
    text = DESIGN.read_text(encoding="utf-8")
    section = text.split("## 4. Tiers", 1)[1].split("\n## ", 1)[0]
    return "\n".join(line for line in section.splitlines() if line.startswith("|"))


def test_the_rendered_tier_table_is_design_md_section_4() -> None:
    assert tier_table_markdown() == design_tier_table()


@pytest.mark.parametrize(
    ("tier", "level", "borrowed", "preemptible"),
    [
        pytest.param(Tier.INFERENCE, "P0", False, False, id="P0 in quota: never preempted"),
        pytest.param(Tier.INFERENCE, "P0", True, False, id="P0 borrowed (cannot happen): still never"),
        pytest.param(Tier.ONLINE_TRAINING, "P1", False, False, id="P1 in quota: kept"),
        pytest.param(Tier.ONLINE_TRAINING, "P1", True, True, id="P1 borrowed part: preemptible"),
        pytest.param(Tier.OFFLINE_TRAINING, "P2", False, True, id="P2 offline: preemptible"),
        pytest.param(Tier.BATCH_INFERENCE, "P2", True, True, id="P2 batch inference: preemptible"),
    ],
)
def test_who_may_be_preempted(tier: Tier, level: str, borrowed: bool, preemptible: bool) -> None:
    rules = tier.rules
    assert rules.level == level
    assert rules.preemptible_when(borrowed) is preemptible


def test_the_flags_match_the_table_words() -> None:
    for tier, rules in TIER_RULES.items():
        assert rules.may_borrow == (rules.borrow_text == "yes"), tier
        assert rules.single_node == ("per replica" in rules.placement), tier
        assert rules.whole_gpus == ("whole GPUs of one model" in rules.placement and not rules.mixed_fallback), tier
        assert rules.mixed_fallback == bool(re.search(r"heterogeneous mix", rules.placement)), tier


@pytest.mark.parametrize(
    ("by_level", "tier", "seconds"),
    [
        pytest.param(None, Tier.INFERENCE, 0.0, id="default: P0 preempts without waiting for victims to age"),
        pytest.param(None, Tier.ONLINE_TRAINING, 1800.0, id="default: P1 waits out min_runtime_s"),
        pytest.param(None, Tier.OFFLINE_TRAINING, 1800.0, id="default: P2 (past its cap it never preempts) too"),
        pytest.param((), Tier.INFERENCE, 1800.0, id="no per-tier entries: one minimum runtime for every tier"),
        pytest.param((("P1", 300.0),), Tier.ONLINE_TRAINING, 300.0, id="an entry replaces it for its level"),
        pytest.param((("P1", 300.0),), Tier.BATCH_INFERENCE, 1800.0, id="other levels keep min_runtime_s"),
    ],
)
def test_minimum_runtime_is_read_per_preemptor_tier(
    by_level: tuple[tuple[str, float], ...] | None, tier: Tier, seconds: float
) -> None:
    config = SchedulerConfig(min_runtime_s=1800.0)
    if by_level is not None:
        config = SchedulerConfig(min_runtime_s=1800.0, min_runtime_by_level=by_level)
    assert config.min_runtime_for(tier.rules) == seconds
    assert seconds in config.min_runtimes()


@pytest.mark.parametrize(
    ("by_level", "message"),
    [
        pytest.param((("P3", 0.0),), "unknown tier level 'P3'", id="unknown level named"),
        pytest.param((("P0", -1.0),), "P0 must be >= 0 seconds", id="negative seconds"),
    ],
)
def test_a_bad_per_tier_minimum_runtime_is_refused(by_level: tuple[tuple[str, float], ...], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        SchedulerConfig(min_runtime_by_level=by_level)
