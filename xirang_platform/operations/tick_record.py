"""The scheduling tick's step durations, kept in the Dagster instance for the exporter to read.

The exporter is a process of its own (DESIGN.md section 10), so the tick cannot hand it a histogram
in memory. Each tick adds its step durations (`TickReport.steps_ms`) to one cumulative histogram per
step, stored as one JSON value in the instance's daemon cursor storage (the `kvs` table of its run
storage: SQLite or PostgreSQL, whichever the instance uses), so every process of the deployment sees
it and it survives restarts. One tick writes at a time (the ledger's lease), so the read-modify-write
cannot lose an update to another tick.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from dagster import DagsterInstance

KEY = "xirang/tick-step-durations"
# Upper bounds in seconds (Prometheus' `le`): a tick step takes milliseconds to seconds.
BUCKETS_S: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

_logger = logging.getLogger("xirang.ops")


@dataclass
class StepHistogram:
    """One step's durations: a count per bucket of `BUCKETS_S` (not cumulative) and one past the last
    bound, their sum in seconds and how many."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS_S) + 1))
    sum_s: float = 0.0

    @property
    def count(self) -> int:
        """How many durations were observed."""
        return sum(self.counts)

    def observe(self, seconds: float) -> None:
        """Add one duration."""
        index = next((i for i, bound in enumerate(BUCKETS_S) if seconds <= bound), len(BUCKETS_S))
        self.counts[index] += 1
        self.sum_s += seconds

    def cumulative(self) -> list[tuple[str, int]]:
        """(`le`, cumulative count) pairs, the last `+Inf`, as Prometheus' histogram buckets read."""
        out, total = [], 0
        for bound, n in zip((*BUCKETS_S, math.inf), self.counts, strict=True):
            total += n
            out.append(("+Inf" if bound == math.inf else f"{bound:g}", total))
        return out


def read_histograms(instance: DagsterInstance) -> dict[str, StepHistogram]:
    """Per step name (sorted), the durations every tick so far recorded in `instance`."""
    raw = instance.daemon_cursor_storage.get_cursor_values({KEY}).get(KEY)
    return _decode(raw) if raw else {}


def record_steps(instance: DagsterInstance, steps_ms: Mapping[str, float]) -> None:
    """Add one tick's step durations (milliseconds, as `TickReport.steps_ms`) to `instance`'s histograms.

    Metrics never fail the tick: a storage error is logged and the tick goes on."""
    try:
        histograms = read_histograms(instance)
        for step, ms in steps_ms.items():
            histograms.setdefault(step, StepHistogram()).observe(ms / 1000)
        instance.daemon_cursor_storage.set_cursor_values({KEY: _encode(histograms)})
    except Exception as e:  # noqa: BLE001 -- the tick's own work is done; its metrics must not undo it
        _logger.warning("tick step durations not recorded (%s: %s); the exporter shows the earlier ones", type(e), e)


def _encode(histograms: Mapping[str, StepHistogram]) -> str:
    doc = {
        "buckets": list(BUCKETS_S),
        "steps": {s: {"counts": h.counts, "sum_s": h.sum_s} for s, h in sorted(histograms.items())},
    }
    return json.dumps(doc, sort_keys=True)


def _decode(raw: str) -> dict[str, StepHistogram]:
    doc = json.loads(raw)
    if tuple(doc.get("buckets", ())) != BUCKETS_S:
        # Written with other bounds (an older release): the counts cannot be rebucketed; start again.
        return {}
    return {
        step: StepHistogram(list(h["counts"]), float(h["sum_s"])) for step, h in sorted(doc.get("steps", {}).items())
    }
