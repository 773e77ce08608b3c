"""The pool's milli that stayed free over a recent span, rebuilt from the allocations' reserve and
release times (`Ledger.lasting_free`): what elastic runs may grow into (DESIGN.md section 11).
Every test runs on SQLite and on PostgreSQL."""

from __future__ import annotations

import pytest

from tests.ledger.ledger_helpers import SetClock, alloc, wipe
from xirang_platform.ledger import Ledger

CAPACITY = 16_000


@pytest.mark.parametrize(
    ("now", "span_s", "want"),
    [
        pytest.param(1090.0, 80.0, 12_000, id="4 GPUs held all span long: 12 free throughout"),
        pytest.param(1250.0, 100.0, 10_000, id="6 held for part of the span, 4 released since: the least is 10"),
        pytest.param(1400.0, 100.0, 14_000, id="only the 2 of the second run held in the span"),
        pytest.param(1250.0, 1000.0, 10_000, id="a span from before the first reservation: the least of all of it"),
    ],
)
def test_lasting_free_is_the_least_free_milli_over_the_span(
    backend_url: str, now: float, span_s: float, want: int
) -> None:
    clock = SetClock(1000.0)
    ledger = Ledger(backend_url, clock=clock, migrate=False)
    try:
        wipe(ledger)
        ledger.add_tenant("acme", 16_000)
        ledger.add_project("acme", "vision")
        clock.t = 1000.0
        ledger.reserve(alloc("a", gpus=4, node="n0"))
        clock.t = 1100.0
        ledger.reserve(alloc("b", gpus=2, node="n1"))
        clock.t = 1200.0
        ledger.release("a")
        assert ledger.lasting_free(now, span_s, CAPACITY) == want
    finally:
        ledger.close()
