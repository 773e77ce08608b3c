"""Preemption notice and grace end to end with real processes (each code location in its own gRPC
code server, every run a process of its own under Dagster's `DefaultRunLauncher`, the real queue
and sensor daemon iterations):

- the platform's training loop takes its notice (Dagster's termination of its run), saves the
  epoch's checkpoint and stops cleanly within the grace; its preemptor, whose units were reserved
  at once, launches as soon as it stopped; the resumption continues from the checkpoint it saved;
- an op that takes the notice and ignores it is killed at the end of its grace, and only then does
  its preemptor launch.

Pool and quotas as in `test_engine.py`: two 8-GPU H100 servers and 4 L40S; research 12 GPUs (cap
14.4), product 8. research's in-quota online training holds one server, its borrowed P2 the other;
a product inference replica needing a whole H100 server reclaims the borrowed one (P0: its grace,
30 s here).
"""

from __future__ import annotations

import pickle
import time
from pathlib import Path

import pytest
from dagster import DagsterEventType, DagsterRunStatus, RunsFilter

from resources.gpu_pool import NOTHING_TO_SAVE
from tests.dagster.engine_defs import IGNORING, NOTICE_IGNORED, SETTING_UP
from tests.dagster.engine_harness import PLATFORM, Engine, engine, request
from xirang_platform.control import run_tags as rt
from xirang_platform.control.notice import read_notice, read_wait
from xirang_platform.dagster_defs.assets.checkpoints import CHECKPOINT_DIR
from xirang_platform.operations.preemption_log import victim_loss

GRACE_S = 30.0
NOTICED = PLATFORM | {
    "scheduler": {"min_runtime_s": 0, "reclaim_backoff_s": 0},
    "preemption_grace_s": {"P0": GRACE_S},
}
WAIT = {"test/outcome": "wait"}
SERVING = request("inference", 8, gpu_model="H100-SXM") | WAIT
ENDED = (DagsterRunStatus.CANCELED, DagsterRunStatus.FAILURE, DagsterRunStatus.SUCCESS)


def logged(e: Engine, run_id: str, text: str) -> list[str]:
    return [m for m in e.messages(run_id) if text in m]


def started_step(e: Engine, run_id: str, step: str) -> bool:
    return any(
        x.dagster_event is not None and x.dagster_event.step_key == step
        for x in e.instance.all_logs(run_id, of_type=DagsterEventType.STEP_START)
    )


def fill_the_h100s(
    e: Engine, victim_job: str, victim_tags: dict[str, str], run_config: dict | None = None
) -> tuple[str, str]:
    """research's in-quota online training on one H100 server, its borrowed victim on the other."""
    e.sensors()
    in_quota = e.submit("research", "gpu_job", request("online-training", 8, project="llm") | WAIT)
    victim = e.submit("research", victim_job, victim_tags, run_config=run_config)
    assert e.tick().admitted == [in_quota, victim]
    assert {a.id: a.borrowed for a in e.ledger.allocations()} == {in_quota: False, victim: True}
    e.dequeue()
    return in_quota, victim


