"""The definitions load; the lifecycle assets do real work, resume from checkpoints, and automate deployment."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from dagster import (
    AssetKey,
    DagsterInstance,
    DefaultSensorStatus,
    Definitions,
    build_schedule_context,
    evaluate_automation_conditions,
    instance_for_test,
    materialize,
)

from resources.gpu_pool import GpuPoolResource
from xirang_platform.dagster_compat import SensorType
from xirang_platform.dagster_defs.assets.lifecycle import LifecycleSpec, lifecycle_assets, retraining_schedule
from xirang_platform.dagster_defs.assets.serving import current_service
from xirang_platform.definitions import PRODUCT, RESEARCH, product, research
from xirang_platform.devtools.live_scene import write_live_platform
from xirang_platform.platform import run_tags as rt

SPEC = LifecycleSpec(tenant="t1", project="p1", training_gpus=2)
ASSETS = lifecycle_assets(SPEC)
DEFS = Definitions(assets=ASSETS, resources={"gpu_pool": GpuPoolResource()})
FAST = {"ops": {"t1__trained_model": {"config": {"epochs": 6}}}}


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
    assert trained["epochs_run_here"] == 6
    assert trained["resumed_from_epoch"] == 0
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


def test_a_resumed_training_continues_from_its_parents_checkpoint(lab: Lab) -> None:
    data = lab.materialize(("training_dataset",))
    preempted = lab.materialize(("trained_model",), run_config=training(3))
    resumed = lab.materialize(("trained_model",), run_config=training(6), tags={rt.PARENT_RUN: preempted.run_id})
    meta = metadata(resumed, "trained_model")
    assert (meta["resumed_from_epoch"], meta["epochs_run_here"]) == (3, 3)
    straight = lab.materialize(("trained_model",), run_config=training(6))
    assert metadata(straight, "trained_model")["resumed_from_epoch"] == 0
    assert data.success
    with open(meta["checkpoint"], "rb") as f:
        resumed_model = pickle.load(f)["model"]
    with open(metadata(straight, "trained_model")["checkpoint"], "rb") as f:
        straight_model = pickle.load(f)["model"]
    for a, b in zip(resumed_model.coefs_, straight_model.coefs_, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_resumption_of_a_resumption_still_reads_the_first_runs_checkpoint(lab: Lab) -> None:
    lab.materialize(("training_dataset",))
    first = lab.materialize(("trained_model",), run_config=training(2))
    second = lab.materialize(("trained_model",), run_config=training(4), tags={rt.PARENT_RUN: first.run_id})
    third = lab.materialize(("trained_model",), run_config=training(5), tags={rt.PARENT_RUN: second.run_id})
    assert metadata(third, "trained_model")["resumed_from_epoch"] == 4


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


def checkpoint_steps(lab: Lab, run_id: str) -> list[str]:
    """The steps the run reported as saved checkpoints (`GpuPoolResource.checkpointed`), in order."""
    said = "checkpoint saved at step "
    return [
        m.split(said, 1)[1].split(":", 1)[0] for m in (e.message for e in lab.instance.all_logs(run_id)) if said in m
    ]


def test_training_reports_every_epochs_checkpoint_to_the_pool(lab: Lab) -> None:
    lab.materialize(("training_dataset",))
    first = lab.materialize(("trained_model",), run_config=training(3))
    resumed = lab.materialize(("trained_model",), run_config=training(5), tags={rt.PARENT_RUN: first.run_id})
    assert checkpoint_steps(lab, first.run_id) == ["1", "2", "3"]
    assert checkpoint_steps(lab, resumed.run_id) == ["4", "5"]
