"""The definitions load; the lifecycle assets do real work, resume from checkpoints, and automate deployment."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from dagster import (
    AssetKey,
    DagsterInstance,
    DagsterRunStatus,
    DefaultSensorStatus,
    Definitions,
    RunsFilter,
    build_schedule_context,
    evaluate_automation_conditions,
    instance_for_test,
    materialize,
)

from resources.gpu_pool import GpuPoolResource
from xirang_platform.control import run_allocation
from xirang_platform.control import run_tags as rt
from xirang_platform.control.notice import Notice
from xirang_platform.dagster_compat import SensorType
from xirang_platform.dagster_defs.assets.lifecycle import LifecycleSpec, lifecycle_assets, retraining_schedule
from xirang_platform.dagster_defs.assets.serving import current_service
from xirang_platform.definitions import PRODUCT, RESEARCH, product, research
from xirang_platform.devtools.live_scene import write_live_platform
from xirang_platform.scheduling.model import Allocation, GpuSlice, NodeShare, Placement, Request, Tier

SPEC = LifecycleSpec(tenant="t1", project="p1", training_gpus=2)
ASSETS = lifecycle_assets(SPEC)
DEFS = Definitions(assets=ASSETS, resources={"gpu_pool": GpuPoolResource()})
FAST = {"ops": {"t1__trained_model": {"config": {"epochs": 6}}}}
STEPS_PER_EPOCH = 23  # 1,437 training rows in global batches of 64


def key(name: str, tenant: str = "t1") -> AssetKey:
    return AssetKey([tenant, name])


def selection(*names: str) -> list[AssetKey]:
    return [key(n) for n in names]


def training(epochs: int) -> dict:
    return {"ops": {"t1__trained_model": {"config": {"epochs": epochs}}}}


def metadata(result, name: str) -> dict:
    [event] = result.asset_materializations_for_node(f"t1__{name}")
    return {k: v.value for k, v in event.metadata.items()}


class Lab:
    """A test instance and the platform resource of a small test platform; `materialize` uses both."""

    def __init__(self, instance: DagsterInstance, gpu_pool: GpuPoolResource) -> None:
        self.instance = instance
        self.gpu_pool = gpu_pool

    def materialize(self, names: tuple[str, ...] = (), **kwargs):  # type: ignore[no-untyped-def]
        chosen = {"selection": selection(*names)} if names else {}
        return materialize(ASSETS, instance=self.instance, resources={"gpu_pool": self.gpu_pool}, **chosen, **kwargs)


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    with instance_for_test() as instance:
        yield Lab(instance, GpuPoolResource(config_path=str(write_live_platform(tmp_path))))


@pytest.mark.parametrize(
    ("defs", "tenant"),
    [pytest.param(research, "research", id="research"), pytest.param(product, "product", id="product")],
)
def test_each_tenant_location_loads_its_lifecycle_jobs_and_schedule(defs: Definitions, tenant: str) -> None:
    Definitions.validate_loadable(defs)
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    lifecycle = {
        f"{tenant}/{n}" for n in ("training_dataset", "trained_model", "model_evaluation", "inference_service")
    }
    assert lifecycle <= keys
    assert {j.name for j in defs.resolve_all_job_defs()} >= {"lifecycle", "retraining", "inference_replica"}
    assert defs.resolve_schedule_def("weekly_retraining").cron_schedule == "0 3 * * 0"


@pytest.mark.parametrize("defs", [pytest.param(research, id="research"), pytest.param(product, id="product")])
def test_declarative_automation_runs_by_default_over_every_asset_of_the_location(defs: Definitions) -> None:
    repository = defs.get_repository_def()
    automation = [s for s in repository.sensor_defs if s.sensor_type == SensorType.AUTO_MATERIALIZE]
    assert [(s.name, s.default_status) for s in automation] == [("xirang_automation", DefaultSensorStatus.RUNNING)]
    [sensor] = automation
    graph = repository.asset_graph
    automated = {k for k in graph.get_all_asset_keys() if graph.get(k).automation_condition is not None}
    assert automated
    assert automated <= sensor.asset_selection.resolve(graph)  # Dagster adds no STOPPED default sensor


def test_only_the_research_location_holds_the_platform_assets() -> None:
    research_keys = research.resolve_asset_graph().get_all_asset_keys()
    product_keys = product.resolve_asset_graph().get_all_asset_keys()
    assert {AssetKey("gpu_pool"), AssetKey("trace_replay")} <= research_keys
    assert not {AssetKey("gpu_pool"), AssetKey("trace_replay")} & product_keys


@pytest.mark.parametrize(
    ("spec", "name", "expected"),
    [
        pytest.param(
            RESEARCH, "trained_model", {"xirang/tier": "online-training", "xirang/gpus": "4"}, id="training-gang"
        ),
        pytest.param(
            PRODUCT, "trained_model", {"xirang/tier": "online-training", "xirang/gpus": "2"}, id="product-gang"
        ),
        pytest.param(
            RESEARCH,
            "model_evaluation",
            {"xirang/tier": "batch-inference", "xirang/gpu-milli": "250"},
            id="eval-fraction",
        ),
        pytest.param(
            PRODUCT, "inference_service", {"xirang/tier": "inference", "xirang/gpu-milli": "250"}, id="serving"
        ),
        pytest.param(
            RESEARCH, "architecture_sweep", {"xirang/tier": "offline-training", "xirang/gpus": "2"}, id="sweep"
        ),
    ],
)
def test_assets_declare_their_tier_project_and_gpus_as_tags(spec: LifecycleSpec, name: str, expected: dict) -> None:
    defs = research if spec is RESEARCH else product
    tags = defs.resolve_asset_graph().get(AssetKey([spec.tenant, name])).tags
    assert tags == {**expected, "xirang/project": spec.project}


def test_the_dataset_asks_for_no_gpu() -> None:
    assert not research.resolve_asset_graph().get(key("training_dataset", "research")).tags


def test_lifecycle_materializes_a_model_that_passes_and_deploys_it(lab: Lab) -> None:
    result = lab.materialize(run_config=FAST)
    assert result.success
    dataset = metadata(result, "training_dataset")
    assert (dataset["train_rows"], dataset["test_rows"], dataset["features"]) == (1437, 360, 64)
    trained = metadata(result, "trained_model")
    assert (trained["resumed_from_step"], trained["steps_run_here"]) == (0, 6 * STEPS_PER_EPOCH)
    assert trained["world_size"] == 1  # materialized outside the platform: no allocation, one worker
    evaluation = metadata(result, "model_evaluation")
    assert evaluation["passed"] is True
    assert evaluation["accuracy"] >= 0.9
    service = current_service(lab.instance.storage_directory(), "t1")
    assert service is not None
    assert service.version == 1
    assert service.model_run_id == result.run_id
    assert metadata(result, "inference_service")["version"] == 1


def test_a_second_deployment_is_the_next_version(lab: Lab) -> None:
    lab.materialize(run_config=FAST)
    second = lab.materialize(run_config=FAST)
    assert metadata(second, "inference_service")["version"] == 2
    assert current_service(lab.instance.storage_directory(), "t1").model_run_id == second.run_id


def test_a_model_under_the_threshold_fails_its_check_and_is_not_deployed(lab: Lab) -> None:
    config = {"ops": {**FAST["ops"], "t1__model_evaluation": {"config": {"accuracy_threshold": 0.9999}}}}
    result = lab.materialize(run_config=config, raise_on_error=False)
    [check] = result.get_asset_check_evaluations()
    assert not check.passed
    assert not result.asset_materializations_for_node("t1__inference_service")
    assert current_service(lab.instance.storage_directory(), "t1") is None


def checkpoint_steps(lab: Lab, run_id: str) -> list[str]:
    """The steps the run reported as saved checkpoints (`GpuPoolResource.checkpointed`), in order."""
    said = "checkpoint saved at step "
    return [
        m.split(said, 1)[1].split(":", 1)[0] for m in (e.message for e in lab.instance.all_logs(run_id)) if said in m
    ]


def test_a_resumed_training_continues_from_its_parents_checkpoint_and_reports_each_to_the_pool(lab: Lab) -> None:
    data = lab.materialize(("training_dataset",))
    preempted = lab.materialize(("trained_model",), run_config=training(3))
    resumed = lab.materialize(("trained_model",), run_config=training(6), tags={rt.PARENT_RUN: preempted.run_id})
    meta = metadata(resumed, "trained_model")
    assert (meta["resumed_from_step"], meta["steps_run_here"]) == (3 * STEPS_PER_EPOCH, 3 * STEPS_PER_EPOCH)
    assert checkpoint_steps(lab, preempted.run_id) == [str(e * STEPS_PER_EPOCH) for e in (1, 2, 3)]
    assert checkpoint_steps(lab, resumed.run_id) == [str(e * STEPS_PER_EPOCH) for e in (4, 5, 6)]
    straight = lab.materialize(("trained_model",), run_config=training(6))
    assert metadata(straight, "trained_model")["resumed_from_step"] == 0
    assert data.success
    resumed_model = resumed.output_for_node("t1__trained_model")["model"]
    straight_model = straight.output_for_node("t1__trained_model")["model"]
    for a, b in zip(resumed_model.weights, straight_model.weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_resumption_of_a_resumption_still_reads_the_first_runs_checkpoint(lab: Lab) -> None:
    lab.materialize(("training_dataset",))
    first = lab.materialize(("trained_model",), run_config=training(2))
    second = lab.materialize(("trained_model",), run_config=training(4), tags={rt.PARENT_RUN: first.run_id})
    third = lab.materialize(("trained_model",), run_config=training(5), tags={rt.PARENT_RUN: second.run_id})
    assert metadata(third, "trained_model")["resumed_from_step"] == 4 * STEPS_PER_EPOCH


@pytest.mark.parametrize(
    ("threshold", "deploys"),
    [pytest.param(0.5, 1, id="passing-model-redeploys"), pytest.param(0.9999, 0, id="failing-model-does-not")],
)
def test_automation_redeploys_only_a_newly_evaluated_model_that_passes(
    lab: Lab, threshold: float, deploys: int
) -> None:
    first = evaluate_automation_conditions(defs=DEFS, instance=lab.instance)
    config = {"ops": {**FAST["ops"], "t1__model_evaluation": {"config": {"accuracy_threshold": threshold}}}}
    names = ("training_dataset", "trained_model", "model_evaluation")
    lab.materialize(names, run_config=config, raise_on_error=False)
    after = evaluate_automation_conditions(defs=DEFS, instance=lab.instance, cursor=first.cursor)
    assert after.get_num_requested(key("inference_service")) == deploys
    assert after.get_num_requested(key("model_evaluation")) == 0


def test_automation_evaluates_a_newly_trained_model(lab: Lab) -> None:
    first = evaluate_automation_conditions(defs=DEFS, instance=lab.instance)
    lab.materialize(
        (
            "training_dataset",
            "trained_model",
        ),
        run_config=FAST,
    )
    after = evaluate_automation_conditions(defs=DEFS, instance=lab.instance, cursor=first.cursor)
    assert after.get_num_requested(key("model_evaluation")) == 1
    assert after.get_num_requested(key("trained_model")) == 0


def test_the_retraining_schedule_requests_training_and_evaluation_on_sunday_night() -> None:
    schedule = retraining_schedule(SPEC)
    defs = Definitions(assets=ASSETS, schedules=[schedule], resources={"gpu_pool": GpuPoolResource()})
    sunday = datetime(2026, 11, 29, 3, 0, tzinfo=UTC)
    with instance_for_test() as inst:
        context = build_schedule_context(
            instance=inst, scheduled_execution_time=sunday, repository_def=defs.get_repository_def()
        )
        data = defs.resolve_schedule_def("weekly_retraining").evaluate_tick(context)
    [request] = data.run_requests
    assert request.job_name in (None, "retraining")
    job = defs.resolve_job_def("retraining")
    assert set(job.asset_layer.selected_asset_keys) == set(
        selection("training_dataset", "trained_model", "model_evaluation")
    )
    next_tick = schedule.execution_timezone, schedule.cron_schedule
    assert next_tick == ("UTC", "0 3 * * 0")


def allocated(gpus: int) -> dict[str, str]:
    """The allocation tag the tick writes on a run admitted on `gpus` whole H100s of one node."""
    request = Request("r", "t1", "p1", Tier.ONLINE_TRAINING, 0.0, gpus=gpus)
    placement = Placement(
        tuple(GpuSlice("h100-00", g, 1000, 81920) for g in range(gpus)), (NodeShare("h100-00", 4000, 8192),)
    )
    return {rt.ALLOCATION: run_allocation.allocation_tag(Allocation(request, placement, 0.0), False, "local")}


def notice_after_first_checkpoint(instance: DagsterInstance, ended: threading.Event) -> None:
    """Wait until a started run has saved its first checkpoint, then give it the tick's notice tag
    (what the tick does to a victim); gives up once the run `ended` without one."""
    while not ended.is_set():
        for run in instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.STARTED])):
            if any("checkpoint of step" in e.message for e in instance.all_logs(run.run_id)):
                notice = Notice(by="preemptor", reason="priority", grace_s=120.0, at=time.time())
                instance.add_run_tags(run.run_id, {rt.NOTICE: notice.tag()})
                return
        time.sleep(0.1)


def test_training_runs_one_worker_per_allocated_gpu_and_resumes_at_its_new_size_after_the_notice(lab: Lab) -> None:
    lab.materialize(("training_dataset",))
    paced = {"ops": {"t1__trained_model": {"config": {"epochs": 3, "epoch_pause_s": 600.0}}}}
    ended = threading.Event()
    notice = threading.Thread(target=notice_after_first_checkpoint, args=(lab.instance, ended), daemon=True)
    notice.start()
    stopped = lab.materialize(("trained_model",), run_config=paced, tags=allocated(2), raise_on_error=False)
    ended.set()
    notice.join()
    assert not stopped.success
    said = [e.message for e in lab.instance.all_logs(stopped.run_id)]
    assert any("training on 2 worker(s) (gloo)" in m for m in said)
    assert any(m.startswith("preemption notice taken: the checkpoint of step 23 saved") for m in said)

    resumed = lab.materialize(
        ("trained_model",), run_config=training(3), tags={**allocated(3), rt.PARENT_RUN: stopped.run_id}
    )

    meta = metadata(resumed, "trained_model")
    assert (meta["world_size"], meta["resumed_from_step"], meta["steps_run_here"]) == (3, 23, 46)
    assert (meta["global_batch"], meta["rank_batches"], meta["learning_rate"]) == (64, "[22, 21, 21]", 0.01)


def test_a_resumption_with_another_global_batch_is_refused_and_leaves_the_checkpoint(lab: Lab) -> None:
    lab.materialize(("training_dataset",))
    first = lab.materialize(("trained_model",), run_config=training(1))
    checkpoint = Path(metadata(first, "trained_model")["checkpoint"])
    before = checkpoint.read_bytes()
    other_batch = {"ops": {"t1__trained_model": {"config": {"epochs": 2, "global_batch": 32}}}}

    refused = lab.materialize(
        ("trained_model",), run_config=other_batch, tags={rt.PARENT_RUN: first.run_id}, raise_on_error=False
    )

    assert not refused.success
    [failure] = [e for e in refused.all_events if e.event_type_value == "STEP_FAILURE"]
    assert "global_batch 32 (the checkpoint's is 64)" in failure.event_specific_data.error.message
    assert "set the checkpoint's values, or materialize as a new run" in failure.event_specific_data.error.message
    assert checkpoint.read_bytes() == before
