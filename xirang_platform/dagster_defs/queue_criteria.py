"""What Dagster's queue-criteria dialog says of a held run (DESIGN.md sections 7 and 10).

Dagster shows no events for a queued run. Its page and the runs list offer "View queue criteria": a
dialog listing the run's priority and every tag concurrency limit whose key and value match a tag
of the run, each with its limit. The coordinator's queue config (`get_run_queue_config`, read by the
queue daemon every dequeue iteration and by the webserver for that dialog) makes the list explain
the wait:

- **the gate**: one limit-0 entry per closed value of `xirang/gate` (`run_tags.CLOSED_GATES`, a fixed
  vocabulary: the hold kinds), so the dialog shows `xirang/gate="capacity"` and the daemon keeps
  every closed value queued; `open` is in no entry and launches. The gate alone holds the run.
- **the queue tags** (`QUEUE_TAGS`: the hold reason in full, the run's position in its tier, its
  estimated start): one limit-0 entry per value the scheduling tick last wrote on a held run, so the
  dialog shows them too. They only explain: the tick blanks them in the same transaction that opens
  a gate, and a blank value is never listed, so they never keep an admitted run queued; a value the
  list misses for a moment (written after the daemon read the list) holds nothing the gate does not.

The tick records those values (`record_queue_values`) in the instance's cursor storage, as one JSON
value (`operations/tick_record.py` keeps its histograms there too), for the first `EXPLAINED_PER_TIER` runs
of each tier, which bounds the list the webserver sends to the dialog (Dagster writes it as YAML on
every request). A held run further back still carries its tags; the dialog then shows its gate.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from dagster import DagsterInstance

from xirang_platform.control import run_tags as rt

KEY = "xirang/queue-criteria"
QUEUE_TAGS = (rt.HOLD_REASON, rt.POSITION, rt.ESTIMATED_START)
EXPLAINED_PER_TIER = 100

_logger = logging.getLogger("xirang.coordinator")


def gate_limits() -> list[dict[str, Any]]:
    """A limit of 0 for every closed gate value: Dagster's queue daemon never launches a run behind one."""
    return [{"key": rt.GATE, "value": value, "limit": 0} for value in rt.CLOSED_GATES]


def queue_limits(instance: DagsterInstance) -> list[dict[str, Any]]:
    """A limit of 0 for every queue tag value the tick last recorded, by `QUEUE_TAGS` order, then value.
    Never raises: they only explain, so a storage error leaves them out (the gate still holds)."""
    try:
        raw = instance.daemon_cursor_storage.get_cursor_values({KEY}).get(KEY)
        values = _decode(raw) if raw else {}
    except Exception as e:  # noqa: BLE001 -- the daemon's dequeue must not fail for want of an explanation
        _logger.warning("queue criteria not read (%s: %s); the dialog shows the gates only", type(e).__name__, e)
        return []
    return [{"key": key, "value": value, "limit": 0} for key in QUEUE_TAGS for value in values.get(key, ())]


def queue_values(held: Mapping[str, Mapping[str, str]]) -> dict[str, list[str]]:
    """Per queue tag, the sorted distinct non-blank values of `held` (run id -> its queue tags)."""
    return {key: sorted({tags[key] for tags in held.values() if tags.get(key)}) for key in QUEUE_TAGS}


def record_queue_values(instance: DagsterInstance, held: Mapping[str, Mapping[str, str]]) -> bool:
    """Record the queue tag values of `held` (run id -> its queue tags: the runs the dialog explains)
    for `queue_limits`, unless they are recorded already. Returns whether it wrote; a storage error is
    logged, never raised (the tick's own work is done)."""
    encoded = json.dumps(queue_values(held), sort_keys=True)
    try:
        storage = instance.daemon_cursor_storage
        if storage.get_cursor_values({KEY}).get(KEY) == encoded:
            return False
        storage.set_cursor_values({KEY: encoded})
    except Exception as e:  # noqa: BLE001 -- an explanation missing must not undo the tick
        _logger.warning("queue criteria not recorded (%s: %s); the dialog shows the earlier ones", type(e).__name__, e)
        return False
    return True


def _decode(raw: str) -> dict[str, list[str]]:
    doc = json.loads(raw)
    return {key: [v for v in doc.get(key, []) if isinstance(v, str) and v] for key in QUEUE_TAGS}