def preempt(e: Engine, victim: str) -> tuple[str, float]:
    """A product inference replica reclaims the victim's server: the victim gets its notice, the
    replica's units are reserved and its gate stays closed."""
    serving = e.submit("product", "gpu_job", SERVING)
    now = time.time()
    report = e.tick(now)
    assert (report.preempted, report.waiting) == ([victim], [serving])
    notice = read_notice(e.run(victim).tags)
    assert notice is not None
    assert (notice.by, notice.reason, notice.grace_s, notice.at) == (serving, "reclaim", GRACE_S, now)
    assert logged(e, victim, f"preemption notice: run {serving} needs these units (reclaim)")
    wait = read_wait(e.run(serving).tags)
    assert wait is not None
    assert (wait.victims, wait.deadline) == ((victim,), now + GRACE_S)
    assert serving in e.held()  # reserved for it at once
    assert e.tag(serving, rt.GATE) == "reserved"
    assert e.tag(serving, rt.HOLD_REASON).startswith("reserved: its units are held for it while preempted run(s)")
    return serving, now


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_training_checkpoints_on_its_notice_stops_and_its_resumption_continues_from_there(
    tmp_path: Path, backend: str
) -> None:
    with engine(tmp_path, backend, NOTICED, processes=True) as e:
        in_quota, victim = fill_the_h100s(e, "notice_train_job", {})
        saving = "checkpoint saved at step"
        e.wait_for("the victim to checkpoint an epoch", lambda: logged(e, victim, saving) or e.status(victim) in ENDED)
        assert logged(e, victim, saving), "\n".join(e.messages(victim))

        serving, sent = preempt(e, victim)

        e.wait_for("the victim to stop", lambda: e.status(victim) in ENDED)
        assert e.status(victim) == DagsterRunStatus.CANCELED  # a clean stop, not a kill
        (taken,) = logged(e, victim, "preemption notice taken: the checkpoint of step ")
        step = int(taken.split("the checkpoint of step ", 1)[1].split(" ", 1)[0])
        used = float(taken.split("stopping ", 1)[1].split(" s after", 1)[0])
        assert used < GRACE_S
        assert f"of the grace of {GRACE_S:g} s" in taken
        (saved,) = (tmp_path / "dagster").rglob(f"{CHECKPOINT_DIR}/notice_train/{victim}.pkl")
        with saved.open("rb") as f:
            assert pickle.load(f)["epoch"] == step  # the checkpoint on disk is the one it saved on notice

        loss = victim_loss(e.instance, e.run(victim))
        assert (loss.gpus, loss.grace_s, loss.stopped_on_notice, loss.lost_gpu_seconds) == (8.0, GRACE_S, True, 0.0)

        report = e.tick(sent + 1.0)  # before the grace ends: the victim stopped, so the replica launches
        assert report.killed == []
        assert e.tag(serving, rt.GATE) == rt.GATE_OPEN
        e.dequeue()
        e.wait_for("serving to start", lambda: e.status(serving) == DagsterRunStatus.STARTED)

        # The resumption (requested by the resume sensor) waits for a server; serving ends, it trains on.
        def resumptions() -> list:
            e.sensors()
            return e.instance.get_runs(RunsFilter(tags={rt.PARENT_RUN: victim}))

        e.wait_for("the resumption's run request", lambda: len(resumptions()) > 0)
        (resumption,) = resumptions()
        e.finish(serving)
        e.wait_for("serving to end", lambda: e.status(serving) == DagsterRunStatus.SUCCESS)
        e.release_sensors(serving)
        assert e.tick().admitted == [resumption.run_id]
        e.dequeue()
        e.wait_for("the resumption to end", lambda: e.status(resumption.run_id) in ENDED)
        assert e.status(resumption.run_id) == DagsterRunStatus.SUCCESS
        assert logged(e, resumption.run_id, f"resuming from the checkpoint of epoch {step} of 40")
        e.finish(in_quota)


def test_a_victim_noticed_before_its_first_epoch_stops_at_once_losing_nothing(tmp_path: Path) -> None:
    # The cheapest victim is the newest run, often still loading its data: its notice must not be
    # Dagster's interrupt of a step (all its seconds lost) but a clean stop with nothing to save.
    setup = {"ops": {"notice_train": {"config": {"setup_s": 120.0}}}}
    with engine(tmp_path, "sqlite", NOTICED, processes=True) as e:
        in_quota, victim = fill_the_h100s(e, "notice_train_job", {}, run_config=setup)
        e.wait_for("the victim to begin its setup", lambda: logged(e, victim, SETTING_UP))

        serving, sent = preempt(e, victim)

        e.wait_for("the victim to stop", lambda: e.status(victim) in ENDED)
        assert e.status(victim) == DagsterRunStatus.CANCELED
        (taken,) = logged(e, victim, "preemption notice taken: ")
        assert NOTHING_TO_SAVE in taken
        assert logged(e, victim, "checkpoint saved") == []
        assert list((tmp_path / "dagster").rglob(f"{CHECKPOINT_DIR}/notice_train/{victim}.pkl")) == []
        loss = victim_loss(e.instance, e.run(victim))
        assert (loss.gpus, loss.grace_s, loss.stopped_on_notice, loss.lost_gpu_seconds) == (8.0, GRACE_S, True, 0.0)

        assert e.tick(sent + 1.0).killed == []  # it stopped well within its grace: the replica launches
        assert e.tag(serving, rt.GATE) == rt.GATE_OPEN
        e.dequeue()
        e.wait_for("serving to start", lambda: e.status(serving) == DagsterRunStatus.STARTED)
        e.finish(serving)
        e.finish(in_quota)


