"""A small test `Definitions` for the engine suite, loaded by real gRPC code servers as two code
locations (`research_defs` as `research`, `product_defs` as `product`).

Each op ends as its run's `test/outcome` tag says: `success` (the default) at once, `fail` by
raising, `wait` by holding the run open until the test drops a flag file named after the run
(`$XIRANG_TEST_FLAGS/<run_id>.done` to succeed, `.fail` to fail); a terminated run is interrupted
while it waits; `ignore-notice` waits the same way but takes its termination as a preemption notice
(`GpuPoolResource.on_preemption`) and ignores it, so only the kill at the end of its grace stops it.
`notice_train_job` is the platform's own training loop (`assets/training.py`), which saves a
checkpoint and stops on its notice; `elastic_train_job` is the lifecycle's data-parallel training
under `torchrun` (`assets/distributed_training.py`) as an elastic run of 1 to 2 H100s, one worker per
GPU it holds, pausing after each epoch until a notice comes. The platform config and the ledger come from
`XIRANG_CONFIG` and `XIRANG_LEDGER_URL`, set by the test before the servers start.
"""

# No `from __future__ import annotations`: Dagster reads the context and resource annotations at runtime.

import os
import time
from collections.abc import Callable
from pathlib import Path

from dagster import (
    AssetExecutionContext,
    Config,
    Definitions,
    OpExecutionContext,
    asset,
    define_asset_job,
    in_process_executor,
    job,
    op,
)

from resources.gpu_pool import GpuPoolResource
from sensors.factory import platform_sensors
from xirang_platform.dagster_defs.assets import training
from xirang_platform.dagster_defs.assets.distributed_training import train_data_parallel
from xirang_platform.training.digits import digits_split
from xirang_platform.training.launch import TrainingSettings

FLAGS_ENV = "XIRANG_TEST_FLAGS"
POLL_S = 0.05


OUTCOME_TAG = "test/outcome"
STOP_ALL = "all.fail"  # dropped when a test ends: every run still waiting fails, so servers can stop


IGNORING = "holding the notice handler and ignoring any notice"
NOTICE_IGNORED = "has its preemption notice and goes on"
SETTING_UP = "setting up before the training loop"


def end_as_told(context, gpu_pool: GpuPoolResource | None = None) -> None:  # type: ignore[no-untyped-def]
    """Succeed, fail or wait, as the run's `test/outcome` tag says."""
    outcome = context.run.tags.get(OUTCOME_TAG, "success")
    if outcome == "fail":
        raise RuntimeError(f"run {context.run_id} fails on purpose ({OUTCOME_TAG}=fail)")
    if outcome == "wait":
        wait_for_flag(context.run_id)
    if outcome == "ignore-notice" and gpu_pool is not None:
        with gpu_pool.on_preemption(context):
            context.log.info(IGNORING)
            noticed = False

            def say_once_noticed() -> None:
                nonlocal noticed
                if not noticed and gpu_pool.preemption_requested(context):
                    context.log.info(NOTICE_IGNORED)  # what the test waits for before it checks the run goes on
                    noticed = True

            wait_for_flag(context.run_id, say_once_noticed)


def wait_for_flag(run_id: str, each_poll: Callable[[], None] = lambda: None) -> None:
    """Block until the test says how run `run_id` ends, calling `each_poll` as it waits."""
    flags = Path(os.environ[FLAGS_ENV])
    while True:
        if (flags / f"{run_id}.done").exists():
            return
        if (flags / f"{run_id}.fail").exists() or (flags / STOP_ALL).exists():
            raise RuntimeError(f"run {run_id} failed on purpose (flag file)")
        each_poll()
        time.sleep(POLL_S)


class PrepConfig(Config):
    rows: int = 1


class TrainConfig(Config):
    epochs: int = 1


@asset
def prep(context: AssetExecutionContext, config: PrepConfig) -> int:
    """A CPU step before training (asks for no GPU); logs its run config."""
    context.log.info(f"prep rows={config.rows}")
    return 1


