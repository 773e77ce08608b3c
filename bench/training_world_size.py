"""The lifecycle's training under `torchrun` at several world sizes (issue 30, item 4): what it costs.

Each world size trains the lifecycle's default `TrainingConfig` (20 epochs of the digits, global batch
64, 64 hidden units) from scratch through `run_training`, the launcher `trained_model` uses, and times
the launch from the command to the end of `torchrun` (`wall_s`), to the workers' `start` line
(`to_start_s`: the interpreters, `import torch`, the rendezvous) and from it to `done` (`train_s`). The
baseline, measured in the same run, is the loop the lifecycle used before: scikit-learn's MLP, one
`partial_fit` per epoch, in process. Every world size must reach the same weights (the global batch is
kept: `max_abs_weight_diff` against the first size) and the evaluation's accuracy threshold. With
`--asset`, each size also materializes the lifecycle's `trained_model` asset in process on a test
instance, its run carrying an allocation of that many GPUs, and reports the step's wall time (Dagster's
STEP_START to STEP_SUCCESS: the launch above plus the step's own work).

    .venv/bin/python bench/training_world_size.py                 # world sizes 1, 2, 4
    .venv/bin/python bench/training_world_size.py --world-sizes 2 --epochs 6
    .venv/bin/python bench/training_world_size.py --asset           # and the Dagster step

Prints one JSON object; target: every world size trains in at most 60 s of wall time on this
machine, so the online-training gang stays short beside the demo's paced runs.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from xirang_platform.training.digits import digits_split, write_rows
from xirang_platform.training.launch import TrainingJob, TrainingSettings, run_training
from xirang_platform.training.predictor import MlpClassifier

TARGET_WALL_S = 60.0
ACCURACY_THRESHOLD = 0.9  # LifecycleSpec.accuracy_threshold


def torchrun_run(data: dict[str, np.ndarray], settings: TrainingSettings, world_size: int) -> dict[str, Any]:
    """One launch from scratch at `world_size`: its times, accuracy and weights."""
    with tempfile.TemporaryDirectory(prefix="bench-training-") as folder:
        job = TrainingJob(write_rows(Path(folder) / "rows.npz", data["x_train"], data["y_train"]),
                          Path(folder) / "model.pt", settings)  # fmt: skip
        seen: dict[str, float] = {}
        began = time.monotonic()
        outcome = run_training(
            job,
            world_size,
            on_line=lambda _line: None,
            on_progress=lambda doc: seen.setdefault(doc["event"], time.monotonic()),
            notice=lambda: False,
        )
        wall = time.monotonic() - began
        if not outcome.done:
            raise SystemExit(f"world size {world_size}: torchrun exited {outcome.returncode}: {outcome.tail}")
        model = MlpClassifier.load(job.model_file)
    return {
        "wall_s": round(wall, 2),
        "to_start_s": round(seen["start"] - began, 2),
        "train_s": round(seen["done"] - seen["start"], 2),
        "steps": outcome.steps_run,
        "accuracy": float(np.mean(model.predict(data["x_test"]) == data["y_test"])),
        "weights": [*model.weights, *model.biases],
    }


def asset_step_s(world_size: int, epochs: int) -> float:
    """Seconds the `trained_model` step of a run holding `world_size` GPUs took (Dagster's own events)."""
    from dagster import AssetKey, DagsterEventType, instance_for_test, materialize

    from resources.gpu_pool import GpuPoolResource
    from xirang_platform.control import run_allocation
    from xirang_platform.control import run_tags as rt
    from xirang_platform.dagster_defs.assets.lifecycle import LifecycleSpec, lifecycle_assets
    from xirang_platform.devtools.live_scene import write_live_platform
    from xirang_platform.scheduling.model import Allocation, GpuSlice, NodeShare, Placement, Request, Tier

    request = Request("bench", "bench", "p", Tier.ONLINE_TRAINING, 0.0, gpus=world_size)
    placement = Placement(
        tuple(GpuSlice("h100-00", g, 1000, 81920) for g in range(world_size)), (NodeShare("h100-00", 4000, 8192),)
    )
    tags = {rt.ALLOCATION: run_allocation.allocation_tag(Allocation(request, placement, 0.0), False, "local")}
    keys = [AssetKey(["bench", "training_dataset"]), AssetKey(["bench", "trained_model"])]
    config = {"ops": {"bench__trained_model": {"config": {"epochs": epochs}}}}
    with tempfile.TemporaryDirectory(prefix="bench-asset-") as folder, instance_for_test() as instance:
        pool = GpuPoolResource(config_path=str(write_live_platform(Path(folder))))
        result = materialize(
            lifecycle_assets(LifecycleSpec("bench", "p")),
            selection=keys,
            instance=instance,
            resources={"gpu_pool": pool},
            run_config=config,
            tags=tags,
        )
        at = {
            e.dagster_event.event_type: e.timestamp
            for e in instance.all_logs(result.run_id)
            if e.step_key == "bench__trained_model"
            and e.dagster_event is not None
            and e.dagster_event.event_type in (DagsterEventType.STEP_START, DagsterEventType.STEP_SUCCESS)
        }
    start, end = at[DagsterEventType.STEP_START], at[DagsterEventType.STEP_SUCCESS]
    return round(end - start, 2)


def sklearn_baseline(data: dict[str, np.ndarray], settings: TrainingSettings) -> dict[str, Any]:
    """The previous lifecycle training: scikit-learn's MLP, one `partial_fit` per epoch, in process."""
    from sklearn.neural_network import MLPClassifier

    began = time.monotonic()
    model = MLPClassifier(
        hidden_layer_sizes=(settings.hidden_units,),
        learning_rate_init=settings.learning_rate,
        random_state=settings.seed,
    )
    x, y = data["x_train"], data["y_train"]
    for epoch in range(1, settings.epochs + 1):
        order = np.random.default_rng([settings.seed, epoch]).permutation(len(y))
        model.partial_fit(x[order], y[order], classes=np.arange(10))
    return {
        "wall_s": round(time.monotonic() - began, 2),
        "accuracy": float(np.mean(model.predict(data["x_test"]) == data["y_test"])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--world-sizes", default="1,2,4", help="comma-separated worker counts")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--asset", action="store_true", help="also time the lifecycle's Dagster step")
    args = parser.parse_args()
    settings = TrainingSettings(epochs=args.epochs, global_batch=64, hidden_units=64, learning_rate=0.01, seed=7)
    data = digits_split()
    runs = {int(w): torchrun_run(data, settings, int(w)) for w in args.world_sizes.split(",")}
    first = next(iter(runs.values()))["weights"]
    for world_size, run in runs.items():
        if args.asset:
            run["asset_step_s"] = asset_step_s(world_size, args.epochs)
        weights = run.pop("weights")
        run["max_abs_weight_diff"] = float(max(np.max(np.abs(a - b)) for a, b in zip(weights, first, strict=True)))
    targets = {
        f"world size {w}: wall <= {TARGET_WALL_S:g} s and accuracy >= {ACCURACY_THRESHOLD}": run["wall_s"]
        <= TARGET_WALL_S
        and run["accuracy"] >= ACCURACY_THRESHOLD
        for w, run in runs.items()
    }
    print(
        json.dumps(
            {
                "epochs": args.epochs,
                "measured_at": datetime.now().astimezone().isoformat(timespec="minutes"),
                "torchrun": runs,
                "baseline_sklearn_in_process": sklearn_baseline(data, settings),
                "targets": targets,
                "all_met": all(targets.values()),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