def test_a_victim_still_in_the_queue_gets_its_notice_and_its_preemptor_does_not_wait(tmp_path: Path) -> None:
    # Admitted but not yet launched: the queue may launch it while the tick plans, so it gets the
    # notice too (its process would read it at its first check); cancelled from the queue, it is
    # gone at once and its preemptor launches in the same tick.
    with engine(tmp_path, "sqlite", NOTICED) as e:
        e.sensors()
        in_quota = e.submit("research", "gpu_job", request("online-training", 8, project="llm") | WAIT)
        victim = e.submit("research", "gpu_job", request("offline-training", 8, project="llm") | WAIT)
        assert e.tick().admitted == [in_quota, victim]
        assert (e.status(victim), e.tag(victim, rt.GATE)) == (DagsterRunStatus.QUEUED, rt.GATE_OPEN)

        serving = e.submit("product", "gpu_job", SERVING)
        now = time.time()
        report = e.tick(now)
        assert (report.preempted, report.waiting, report.admitted) == ([victim], [], [serving])
        notice = read_notice(e.run(victim).tags)
        assert notice is not None
        assert (notice.by, notice.grace_s, notice.at) == (serving, GRACE_S, now)
        assert e.status(victim) == DagsterRunStatus.CANCELED
        assert read_wait(e.run(serving).tags) is None
        assert e.tag(serving, rt.GATE) == rt.GATE_OPEN


def test_a_run_that_ignores_its_notice_is_killed_when_its_grace_ends(tmp_path: Path) -> None:
    with engine(tmp_path, "sqlite", NOTICED, processes=True) as e:
        stubborn = request("offline-training", 8, project="llm") | {"test/outcome": "ignore-notice"}
        in_quota, victim = fill_the_h100s(e, "gpu_job", stubborn)
        e.wait_for("the victim to take the notice handler", lambda: logged(e, victim, IGNORING))

        serving, sent = preempt(e, victim)

        e.wait_for("the victim to have its notice", lambda: logged(e, victim, NOTICE_IGNORED))
        assert e.status(victim) == DagsterRunStatus.CANCELING  # it goes on, and its preemptor still waits
        assert e.tick(sent + GRACE_S / 2).killed == []
        assert e.tag(serving, rt.GATE) == "reserved"

        report = e.tick(sent + GRACE_S)  # its grace ends: killed, and the replica launches
        assert report.killed == [victim]
        assert e.tag(serving, rt.GATE) == rt.GATE_OPEN
        (kill,) = logged(e, victim, f"preemption grace of {GRACE_S:g} s ended and the run had not stopped: killed")
        assert "SIGKILL" in kill
        e.wait_for("the victim to end", lambda: e.status(victim) in ENDED)
        assert e.status(victim) == DagsterRunStatus.CANCELED  # it was cancelling when its process died
        loss = victim_loss(e.instance, e.run(victim))  # it never checkpointed: all its work is lost
        record = e.instance.get_run_record_by_id(victim)
        first_step = min(
            x.timestamp
            for x in e.instance.all_logs(victim)
            if x.dagster_event is not None and x.dagster_event.event_type_value == "STEP_START"
        )
        assert (loss.grace_s, loss.stopped_on_notice) == (GRACE_S, False)
        assert loss.lost_gpu_seconds == pytest.approx(8 * (record.end_time - first_step), abs=0.8)
        e.dequeue()
        e.wait_for("serving to start", lambda: e.status(serving) == DagsterRunStatus.STARTED)
        e.finish(serving)
        e.finish(in_quota)
