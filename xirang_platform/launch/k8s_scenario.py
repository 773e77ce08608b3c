"""`xirang k8s render`'s scripted scenario: requests through the real `cycle`, admissions as objects.

Two cycles on `data/k8s/scenario_pool.yaml`. The first admits whole GPUs, a MIG slice, a fraction
of an L40S, a 12-GPU gang over two H100 nodes, and an inference service of two replicas; the second
admits a third replica (a scale-up). `render` writes every object as YAML, one file per admission,
plus the patches the launcher applies (scale, pin), and returns the paths.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from xirang_platform.launch.k8s import dagster_k8s_config_dict, is_gang, run_objects
from xirang_platform.launch.k8s_gang import gang_objects, pin_plan
from xirang_platform.launch.k8s_pod import Workload, manifest
from xirang_platform.launch.k8s_run_worker import run_worker_job
from xirang_platform.launch.k8s_serve import InferenceService, replica_pin_patch, scale_patch, serve_objects
from xirang_platform.launch.k8s_settings import K8sSettings
from xirang_platform.pool.model import Pool
from xirang_platform.pool.readers import read_pool
from xirang_platform.scheduling.cycle import cycle
from xirang_platform.scheduling.model import Allocation, Request, Tier
from xirang_platform.scheduling.quota import QuotaBook
from xirang_platform.scheduling.snapshot import Snapshot

SCENARIO_POOL = Path(__file__).resolve().parents[2] / "data" / "k8s" / "scenario_pool.yaml"
SERVICE_NAME = "chat"
TRAINER = Workload(command=("torchrun",), args=("--nnodes=$(NNODES)", "--nproc-per-node=$(NPROC_PER_NODE)", "train.py"))
# `xirang serve` (cli/serving.py) in the image: the replica server, its model on a mounted volume.
SERVER = Workload(
    command=("xirang",),
    args=("serve", "--host", "0.0.0.0", "--port", "8000", "--service", SERVICE_NAME, "--model", "/models/model.pkl"),
)


def _request(rid: str, tenant: str, project: str, tier: Tier, **kw: Any) -> Request:
    return Request(rid, tenant, project, tier, submit_time=0.0, cpu_milli=8000, memory_mib=65536, **kw)


def scenario_requests() -> tuple[list[Request], list[Request]]:
    """The requests of the first cycle and of the second (one more inference replica)."""
    h100, a100, l40s = frozenset({"H100-SXM"}), frozenset({"A100-80"}), frozenset({"L40S"})
    replica = {"gpus": 1, "milli_per_gpu": 500, "gpu_memory_mib": 20000, "gpu_models": l40s}
    first = [
        _request("train-whole", "vision", "detector", Tier.ONLINE_TRAINING, gpus=4, gpu_models=h100),
        _request(
            "finetune-mig",
            "nlp",
            "adapters",
            Tier.OFFLINE_TRAINING,
            gpus=1,
            milli_per_gpu=142,
            gpu_memory_mib=9856,
            gpu_models=a100,
        ),
        _request("notebook-frac", "nlp", "research", Tier.OFFLINE_TRAINING, gpus=1, milli_per_gpu=250, gpu_models=l40s),
        _request("pretrain-gang", "vision", "foundation", Tier.ONLINE_TRAINING, gpus=12, gpu_models=h100),
        _request(f"{SERVICE_NAME}-0", "nlp", "chat", Tier.INFERENCE, **replica),
        _request(f"{SERVICE_NAME}-1", "nlp", "chat", Tier.INFERENCE, **replica),
    ]
    second = [_request(f"{SERVICE_NAME}-2", "nlp", "chat", Tier.INFERENCE, **replica)]
    return first, second


def scenario_book() -> QuotaBook:
    """Two tenants with room for everything the scenario asks."""
    return QuotaBook(
        {"vision": 40_000, "nlp": 16_000},
        {(t, p): None for t, p in [("vision", "detector"), ("vision", "foundation")]}
        | {("nlp", p): None for p in ("adapters", "research", "chat")},
    )


@dataclass(frozen=True)
class ScenarioResult:
    """The admissions of each cycle (ids in admission order) and every allocation by id."""

    first: tuple[str, ...]
    second: tuple[str, ...]
    allocations: dict[str, Allocation]


def run_scenario(pool: Pool) -> ScenarioResult:
    """Run the scenario's two cycles through `cycle`; ValueError naming the request if one is held."""
    book = scenario_book()
    first, second = scenario_requests()
    admitted: dict[str, Allocation] = {}
    rounds = []
    for now, pending in ((0.0, first), (60.0, second)):
        result = cycle(Snapshot.build(pool, admitted.values(), book), pending, now)
        if result.holds:
            hold = result.holds[0]
            raise ValueError(f"scenario request {hold.request_id} was held ({hold.reason}): {hold.message}")
        rounds.append(tuple(a.request_id for a in result.admits))
        admitted.update({a.request_id: a.allocation for a in result.admits})
    return ScenarioResult(rounds[0], rounds[1], admitted)


def _write(path: Path, objects: Iterable[Any]) -> Path:
    docs = [manifest(o) if not isinstance(o, dict) else o for o in objects]
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False), encoding="utf-8")
    return path


def render(out: Path, settings: K8sSettings, pool_path: Path = SCENARIO_POOL) -> list[Path]:
    """Write the scenario's objects under `out` (created if absent); returns the files written."""
    pool = read_pool(pool_path)
    result = run_scenario(pool)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    replicas = [a for rid, a in result.allocations.items() if rid.startswith(f"{SERVICE_NAME}-")]
    for rid in result.first:
        allocation = result.allocations[rid]
        if rid.startswith(f"{SERVICE_NAME}-"):
            continue
        tag = dagster_k8s_config_dict(allocation, pool, settings)
        (out / f"{rid}.dagster-k8s-config.json").write_text(json.dumps(tag, indent=2, sort_keys=True) + "\n")
        written.append(out / f"{rid}.dagster-k8s-config.json")
        objects = [*run_objects(allocation, pool, settings), run_worker_job(allocation, pool, settings, run_id=rid)]
        if is_gang(allocation):
            gang = gang_objects(allocation, pool, settings, TRAINER)
            objects += gang.objects()
            pins = pin_plan(gang)
            (out / f"{rid}.pin-patches.json").write_text(json.dumps(pins, indent=2) + "\n")
            written.append(out / f"{rid}.pin-patches.json")
        written.append(_write(out / f"{rid}.yaml", objects))
    before = InferenceService(SERVICE_NAME, tuple(a for a in replicas if a.id not in result.second))
    after = InferenceService(SERVICE_NAME, tuple(replicas))
    written.append(_write(out / f"{SERVICE_NAME}.yaml", serve_objects(before, pool, settings, SERVER)))
    patches = {
        "deployment": scale_patch(after),
        "pods": {a.id: replica_pin_patch(a.id, a.placement.nodes[0]) for a in after.replicas},
    }
    (out / f"{SERVICE_NAME}.scale-patches.json").write_text(json.dumps(patches, indent=2) + "\n")
    written.append(out / f"{SERVICE_NAME}.scale-patches.json")
    return sorted(written)


def rendered_objects(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """Every Kubernetes object in the YAML files among `paths` (for validation)."""
    docs: list[dict[str, Any]] = []
    for path in paths:
        if path.suffix == ".yaml":
            docs += [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    return docs
