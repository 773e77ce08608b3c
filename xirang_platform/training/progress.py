"""The progress lines rank 0 prints, one JSON object each after a fixed prefix, and their reading.

The launcher passes every other line of the workers' output to the run's log as it is; a progress
line is turned into a sentence (`describe`) and acted on (a checkpoint is reported to the pool, a
stop ends the run on its notice). Events, each with `step` (finished steps) and `world_size`:

- `start`: `first_step`, `total_steps`, `global_batch`, `shares` (each rank's rows of a full step),
  `learning_rate`, `backend`, `resumed` (whether a checkpoint was read);
- `checkpoint`: `epoch`, `reason` (`epoch` or `notice`), saved after `step`;
- `stopped`: on the notice, after the checkpoint of `step`; `steps_run` by this launch;
- `refused`: the checkpoint (of `step`) cannot be resumed with this run's settings: `problem` says why;
- `done`: the last step finished; `steps_run`, `loss` (the last epoch's mean training loss, None
  when this launch finished no epoch).
"""

from __future__ import annotations

import json
from typing import Any

PREFIX = "xirang-training "
EVENTS = ("start", "checkpoint", "stopped", "done", "refused")


def progress_line(event: str, **fields: Any) -> str:
    """The line that reports `event` with `fields` (JSON, keys sorted)."""
    if event not in EVENTS:
        raise ValueError(f"unknown progress event {event!r}; one of {', '.join(EVENTS)}")
    return PREFIX + json.dumps({"event": event, **fields}, sort_keys=True)


def read_progress(line: str) -> dict[str, Any] | None:
    """The event of a progress line, or None for any other line (a worker's warning, torchrun's own)."""
    if not line.startswith(PREFIX):
        return None
    try:
        doc = json.loads(line[len(PREFIX) :])
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and doc.get("event") in EVENTS else None


def describe(doc: dict[str, Any]) -> str:
    """A progress event as one sentence of the run's log."""
    event, step, world = doc["event"], doc["step"], doc["world_size"]
    if event == "start":
        where = f"resuming after step {step}" if doc["resumed"] else "starting"
        return (
            f"training on {world} worker(s) ({doc['backend']}): {where}, steps {doc['first_step']}.."
            f"{doc['total_steps']}; global batch {doc['global_batch']} as {doc['shares']} per rank, "
            f"learning rate {doc['learning_rate']:g}"
        )
    if event == "checkpoint":
        why = "on the preemption notice" if doc["reason"] == "notice" else f"after epoch {doc['epoch']}"
        return f"checkpoint of step {step} saved {why} (world size {world})"
    if event == "refused":
        return f"refused to resume: {doc['problem']}"
    if event == "stopped":
        return f"stopped on the notice after step {step}; {doc['steps_run']} step(s) run by this launch"
    loss = f", last epoch's mean loss {doc['loss']:.4f}" if doc.get("loss") is not None else ""
    return f"training done at step {step} ({doc['steps_run']} step(s) run here){loss}"
