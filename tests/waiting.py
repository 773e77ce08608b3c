"""Wait on a condition, never on the clock: the tests' one polling helper.

A test that needs something to have happened (a replica answered, a run ended, a scrape landed)
polls for it with `wait_for` instead of sleeping a guessed time and asserting. The guard only stops
a hung test: it asserts no timing, so it is generous, and its failure says what was awaited and what
was last seen.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_for(
    what: str,
    probe: Callable[[], T],
    done: Callable[[T], Any] = bool,
    guard_s: float = 120.0,
    every_s: float = 0.1,
) -> T:
    """Poll `probe()` every `every_s` until `done(value)` holds (by default: until the value is truthy)
    and return that value. A probe raising `OSError` (a server not listening yet) has not seen it yet.
    Past `guard_s` it fails naming `what` and the last value seen."""
    start = time.monotonic()
    while True:
        try:
            value = probe()
        except OSError as error:
            last: object = error
        else:
            if done(value):
                return value
            last = value
        if time.monotonic() - start > guard_s:
            raise AssertionError(f"still waiting for {what} after {guard_s:.0f} s; last seen: {last!r:.500}")
        time.sleep(every_s)
