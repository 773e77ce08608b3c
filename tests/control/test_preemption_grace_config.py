"""The grace a victim gets, per preemptor tier: the tier table's defaults (P0 15 s, P1 120 s), the
platform config's `preemption_grace_s` over them, and a bad value refused with the key and the fix."""

from __future__ import annotations

import pytest

from tests.control.platform_builders import GOOD
from xirang_platform.control.platform_config import PlatformConfigError, config_from_dict
from xirang_platform.scheduling.model import Tier


def graces(doc: dict) -> dict[str, float]:
    grace = config_from_dict({**GOOD, **doc}).grace
    return {t.value: grace.for_tier(t) for t in Tier}


@pytest.mark.parametrize(
    ("doc", "want"),
    [
        pytest.param(
            {},
            {"inference": 15.0, "online-training": 120.0, "offline-training": 120.0, "batch-inference": 120.0},
            id="defaults from the tier table: 15 s when a P0 preempts, 120 s for P1",
        ),
        pytest.param(
            {"preemption_grace_s": {"P0": 5, "P1": 60}},
            {"inference": 5.0, "online-training": 60.0, "offline-training": 120.0, "batch-inference": 120.0},
            id="a level overrides its tiers",
        ),
        pytest.param(
            {"preemption_grace_s": {"P2": 30, "batch-inference": 0}},
            {"inference": 15.0, "online-training": 120.0, "offline-training": 30.0, "batch-inference": 0.0},
            id="a tier value wins over its level; 0 stops at once",
        ),
    ],
)
def test_the_grace_comes_from_the_tier_table_and_the_config_overrides_it(doc: dict, want: dict) -> None:
    assert graces(doc) == want


def test_the_longest_grace_is_what_a_pod_is_given() -> None:
    assert config_from_dict(GOOD).grace.longest() == 120.0
    assert config_from_dict({**GOOD, "preemption_grace_s": {"P1": 300}}).grace.longest() == 300.0


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param({"P1": -5}, "preemption_grace_s.P1: grace must be a number of seconds >= 0", id="negative grace"),
        pytest.param(
            {"P7": 10}, "preemption_grace_s: unknown tier 'P7'; use a level or a tier of P0", id="unknown tier"
        ),
        pytest.param({"P0": "soon"}, "preemption_grace_s.P0: grace must be a number of seconds", id="not a number"),
        pytest.param({"P0": float("inf")}, "preemption_grace_s.P0: grace must be a number", id="infinite"),
        pytest.param([15, 120], "preemption_grace_s: expected a mapping of tier to seconds, e.g.", id="not a mapping"),
    ],
)
def test_a_bad_grace_is_refused_naming_the_key_and_the_fix(value: object, message: str) -> None:
    with pytest.raises(PlatformConfigError) as err:
        config_from_dict({**GOOD, "preemption_grace_s": value})
    assert message in str(err.value)
