"""`tests/waiting.wait_for`: the value once the condition holds; past its guard, what it waited for and
what it last saw."""

from __future__ import annotations

import itertools

import pytest

from tests.waiting import wait_for


def test_the_value_that_met_the_condition_is_returned() -> None:
    counter = itertools.count()
    assert wait_for("the count to reach 3", lambda: next(counter), done=lambda n: n >= 3, every_s=0) == 3


def test_a_truthy_value_meets_the_default_condition() -> None:
    answers = iter([[], [], ["ready"]])
    assert wait_for("a listed endpoint", lambda: next(answers), every_s=0) == ["ready"]


def test_a_probe_raising_oserror_has_not_seen_it_yet() -> None:
    answers = iter([ConnectionRefusedError("not listening"), "up"])

    def probe() -> str:
        answer = next(answers)
        if isinstance(answer, OSError):
            raise answer
        return answer

    assert wait_for("the server", probe, every_s=0) == "up"


def refusing() -> int:
    """A server that never listens."""
    raise ConnectionRefusedError("not listening")


@pytest.mark.parametrize(
    ("probe", "message"),
    [
        pytest.param(
            lambda: 2,
            "still waiting for the count to reach 3 after 0 s; last seen: 2",
            id="a value that never meets the condition is named",
        ),
        pytest.param(
            refusing,
            "still waiting for the count to reach 3 after 0 s; last seen: ConnectionRefusedError('not listening')",
            id="an error the probe kept raising is named",
        ),
    ],
)
def test_past_its_guard_it_fails_with_what_it_last_saw(probe, message: str) -> None:
    with pytest.raises(AssertionError) as failure:
        wait_for("the count to reach 3", probe, done=lambda n: n >= 3, guard_s=0.0, every_s=0)
    assert str(failure.value) == message
