"""Rolling redeploys through the autoscaling sensor, under real load: a newly deployed model version
replaces the service's replicas one by one, new ones ready before old ones are cancelled.

The replica runs go through the platform's own path (coordinator gate, scheduling tick, ledger) on
the engine harness; what each admitted run's process does (`inference_replica`: load the deployed
version, serve it on uvicorn, register, drain on cancel) is played by a real `Replica` per run, so
the requests, the registry, the readiness probes and the router are all real. `xirang load`'s
`run_load` sends the load in a thread for the whole rollout."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from dagster import DagsterRunStatus
from sklearn.dummy import DummyClassifier

from sensors.autoscaling import evaluate
from tests.dagster.engine_harness import Engine, engine
from tests.waiting import wait_for
from xirang_platform.control import run_tags as rt
from xirang_platform.control.autoscaling_config import LiveService, TraceOnClock
from xirang_platform.control.service_scaling import VERSION_TAG
from xirang_platform.dagster_defs.assets.serving import deploy
from xirang_platform.load.generator import LoadReport, plan_load, run_load
from xirang_platform.load.traces import read_load
from xirang_platform.scheduling.replica_scaling import ServiceSpec
from xirang_platform.serving.registry import endpoints
from xirang_platform.serving.replica import Replica


@pytest.fixture
def e(tmp_path: Path) -> Iterator[Engine]:
    with engine(tmp_path, "sqlite") as platform:
        yield platform


def model(label: int) -> DummyClassifier:
    """A real classifier over the 64 features of the load generator's digit images."""
    return DummyClassifier(strategy="constant", constant=label).fit(np.zeros((2, 64)), [label, label])


class Fleet:
    """The replica runs' processes, played by real replicas: started when the tick admits a run,
    drained when the run is cancelled."""

    def __init__(self, e: Engine, registry: Path) -> None:
        self.e, self.registry = e, registry
        self.serving: dict[str, Replica] = {}

    def follow(self) -> None:
        """Start a replica for every admitted run that has none; drain those of ended runs."""
        for run in self.e.instance.get_runs():
            if run.tags.get(rt.GATE) == rt.GATE_OPEN and not run.is_finished and run.run_id not in self.serving:
                version = run.tags[VERSION_TAG]
                replica = Replica("sd", model(int(version)), version, run.run_id, self.registry, drain_grace_s=1.0)
                replica.start()
                self.serving[run.run_id] = replica
            if run.is_finished and run.run_id in self.serving:
                self.serving.pop(run.run_id).drain()

    def close(self) -> None:
        for replica in self.serving.values():
            replica.drain()


def test_a_new_model_version_rolls_out_under_load_without_a_failed_request(e: Engine, tmp_path: Path) -> None:
    registry = tmp_path / "registry"
    storage = e.instance.storage_directory()
    (tmp_path / "load.csv").write_text("t,qps\n0,2\n1000,2\n", encoding="utf-8")
    spec = ServiceSpec("sd", "product", "serving", replica_qps=1.0, headroom=0.0, up_cooldown_s=0, min_replicas=1)
    service = LiveService(
        spec, "product", "gpu_job", TraceOnClock(read_load(tmp_path / "load.csv"), start=0.0), deployed_model=True
    )
    deploy(storage, "product", model(1), "train-1")
    fleet = Fleet(e, registry)
    cursor: str | None = None

    def evaluation(now: float) -> None:
        nonlocal cursor
        ticks, result = evaluate(e.instance, e.gpu_pool, [service], cursor, now)
        cursor = result.cursor
        for r in result.run_requests:
            e.submit(service.location, r.job_name, r.tags)
        e.tick()
        fleet.follow()

    try:
        evaluation(100.0)
        assert sorted(ep.model_version for ep in endpoints(registry, "sd")) == ["1", "1"]  # 2 QPS: two replicas

        report: list[LoadReport] = []
        plan = plan_load(tmp_path / "load.csv", speed=1.0, duration_s=20.0)
        sender = threading.Thread(target=lambda: report.append(run_load("sd", plan, directory=registry)))
        sender.start()
        wait_for("the load to reach version 1", lambda: sum(r.answered() for r in fleet.serving.values()) >= 4)
        deploy(storage, "product", model(2), "train-2")  # the retraining passed its check: version 2
        ready_counts: list[int] = []
        clock = itertools.count(200)

        def rollout_step() -> tuple[list[str], int]:
            """One autoscaler evaluation a second later on its clock: the versions served, the replicas running."""
            evaluation(float(next(clock)))
            ready_counts.append(len(endpoints(registry, "sd")))
            return sorted(ep.model_version for ep in endpoints(registry, "sd")), len(fleet.serving)

        wait_for("version 2 on both replicas, and only those", rollout_step, done=lambda s: s == (["2", "2"], 2))
        sender.join()
    finally:
        fleet.close()

    assert sorted(ep.model_version for ep in endpoints(registry, "sd")) == []  # all drained at close
    assert min(ready_counts) >= 2  # the target stayed ready through the rollout
    [done] = report
    assert done.errors == 0, done.errors_by_reason()
    assert done.ok == len(done.outcomes) > 20
    versions = [e.tag(r.run_id, VERSION_TAG) for r in e.instance.get_runs()]
    assert sorted(versions) == ["1", "1", "2", "2"]  # two new replicas replaced two old ones, no more
    canceled = [r for r in e.instance.get_runs() if r.status == DagsterRunStatus.CANCELED]
    assert sorted(e.tag(r.run_id, VERSION_TAG) for r in canceled) == ["1", "1"]
    assert any("rolls out model v2" in m for r in canceled for m in e.messages(r.run_id))


def test_a_crashed_replica_is_replaced(e: Engine, tmp_path: Path) -> None:
    (tmp_path / "load.csv").write_text("t,qps\n0,2\n1000,2\n", encoding="utf-8")
    spec = ServiceSpec("sd", "product", "serving", replica_qps=1.0, headroom=0.0, up_cooldown_s=0)
    service = LiveService(spec, "product", "gpu_job", TraceOnClock(read_load(tmp_path / "load.csv"), start=0.0))
    _, result = evaluate(e.instance, e.gpu_pool, [service], None, 100.0)
    first = [e.submit(service.location, r.job_name, r.tags) for r in result.run_requests]
    assert len(first) == 2
    e.tick()
    crashed = e.run(first[0])
    e.instance.report_run_failed(crashed, "the replica's process died")
    e.release_sensors(first[0])
    ticks, result = evaluate(e.instance, e.gpu_pool, [service], result.cursor, 101.0)
    assert (ticks[0].decision.current, ticks[0].decision.target) == (1, 2)
    [replacement] = [e.submit(service.location, r.job_name, r.tags) for r in result.run_requests]
    assert replacement not in first
    assert sorted(e.tick().admitted) == [replacement]
