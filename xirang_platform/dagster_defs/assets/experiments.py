"""Offline experiments: preemptible training that fills idle GPUs (tier `offline-training`).

`architecture_sweep` trains a few network widths on the lifecycle's dataset and reports the best one.
It is the batch work that inference and online training preempt; each candidate checkpoints every
epoch, so a resumed sweep continues the candidate it was on and skips the finished ones.
"""

# No `from __future__ import annotations`: Dagster reads the config and context annotations at runtime.

from dagster import AssetExecutionContext, AssetsDefinition, Config, MaterializeResult, asset

from resources.gpu_pool import GpuPoolResource
from xirang_platform.dagster_defs.assets.admission import admission_metadata, gpu_tags
from xirang_platform.dagster_defs.assets.lifecycle import LifecycleSpec
from xirang_platform.dagster_defs.assets.training import accuracy, train
from xirang_platform.training.digits import digits_split

EXPERIMENTS_GROUP = "experiments"


class SweepConfig(Config):
    """The widths to try and how long each trains (`epoch_pause_s` paces epochs, for demos)."""

    widths: list[int] = [16, 32, 64]
    epochs: int = 20
    seed: int = 11
    epoch_pause_s: float = 0.0


def sweep_asset(spec: LifecycleSpec, gpus: int = 2) -> AssetsDefinition:
    """An offline sweep over hidden-layer widths for `spec`'s tenant, on `gpus` whole GPUs."""

    @asset(
        key_prefix=[spec.tenant],
        group_name=EXPERIMENTS_GROUP,
        tags=gpu_tags("offline-training", spec.project, gpus=gpus),
    )
    def architecture_sweep(
        context: AssetExecutionContext, config: SweepConfig, gpu_pool: GpuPoolResource
    ) -> MaterializeResult:
        """Train each width with checkpoints and report held-out accuracy per width."""
        # Notices are taken from the first line: one that comes while the data loads, or between two
        # widths, stops the sweep at the next width's first check instead of losing the run's work.
        with gpu_pool.on_preemption(context):
            data = digits_split()
            scores: dict[str, float] = {}
            for width in config.widths:
                trained = train(
                    context,
                    data,
                    epochs=config.epochs,
                    hidden_units=width,
                    learning_rate=0.01,
                    seed=config.seed,
                    epoch_pause_s=config.epoch_pause_s,
                    gpu_pool=gpu_pool,
                    name=f"w{width}",
                )
                scores[str(width)] = accuracy(trained.model, data["x_test"], data["y_test"])
        best = max(scores, key=lambda w: (scores[w], -int(w)))
        return MaterializeResult(
            metadata={"best_width": int(best), "best_accuracy": scores[best], **admission_metadata(context, gpu_pool)}
        )

    return architecture_sweep
