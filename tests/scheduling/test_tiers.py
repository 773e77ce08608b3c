"""The tier table lives in one place (`scheduling/tiers.py`) and says what DESIGN.md section 4 says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

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
