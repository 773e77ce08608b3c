"""An elastic training run end to end (DESIGN.md section 11) with real processes: each code location
in its own gRPC code server, every run a process of its own under Dagster's `DefaultRunLauncher`, the
scheduler core's cycle in the platform's tick, and Dagster's own sensor and queue daemon iterations.

research runs two blockers (8 and 7 H100s) and an elastic data-parallel training of 1 to 2 H100s
(`engine_defs.elastic_train`: `torchrun`, one worker per GPU, a pause after each epoch): it is
admitted at 1, the one H100 left. When the 7-GPU blocker ends, the freed units stay idle and it grows
to 2; when a product inference replica needs 7 H100s, it is shrunk back to 1 rather than anyone
stopped. Each resize ends the run on its notice and its resumption takes over the new size: it
resumes from its checkpoint, at the world size it was given, redoing no finished step.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from dagster import DagsterRunStatus, RunsFilter

from tests.dagster.engine_harness import PLATFORM, Engine, engine, request
from xirang_platform.control import run_tags as rt
from xirang_platform.control.run_allocation import read_allocation_tag

ELASTIC_PLATFORM = PLATFORM | {
    "scheduler": {"min_runtime_s": 0, "reclaim_backoff_s": 0, "elastic_grow_idle_s": 2},
    "preemption_grace_s": {"P0": 60, "P2": 120},
}
WAIT = {"test/outcome": "wait"}
ENDED = (DagsterRunStatus.CANCELED, DagsterRunStatus.FAILURE, DagsterRunStatus.SUCCESS)
START = re.compile(r"training on (\d+) worker\(s\) \(gloo\): (starting|resuming after step (\d+)), steps (\d+)\.\.")
STOPPED = re.compile(r"stopped on the notice after step (\d+)")
EPOCH_SAVED = re.compile(r"checkpoint of step (\d+) saved after epoch")


def step(e: Engine) -> None:
    """One iteration of the sensor daemon (the tick, the release and resumption sensors), then the queue's."""
    e.sensors()
    e.dequeue()


def drive(e: Engine, what: str, done: Callable[[], object]) -> None:
    """Step the daemons until `done()` holds."""
    e.wait_for(what, lambda: (step(e), bool(done()))[1])


def found(e: Engine, run_id: str, pattern: re.Pattern[str]) -> list[re.Match[str]]:
    return [m for text in e.messages(run_id) if (m := pattern.search(text))]


def world_and_gpus(e: Engine, run_id: str) -> tuple[int, int]:
    """The world size the run's training started with and the GPUs its allocation tag gives it."""
    [start] = found(e, run_id, START)
    allocation = read_allocation_tag(e.tag(run_id, rt.ALLOCATION))
    assert allocation is not None
    return int(start.group(1)), allocation.gpu_count


def resumption(e: Engine, parent: str) -> str | None:
    runs = e.instance.get_runs(RunsFilter(tags={rt.PARENT_RUN: parent}))
    return runs[0].run_id if runs else None


def test_an_elastic_run_grows_into_freed_units_and_shrinks_for_inference_resuming_each_time(tmp_path: Path) -> None:
    # SQLite: the same tick on PostgreSQL is `test_tick_resizes.py`'s (this one runs torchrun three times)
    with engine(tmp_path, "sqlite", ELASTIC_PLATFORM, processes=True) as e:
        e.sensors()
        blocker = e.submit("research", "gpu_job", request("offline-training", 8, project="llm") | WAIT)
        leaving = e.submit("research", "gpu_job", request("offline-training", 7, project="vision") | WAIT)
        assert e.tick().admitted == [blocker, leaving]
        first = e.submit("research", "elastic_train_job", {})
        assert e.tick().admitted == [first]
        assert {a.id: a.request.gpus for a in e.ledger.allocations()}[first] == 1  # below its max: 1 H100 left

        drive(e, "the first run to finish an epoch", lambda: found(e, first, EPOCH_SAVED) or e.status(first) in ENDED)
        assert world_and_gpus(e, first) == (1, 1)
        assert found(e, first, START)[0].group(2) == "starting"

        # The 7-GPU blocker ends: its units stay idle, nobody waits for them, the run grows to 2.
        e.finish(leaving)
        drive(e, "the run to be grown and resumed", lambda: resumption(e, first) is not None)
        assert e.tag(first, rt.SIZE_HISTORY) == "1,2"
        assert e.status(first) == DagsterRunStatus.CANCELED  # it ended on its notice
        [stopped] = found(e, first, STOPPED)
        second = resumption(e, first)
        assert second is not None
        drive(e, "the grown run to finish an epoch", lambda: len(found(e, second, EPOCH_SAVED)) >= 1)
        assert world_and_gpus(e, second) == (2, 2)
        [start] = found(e, second, START)
        assert start.group(3) == stopped.group(1)  # it resumed after the last step the first run finished
        assert e.tag(second, rt.SIZE_HISTORY) == "1,2"

        # An inference replica needs 7 H100s: the run's second GPU is taken back, nobody is stopped.
        serving = e.submit("product", "gpu_job", request("inference", 7, gpu_model="H100-SXM") | WAIT)
        drive(e, "the run to be shrunk and resumed", lambda: resumption(e, second) is not None)
        assert e.tag(second, rt.SIZE_HISTORY) == "1,2,1"
        [stopped] = found(e, second, STOPPED)
        third = resumption(e, second)
        assert third is not None
        drive(e, "the shrunk run to finish training", lambda: e.status(third) in ENDED)
        assert e.status(third) == DagsterRunStatus.SUCCESS, e.messages(third)
        assert world_and_gpus(e, third) == (1, 1)
        [start] = found(e, third, START)
        assert start.group(3) == stopped.group(1)
        assert any("training done at step" in m for m in e.messages(third))
        drive(e, "the replica to start", lambda: e.status(serving) == DagsterRunStatus.STARTED)
        assert e.status(blocker) == DagsterRunStatus.STARTED  # nobody else was stopped

        kinds = [(x.details["old_gpus"], x.details["new_gpus"], x.cause) for x in e.ledger.entries(kind="resize")]
        assert list(dict.fromkeys(kinds)) == [(1, 2, "grow"), (2, 1, "shrink")]  # 4 entries each: 2 accounts x 2
        assert e.ledger.rebuild(e.gpu_pool.pool()).ok
        e.finish(blocker)
        e.finish(serving)