@asset(tags={"xirang/tier": "offline-training", "xirang/gpus": "8", "xirang/project": "llm"})
def train(context: AssetExecutionContext, config: TrainConfig, gpu_pool: GpuPoolResource, prep: int) -> int:
    """Training on 8 GPUs: records the allocation it got and its run config, then waits for the test."""
    alloc = gpu_pool.allocation(context)
    context.log.info(f"train epochs={config.epochs}")
    context.log.info(f"allocation: {alloc}; CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}")
    end_as_told(context)
    return prep + 1


@op
def work(context: OpExecutionContext, gpu_pool: GpuPoolResource) -> None:
    """Whatever the run's tags ask for; waits for the test."""
    context.log.info(f"allocation: {gpu_pool.allocation(context)}")
    end_as_told(context, gpu_pool)


@job(executor_def=in_process_executor)
def gpu_job() -> None:
    work()


train_job = define_asset_job("train_job", selection=["prep", "train"], executor_def=in_process_executor)


class NoticeTrainConfig(Config):
    epochs: int = 40
    epoch_pause_s: float = 0.25
    setup_s: float = 0.0  # a setup before the loop (loading data, say), cut short by the notice


@asset(tags={"xirang/tier": "offline-training", "xirang/gpus": "8", "xirang/project": "llm"})
def notice_train(
    context: AssetExecutionContext, config: NoticeTrainConfig, gpu_pool: GpuPoolResource, prep: int
) -> int:
    """The platform's training loop (digits MLP, a checkpoint per epoch, stops on its notice), after
    a setup of `setup_s` during which it takes its notice too (it logs `SETTING_UP` first)."""
    with gpu_pool.on_preemption(context):
        context.log.info(SETTING_UP)
        gpu_pool.pause(context, config.setup_s)
        trained = training.train(
            context,
            digits_split(),
            epochs=config.epochs,
            hidden_units=16,
            learning_rate=0.01,
            seed=3,
            epoch_pause_s=config.epoch_pause_s,
            gpu_pool=gpu_pool,
        )
    return trained.epochs


notice_train_job = define_asset_job(
    "notice_train_job", selection=["prep", "notice_train"], executor_def=in_process_executor
)


class ElasticTrainConfig(Config):
    epochs: int = 3
    epoch_pause_s: float = 600.0  # after each epoch, cut short by the notice: each resize lands between epochs


ELASTIC_TAGS = {
    "xirang/tier": "offline-training",
    "xirang/project": "llm",
    "xirang/gpus-min": "1",
    "xirang/gpus-max": "2",
    "xirang/gpu-model": "H100-SXM",
}


@asset(tags=ELASTIC_TAGS)
def elastic_train(
    context: AssetExecutionContext, config: ElasticTrainConfig, gpu_pool: GpuPoolResource, prep: int
) -> int:
    """Data-parallel training, one `torchrun` worker per GPU of the run's allocation, from the lineage's
    checkpoint; returns the steps this launch ran."""
    settings = TrainingSettings(
        epochs=config.epochs,
        global_batch=64,
        hidden_units=16,
        learning_rate=0.01,
        seed=3,
        epoch_pause_s=config.epoch_pause_s,
    )
    trained = train_data_parallel(context, digits_split(), settings, gpu_pool)
    context.add_output_metadata(trained.metadata())
    return trained.steps_run


elastic_train_job = define_asset_job(
    "elastic_train_job", selection=["prep", "elastic_train"], executor_def=in_process_executor
)


def location_defs(location: str) -> Definitions:
    """The definitions of one code location, with the platform's sensors for it."""
    return Definitions(
        assets=[prep, train, notice_train, elastic_train],
        jobs=[gpu_job, train_job, notice_train_job, elastic_train_job],
        sensors=platform_sensors(location, jobs=[gpu_job]),
        resources={"gpu_pool": GpuPoolResource()},
        executor=in_process_executor,
    )


research_defs = location_defs("research")
product_defs = location_defs("product")
