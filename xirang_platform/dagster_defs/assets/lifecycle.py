"""The model lifecycle of one tenant (DESIGN.md section 7): data -> trained model -> evaluation -> service.

`training_dataset` -> `trained_model` (online training, a gang of GPUs) -> `model_evaluation` (batch
inference, a fraction of a GPU) -> `inference_service` (inference: deploys the evaluated model to the
serving replicas). Each asset declares its needs with the `xirang/*` asset tags, so a run started by a
click, the retraining schedule or declarative automation is admitted by the platform the same way.

On the embedded default the work is real and small: a multilayer perceptron learns scikit-learn's
bundled handwritten digits. `trained_model` trains it data-parallel with PyTorch: `torchrun` starts
one worker per GPU of the run's allocation (gloo on CPU, NCCL on GPUs; `distributed_training.py`).
Rank 0 saves a `torch.save` checkpoint after every epoch and on the run's preemption notice under the
instance's storage, keyed by the run's root run, so a preempted or resized training resumed by the
platform continues from the step after its checkpoint at whatever world size it is given, with the
same global batch and learning rate (`xirang_platform/training/plan.py`; docs/elastic-training.md).
"""

# No `from __future__ import annotations`: Dagster reads the config and context annotations at runtime.

from dataclasses import dataclass

from dagster import (
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    AssetSelection,
    AutomationCondition,
    AutomationConditionSensorDefinition,
    Config,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    MaterializeResult,
    MetadataValue,
    ScheduleDefinition,
    asset,
    asset_check,
    define_asset_job,
)

from resources.gpu_pool import GpuPoolResource
from xirang_platform.dagster_compat import UnresolvedAssetJobDefinition
from xirang_platform.dagster_defs.assets.admission import admission_metadata, gpu_tags
from xirang_platform.dagster_defs.assets.distributed_training import train_data_parallel
from xirang_platform.dagster_defs.assets.serving import deploy
from xirang_platform.dagster_defs.assets.training import accuracy
from xirang_platform.training.digits import digits_split
from xirang_platform.training.launch import TrainingSettings

LIFECYCLE_GROUP = "lifecycle"
# Sunday 03:00 UTC: retrain on the week's data while the serving load is lowest.
RETRAIN_CRON = "0 3 * * 0"


@dataclass(frozen=True)
class LifecycleSpec:
    """What one tenant's lifecycle asks for: who pays and how much of the pool each step needs."""

    tenant: str
    project: str
    training_gpus: int = 2
    evaluation_milli: int = 250
    serving_milli: int = 250
    accuracy_threshold: float = 0.9


class TrainingConfig(Config):
    """How the model is trained: `global_batch` rows per optimizer step over all workers, kept at any
    world size (each rank takes its share), and the learning rate for it, which a resize leaves as it
    is. `epoch_pause_s` paces epochs (demos: leaves time to preempt). A resumption keeps its lineage's
    `global_batch`, `hidden_units` and `seed` (a checkpoint trained with others is refused)."""

    epochs: int = 20
    global_batch: int = 64
    hidden_units: int = 64
    learning_rate: float = 0.01
    seed: int = 7
    epoch_pause_s: float = 0.0


class EvaluationConfig(Config):
    """The accuracy a model must reach on held-out digits to be deployed (0 = the spec's default)."""

    accuracy_threshold: float = 0.0


