"""The autoscaling sensor on a test instance: scale-up replicas go through the platform's own path
(coordinator gate, scheduling tick, ledger) and reclaim units lent to training; scale-down cancels
replicas and their units go back to training; every borrow, preempt and return is in the ledger's
history, and the decision is metadata on the `inference_service` asset.

Pool (tests/dagster/pool.yaml): two 8-GPU H100 servers and one 4 x L40S server, 20 GPUs. Quotas:
research 12 GPUs (cap 14.4 at ratio 1.2), product 8 GPUs (the service's tenant, cap 8 at ratio 1.0).
"""

from __future__ import annotations

import json
import logging
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from dagster import DagsterRunStatus, SkipReason, build_sensor_context
from sklearn.dummy import DummyClassifier

from sensors.autoscaling import build_autoscaling_sensor, evaluate
from tests.dagster.engine_defs import OUTCOME_TAG
from tests.dagster.engine_harness import Engine, engine, request
from tests.operations.ops_helpers import free_port
from xirang_platform.control import run_tags as rt
from xirang_platform.control import tag_parsing
from xirang_platform.control.autoscaling_config import (
    AutoscalingConfigError,
    LiveService,
    TraceOnClock,
    default_query,
    read_services,
)
from xirang_platform.control.platform_config import load_config
from xirang_platform.control.service_scaling import (
    REPLICA_TAG,
    SERVICE_TAG,
    STOP_AT_TAG,
    STOP_TAG,
    STOP_TIMEOUT_S,
    replica_tags,
    stop_overdue,
)
from xirang_platform.dagster_defs.assets.serving import deploy
from xirang_platform.load.prometheus import PrometheusQuery
from xirang_platform.load.scrape import ScrapeLoad
from xirang_platform.load.traces import read_load
from xirang_platform.scheduling.model import Request, Tier
from xirang_platform.scheduling.replica_scaling import ServiceSpec
from xirang_platform.serving import registry
from xirang_platform.serving.registry import Endpoint
from xirang_platform.serving.replica import Replica

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def e(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    with engine(tmp_path, request.param) as platform:
        yield platform


def sd_service(tmp_path: Path) -> LiveService:
    """1 QPS until t=100, 6 QPS until t=200, then 1 QPS; one replica (1 GPU) serves 1 QPS; no headroom,
    cooldowns or tolerance, so each evaluation follows the load exactly."""
    load = tmp_path / "load.csv"
    load.write_text("t,qps\n0,1\n100,6\n200,1\n300,1\n", encoding="utf-8")
    spec = ServiceSpec(
        "sd", "product", "serving", replica_qps=1.0, headroom=0.0, up_cooldown_s=0, down_cooldown_s=0,
        down_tolerance=0.0, min_replicas=0,
    )  # fmt: skip
    return LiveService(spec, "product", "gpu_job", TraceOnClock(read_load(load), start=0.0))


def entries(e: Engine, kind: str) -> list[str | None]:
    """Request ids of the ledger's entries of `kind` on tenant accounts, in order."""
    return [x.request_id for x in e.ledger.entries(kind=kind) if x.account.count("/") == 0]


def scale(
    e: Engine, service: LiveService, now: float, cursor: str | None, asset: tuple[str, ...] = ("inference_service",)
) -> tuple[list, str | None, list[str]]:
    """Evaluate the sensor and submit its run requests as Dagster's sensor daemon would (in the
    service's code location); returns the ticks, the new cursor and the submitted run ids. The
    decision is observed on `asset`."""
    ticks, result = evaluate(e.instance, e.gpu_pool, [service], cursor, now)
    submitted = [e.submit(service.location, r.job_name, r.tags) for r in result.run_requests]
    assert [o.asset_key.path for o in result.asset_events] == [list(asset)]
    return ticks, result.cursor, submitted


def test_replicas_reclaim_lent_units_and_give_them_back(e: Engine, tmp_path: Path) -> None:
    service = sd_service(tmp_path)
    # Training fills the H100s: the second gang is past research's cap, so it runs on lent units.
    a = e.submit("research", "gpu_job", request("offline-training", 8, project="llm"))
    b = e.submit("research", "gpu_job", request("offline-training", 8, project="llm"))
    assert sorted(e.tick().admitted) == sorted([a, b])
    assert entries(e, "borrow") == [b]

    # The load rises to 6 QPS: six P0 replicas; four fit the L40S server, two take the lent units back.
    ticks, cursor, replicas = scale(e, service, 150.0, None)
    assert (ticks[0].decision.current, ticks[0].decision.target) == (0, 6)
    assert [e.tag(r, SERVICE_TAG) for r in replicas] == ["sd"] * 6
    assert [e.tag(r, REPLICA_TAG) for r in replicas] == [f"sd/replica-{i}" for i in range(6)]
    assert [e.tag(r, rt.PRIORITY) for r in replicas] == ["200"] * 6  # P0 in Dagster's queue
    report = e.tick()
    assert sorted(report.admitted) == sorted(replicas)
    # One research gang is preempted for the two replicas (which one is the cycle's victim order).
    [victim] = report.preempted
    [survivor] = {a, b} - {victim}
    assert e.status(victim) == DagsterRunStatus.CANCELED
    assert e.tag(victim, rt.PREEMPTED_BY)
    assert entries(e, "preempt") == [victim]
    assert e.held() == {survivor, *replicas}
    metadata = ticks[0].metadata(0.0)
    assert (metadata["target_replicas"], metadata["scale_up_runs"], metadata["action"]) == (6, 6, "scale-up")

    # The same instant again: nothing new is asked (the replicas are live; run keys never repeat).
    ticks, cursor, again = scale(e, service, 160.0, cursor)
    assert again == []
    assert ticks[0].decision.current == 6

    # The load falls to 1 QPS: five replicas are cancelled, newest first; their units are released.
    ticks, cursor, more = scale(e, service, 250.0, cursor)
    assert more == []
    assert ticks[0].stopped == list(reversed(replicas[1:]))
    for r in ticks[0].stopped:
        # not yet launched: cancelled from the queue, said in an info event, not an error
        assert e.status(r) == DagsterRunStatus.CANCELED
        assert "scaled down before it started: autoscaler: sd scales from 6 to 1 replicas (load 1.0)" in e.messages(r)
        assert [x.message for x in e.instance.all_logs(r) if x.level >= logging.ERROR] == []
        e.release_sensors(r)
    assert e.held() == {survivor, replicas[0]}

    # Training gets the units back: a new gang borrows them (research holds 8 GPUs in quota, 16 is
    # past its cap); when the other gang ends, the borrowed one turns in-quota (a `return`).
    d = e.submit("research", "gpu_job", request("offline-training", 8, project="llm"))
    assert e.tick().admitted == [d]
    assert entries(e, "borrow") == [b, d]
    e.instance.run_coordinator.cancel_run(survivor)
    e.release_sensors(survivor)
    e.tick()
    assert entries(e, "return")[-1] == d


def test_load_above_the_tenants_cap_stops_at_the_cap(e: Engine, tmp_path: Path) -> None:
    service = sd_service(tmp_path)
    big = LiveService(
        ServiceSpec("sd", "product", "serving", replica_qps=0.5, headroom=0.0, min_replicas=0),
        "product",
        "gpu_job",
        service.load,
    )
    ticks, _, replicas = scale(e, big, 150.0, None)  # 6 QPS / 0.5 = 12 replicas; product's cap holds 8
    assert len(replicas) == 8
    assert ticks[0].decision.capped
    assert ticks[0].metadata(0.0)["unserved_qps"] == pytest.approx(2.0)
    assert sorted(e.tick().admitted) == sorted(replicas)


def test_replica_tags_ask_for_a_fraction_and_gpu_memory(tmp_path: Path) -> None:
    spec = ServiceSpec(
        "llm", "product", "serving", replica_qps=1.0, replica_gpu_milli=500, replica_gpu_memory_mib=20480
    )
    tags = replica_tags(LiveService(spec, "product", "gpu_job", sd_service(tmp_path).load), 3)
    assert tags == {
        rt.TIER: "inference",
        rt.PROJECT: "serving",
        rt.GPU_MILLI: "500",
        rt.GPU_MEMORY_GB: "20",
        SERVICE_TAG: "llm",
        REPLICA_TAG: "llm/replica-3",
    }
    parsed = tag_parsing.parse(tags, "product", run_id="r", projects=["serving"])
    assert isinstance(parsed, Request)
    assert (parsed.tier, parsed.milli_per_gpu, parsed.gpu_memory_mib) == (Tier.INFERENCE, 500, 20480)


def test_services_file(tmp_path: Path) -> None:
    (tmp_path / "load.csv").write_text("t,qps\n0,1\n60,2\n", encoding="utf-8")
    path = tmp_path / "autoscaling.yaml"
    path.write_text(
        "services:\n"
        "  sd:\n"
        "    location: product\n    project: serving\n    job: gpu_job\n    replica_qps: 0.5\n"
        "    replica_memory_gb: 16\n    down_cooldown_s: 300\n"
        "    load: {trace: {file: load.csv, window_s: 60, start: 1000}}\n"
        "  chat:\n"
        "    location: product\n    job: gpu_job\n    replica_qps: 2\n"
        "    load: {prometheus: {url: 'http://127.0.0.1:9090', query: 'sum(rate(x[1m]))'}}\n",
        encoding="utf-8",
    )
    chat, sd = read_services(path, {"product": "product", "research": "research"})
    assert (sd.spec.tenant, sd.spec.project, sd.spec.replica_gpu_memory_mib, sd.spec.down_cooldown_s) == (
        "product",
        "serving",
        16384,
        300,
    )
    assert [sd.load.read(t) for t in (999, 1000, 1060, 1120)] == [None, 1, 2, 1]  # looped on the clock
    assert chat.spec.project == "default"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param("services:\n  sd: {location: nowhere, job: j, replica_qps: 1, load: {}}", "not a code location"),
        pytest.param("services:\n  sd: {location: product, job: j, load: {}}", "replica_qps is missing"),
        pytest.param("services:\n  sd: {location: product, job: j, replica_qps: 1, load: {trace: {}}}", "give file"),
        pytest.param(
            "services:\n  sd: {location: product, job: j, replica_qps: 1, headrom: 1, load: {}}",
            "did you mean 'headroom'",
        ),
        pytest.param(
            "services:\n  sd: {location: product, job: j, replica_qps: 0, load: {prometheus: {url: u, query: q}}}",
            "replica_qps must be > 0",
        ),
    ],
)
def test_bad_services_file_names_the_key(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "autoscaling.yaml"
    path.write_text(body, encoding="utf-8")
    with pytest.raises(AutoscalingConfigError, match=message):
        read_services(path, {"product": "product"})


def test_the_sensor_definition_asks_for_replicas_and_keeps_its_memory(e: Engine, tmp_path: Path) -> None:
    import time

    base = sd_service(tmp_path)
    # The trace replayed on the wall clock from 150 s ago: 6 QPS now.
    service = LiveService(base.spec, base.location, base.job, TraceOnClock(base.load.series, time.time() - 150))
    sensor_def = build_autoscaling_sensor("product", [service])
    with build_sensor_context(instance=e.instance, resources={"gpu_pool": e.gpu_pool}) as context:
        result = sensor_def(context)
    assert [r.tags[REPLICA_TAG] for r in result.run_requests] == [f"sd/replica-{i}" for i in range(6)]
    assert [r.job_name for r in result.run_requests] == ["gpu_job"] * 6
    memory = json.loads(result.cursor)
    assert memory["sd"]["next"] == 6
    [observation] = result.asset_events
    assert observation.metadata["target_replicas"].value == 6
    # A service of another code location is not this sensor's.
    with build_sensor_context(instance=e.instance, resources={"gpu_pool": e.gpu_pool}) as context:
        assert build_autoscaling_sensor("research", [service])(context).run_requests == []


def test_the_bundled_services_file_scales_each_tenants_deployed_model_from_scraped_metrics() -> None:
    repo = Path(__file__).resolve().parents[2]
    assert load_config(repo / "xirang.yaml").autoscaling_path == str(repo / "autoscaling.yaml")
    services = read_services(repo / "autoscaling.yaml", {"research": "research", "product": "product"}, now=0.0)
    assert [(s.spec.name, s.location, s.spec.tenant, s.job) for s in services] == [
        ("product", "product", "product", "inference_replica"),
        ("research", "research", "research", "inference_replica"),
    ]
    assert all(s.deployed_model and s.load_source == "scrape" for s in services)
    assert {s.spec.replica_gpu_milli for s in services} == {250}


def spec(**overrides: object) -> ServiceSpec:
    """The `sd` service: one 1-GPU replica serves 1 QPS; no headroom, cooldowns or tolerance."""
    base: dict = dict(replica_qps=1.0, headroom=0.0, up_cooldown_s=0, down_cooldown_s=0, down_tolerance=0.0)
    return ServiceSpec("sd", "product", "serving", **{**base, "min_replicas": 0, **overrides})


def test_load_scraped_from_real_replicas_scales_up_by_preemption_and_down_again(e: Engine, tmp_path: Path) -> None:
    service = LiveService(spec(), "product", "gpu_job", ScrapeLoad("sd", tmp_path / "registry"))
    with Replica("sd", digits_model(), 1, "front", tmp_path / "registry", drain_grace_s=0.0) as front:
        a = e.submit("research", "gpu_job", request("offline-training", 8, project="llm"))
        b = e.submit("research", "gpu_job", request("offline-training", 8, project="llm"))
        e.tick()
        ticks, cursor, replicas = scale(e, service, 1000.0, None)
        assert (ticks[0].decision.action.value, replicas) == ("no-reading", [])  # one scrape is no rate yet
        assert ticks[0].metadata(0.0)["load_source"] == "scrape"

        predict(front, 60)  # 60 requests in 10 s: 6 QPS
        ticks, cursor, replicas = scale(e, service, 1010.0, cursor)
        assert (ticks[0].decision.qps, ticks[0].decision.target) == (6.0, 6)
        report = e.tick()
        assert sorted(report.admitted) == sorted(replicas)
        [victim] = report.preempted  # four replicas fit the L40S server; two take a gang's lent units
        assert entries(e, "preempt") == [victim]

        predict(front, 10)  # 1 QPS
        ticks, cursor, _ = scale(e, service, 1020.0, cursor)
        assert ticks[0].decision.target == 1
        assert ticks[0].stopped == list(reversed(replicas[1:]))
        for r in ticks[0].stopped:
            e.release_sensors(r)
        assert e.held() == ({a, b} - {victim}) | {replicas[0]}


def test_a_replica_run_that_ended_without_deregistering_leaves_the_registry(e: Engine, tmp_path: Path) -> None:
    folder = tmp_path / "registry"
    service = LiveService(spec(), "product", "gpu_job", ScrapeLoad("sd", folder))
    killed = e.create("product", "gpu_job", replica_tags(service, 0))  # kill -9: no drain, no deregister
    e.instance.report_run_failed(e.run(killed), "the replica's process was killed")
    live = e.create("product", "gpu_job", replica_tags(service, 1))
    listed = {
        name: Endpoint("sd", run_id, "127.0.0.1", free_port(), "1")
        for name, run_id in (("killed", killed), ("live", live), ("served by hand", "xirang-serve-host"))
    }
    for endpoint in listed.values():
        registry.register(folder, endpoint)
    ticks, _, _ = scale(e, service, 1000.0, None)
    assert ticks[0].pruned == [killed]
    assert ticks[0].metadata(0.0)["stale_replicas_removed"] == 1
    # a live run's replica and one started outside Dagster (`xirang serve`) stay listed
    assert registry.endpoints(folder, "sd") == sorted([listed["live"], listed["served by hand"]])
    ticks, _, _ = scale(e, service, 1010.0, None)
    assert ticks[0].pruned == []


def test_a_service_naming_a_job_the_location_lacks_is_held_with_the_fix(e: Engine, tmp_path: Path) -> None:
    service = LiveService(spec(min_replicas=2), "product", "gpu_jbo", sd_service(tmp_path).load)
    ticks, result = evaluate(e.instance, e.gpu_pool, [service], None, 150.0, known_jobs={"gpu_job", "train_job"})
    assert result.run_requests == []
    assert ticks[0].problem is not None
    assert "job 'gpu_jbo' is not a job of code location product (did you mean 'gpu_job'?)" in ticks[0].problem
    assert ticks[0].metadata(0.0)["load_problem"] == ticks[0].problem


def test_prometheus_down_is_logged_and_the_replicas_that_run_are_kept(
    e: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ticks, cursor, replicas = scale(e, sd_service(tmp_path), 150.0, None)
    assert len(replicas) == 6
    dead = PrometheusQuery(f"http://127.0.0.1:{free_port()}", default_query("sd"), "sd")
    down = LiveService(spec(), "product", "gpu_job", dead)
    ticks, cursor, more = scale(e, down, 250.0, cursor)
    assert (more, ticks[0].stopped) == ([], [])
    assert (ticks[0].decision.action.value, ticks[0].decision.target) == ("no-reading", 6)
    assert "cannot reach Prometheus" in caplog.text
    assert ticks[0].metadata(0.0)["load_source"] == "prometheus"


def test_a_service_of_a_tenant_without_a_deployed_model_starts_no_replica(e: Engine, tmp_path: Path) -> None:
    base = sd_service(tmp_path)
    service = LiveService(spec(min_replicas=1), "product", "gpu_job", base.load, deployed_model=True)
    lifecycle_asset = ("product", "inference_service")  # the tenant's deployed service is observed there
    ticks, _, replicas = scale(e, service, 150.0, None, lifecycle_asset)
    assert replicas == []
    assert ticks[0].problem == "service sd: no model deployed yet; materialize product/inference_service"
    deploy(e.instance.storage_directory(), "product", digits_model(), "run-1")
    ticks, _, replicas = scale(e, service, 150.0, None, lifecycle_asset)
    assert len(replicas) == 6


def test_a_broken_services_file_skips_the_evaluation_with_its_message(
    e: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = tmp_path / "autoscaling.yaml"
    bad.write_text("services:\n  sd: {location: nowhere, job: gpu_job, replica_qps: 1, load: {scrape: {}}}\n")
    monkeypatch.setenv("XIRANG_AUTOSCALING", str(bad))
    sensor_def = build_autoscaling_sensor("product")
    with build_sensor_context(instance=e.instance, resources={"gpu_pool": e.gpu_pool}) as context:
        result = sensor_def(context)
    assert isinstance(result, SkipReason)
    assert "services.sd.location: 'nowhere' is not a code location of the platform" in str(result.skip_message)


def digits_model() -> object:
    """A real scikit-learn classifier over 4 features."""
    return DummyClassifier(strategy="most_frequent").fit(np.zeros((2, 4)), [0, 1])


def predict(replica: Replica, n: int) -> None:
    """`n` real prediction requests to `replica`, each answered 200."""
    assert replica.endpoint is not None
    body = json.dumps({"instances": [[0.0] * 4]}).encode()
    for _ in range(n):
        req = urllib.request.Request(f"{replica.endpoint.url}/predict", data=body)
        with urllib.request.urlopen(req, timeout=5) as response:
            assert response.status == 200


@pytest.mark.parametrize(
    ("asked", "overdue"),
    [
        pytest.param({"a": "1000.0"}, [], id="asked 100 s ago: it is still draining"),
        pytest.param({"a": "979.5"}, ["a"], id="asked more than 120 s ago: overdue"),
        pytest.param({"b": "970", "a": "960", "c": "1090"}, ["a", "b"], id="several: the overdue ones, sorted"),
        pytest.param({"a": "soon", "b": "nan", "c": ""}, ["a", "b", "c"], id="a stop time not a number: overdue"),
    ],
)
def test_a_replica_still_live_long_after_its_stop_request_is_overdue(asked: dict, overdue: list[str]) -> None:
    assert stop_overdue(asked, now=1100.0) == overdue


def test_a_started_replica_is_asked_to_stop_and_terminated_only_once_overdue(tmp_path: Path) -> None:
    # The replica's process is the engine's `gpu_job`, which never reads its stop tag (a real replica
    # drains on it: tests/dagster/test_replica_run.py): after STOP_TIMEOUT_S it is terminated.
    with engine(tmp_path, "sqlite", processes=True) as e:
        _, result = evaluate(e.instance, e.gpu_pool, [sd_service(tmp_path)], None, 50.0)  # 1 QPS: one replica
        [replica] = [e.submit("product", r.job_name, {**r.tags, OUTCOME_TAG: "wait"}) for r in result.run_requests]
        assert e.tick().admitted == [replica]
        e.dequeue()
        e.wait_for("the replica's process to start", lambda: e.status(replica) == DagsterRunStatus.STARTED)
        quiet = idle_service(tmp_path)

        ticks, stopped = evaluate(e.instance, e.gpu_pool, [quiet], result.cursor, 60.0)
        assert ticks[0].stopped == [replica]
        assert e.status(replica) == DagsterRunStatus.STARTED  # asked, not terminated
        assert (e.tag(replica, STOP_TAG), e.tag(replica, STOP_AT_TAG)) == (
            "autoscaler: sd scales from 1 to 0 replicas (load 0.0)",
            "60.000",
        )
        ticks, later = evaluate(e.instance, e.gpu_pool, [quiet], stopped.cursor, 60.0 + STOP_TIMEOUT_S)
        assert ticks[0].decision.current == 0  # a replica asked to stop no longer counts
        assert e.status(replica) == DagsterRunStatus.STARTED  # still within its time to stop
        evaluate(e.instance, e.gpu_pool, [quiet], later.cursor, 61.0 + STOP_TIMEOUT_S)
        e.wait_for("the replica's termination", lambda: e.status(replica) == DagsterRunStatus.CANCELED)


def idle_service(tmp_path: Path) -> LiveService:
    """`sd_service` with no load at all: its policy scales it to zero replicas."""
    path = tmp_path / "zero.csv"
    path.write_text("t,qps\n0,0\n1000,0\n", encoding="utf-8")
    service = sd_service(tmp_path)
    return LiveService(service.spec, service.location, service.job, TraceOnClock(read_load(path), start=0.0))