def lifecycle_assets(spec: LifecycleSpec) -> list[AssetsDefinition | AssetChecksDefinition]:
    """The four lifecycle assets and the evaluation's blocking threshold check, keyed under the tenant."""
    prefix = [spec.tenant]

    @asset(key_prefix=prefix, group_name=LIFECYCLE_GROUP)
    def training_dataset(context: AssetExecutionContext) -> dict:
        """Handwritten digits (scikit-learn's bundled copy), scaled and split 80/20, stratified (CPU only)."""
        data = digits_split()
        context.add_output_metadata(
            {"train_rows": len(data["y_train"]), "test_rows": len(data["y_test"]), "features": data["x_train"].shape[1]}
        )
        return data

    @asset(
        key_prefix=prefix,
        group_name=LIFECYCLE_GROUP,
        tags=gpu_tags("online-training", spec.project, gpus=spec.training_gpus),
    )
    def trained_model(
        context: AssetExecutionContext, config: TrainingConfig, gpu_pool: GpuPoolResource, training_dataset: dict
    ) -> dict:
        """An MLP trained data-parallel, one `torchrun` worker per allocated GPU; checkpointed every epoch
        and on the notice, and a resumed run continues from the step after its checkpoint at its own size."""
        trained = train_data_parallel(
            context,
            training_dataset,
            TrainingSettings(
                epochs=config.epochs,
                global_batch=config.global_batch,
                hidden_units=config.hidden_units,
                learning_rate=config.learning_rate,
                seed=config.seed,
                epoch_pause_s=config.epoch_pause_s,
            ),
            gpu_pool,
        )
        x, y = training_dataset["x_train"], training_dataset["y_train"]
        context.add_output_metadata(
            {
                "epochs": config.epochs,
                **trained.metadata(),
                "train_accuracy": accuracy(trained.model, x, y),
                "checkpoint": MetadataValue.path(str(trained.checkpoint)),
                **admission_metadata(context, gpu_pool),
            }
        )
        return {"model": trained.model, "epochs": config.epochs, "run_id": context.run.run_id}

    @asset(
        key_prefix=prefix,
        group_name=LIFECYCLE_GROUP,
        tags=gpu_tags("batch-inference", spec.project, milli=spec.evaluation_milli),
        automation_condition=AutomationCondition.eager(),
    )
    def model_evaluation(
        context: AssetExecutionContext,
        config: EvaluationConfig,
        gpu_pool: GpuPoolResource,
        training_dataset: dict,
        trained_model: dict,
    ) -> dict:
        """Batch inference over the held-out digits: accuracy against the deployment threshold."""
        threshold = config.accuracy_threshold or spec.accuracy_threshold
        score = accuracy(trained_model["model"], training_dataset["x_test"], training_dataset["y_test"])
        passed = score >= threshold
        context.add_output_metadata(
            {"accuracy": score, "threshold": threshold, "passed": passed, **admission_metadata(context, gpu_pool)}
        )
        return {"accuracy": score, "threshold": threshold, "passed": passed, "model_run_id": trained_model["run_id"]}

    @asset_check(asset=model_evaluation, blocking=True, name="passes_threshold")
    def passes_threshold(context, model_evaluation: dict) -> AssetCheckResult:
        """Blocks deployment of a model whose held-out accuracy is under the threshold."""
        return AssetCheckResult(
            passed=bool(model_evaluation["passed"]),
            severity=AssetCheckSeverity.ERROR,
            metadata={"accuracy": model_evaluation["accuracy"], "threshold": model_evaluation["threshold"]},
            description=f"accuracy {model_evaluation['accuracy']:.3f}, threshold {model_evaluation['threshold']:.3f}",
        )

    @asset(
        key_prefix=prefix,
        group_name=LIFECYCLE_GROUP,
        tags=gpu_tags("inference", spec.project, milli=spec.serving_milli),
        automation_condition=AutomationCondition.eager() & AutomationCondition.all_deps_blocking_checks_passed(),
    )
    def inference_service(
        context: AssetExecutionContext, gpu_pool: GpuPoolResource, trained_model: dict, model_evaluation: dict
    ) -> MaterializeResult:
        """Deploy the evaluated model: smoke-test it, then point the serving replicas at the new version."""
        if not model_evaluation["passed"]:
            raise ValueError(
                f"model of run {trained_model['run_id']} scored {model_evaluation['accuracy']:.3f} under the "
                f"threshold {model_evaluation['threshold']:.3f}: retrain it (or lower the threshold) before deploying"
            )
        service = deploy(
            context.instance.storage_directory(), spec.tenant, trained_model["model"], trained_model["run_id"]
        )
        return MaterializeResult(
            metadata={
                "model_run_id": trained_model["run_id"],
                "accuracy": model_evaluation["accuracy"],
                "version": service.version,
                "replicas": service.replicas,
                "model_path": MetadataValue.path(str(service.model_path)),
                **admission_metadata(context, gpu_pool),
            }
        )

    return [training_dataset, trained_model, model_evaluation, passes_threshold, inference_service]


def lifecycle_job(spec: LifecycleSpec) -> UnresolvedAssetJobDefinition:
    """The whole lifecycle in one run: data, training, evaluation and deployment."""
    return define_asset_job(
        "lifecycle",
        selection=AssetSelection.groups(LIFECYCLE_GROUP),
        description=f"{spec.tenant}'s lifecycle: dataset, training, evaluation, deployment",
    )


def retraining_job(spec: LifecycleSpec) -> UnresolvedAssetJobDefinition:
    """Retraining: data, training and evaluation; deployment follows by automation when the model passes."""
    keys = [AssetKey([spec.tenant, name]) for name in ("training_dataset", "trained_model", "model_evaluation")]
    return define_asset_job("retraining", selection=AssetSelection.assets(*keys))


def retraining_schedule(spec: LifecycleSpec) -> ScheduleDefinition:
    """Weekly retraining (Sunday 03:00 UTC); running by default so `make run` shows it ticking."""
    return ScheduleDefinition(
        name="weekly_retraining",
        job=retraining_job(spec),
        cron_schedule=RETRAIN_CRON,
        execution_timezone="UTC",
        default_status=DefaultScheduleStatus.RUNNING,
    )


def automation_sensor() -> AutomationConditionSensorDefinition:
    """Declarative automation for every asset of the code location, running by default: Dagster's own
    default automation sensor starts STOPPED, so without this a model that passed its evaluation
    was never deployed and no rollout followed (the autoscaling sensor rolls the replicas out)."""
    return AutomationConditionSensorDefinition(
        "xirang_automation",
        target=AssetSelection.all(),
        default_status=DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=30,
        description="evaluates the lifecycle's automation conditions: a passing evaluation deploys its model",
    )
