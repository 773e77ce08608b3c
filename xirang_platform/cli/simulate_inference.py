"""`xirang simulate --inference-load ...`: the autoscaled inference service beside the job traces.

The simulate command parses its flags and hands them here as `InferenceArgs`; this module builds the
service (`ServiceSpec`), reads the load, sizes the siloed partition, sets the tenants and runs the
policies (`simulate/inference_replay.py`), then prints, writes events and the report.

Tenants: the service's tenant (`--inference-load FILE:TENANT/PROJECT`, default `serving/default`)
owns as quota the GPUs siloed would give it (its partition, sized to its peak) in both policies.
Without `--tenants`, the training jobs' tenant `default` owns the rest of the pool.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from xirang_platform.load.traces import DEFAULT_WINDOW_S, read_load
from xirang_platform.pool.model import MILLI_PER_GPU, Pool
from xirang_platform.scheduling.quota import QuotaBook
from xirang_platform.scheduling.replica_scaling import ServiceSpec
from xirang_platform.scheduling.snapshot import SchedulerConfig
from xirang_platform.simulate.events import write_events
from xirang_platform.simulate.inference_replay import (
    POLICIES,
    InferenceSetup,
    PolicyRun,
    inference_partition,
    policy_metrics,
    run_policy,
)
from xirang_platform.simulate.notice import notice_metrics
from xirang_platform.simulate.replay import ReplayOptions
from xirang_platform.simulate.traces import TraceJob

DEFAULT_SERVICE_ACCOUNT = ("serving", "default")
POLICY_CHOICES = (*POLICIES, "both")


@dataclass(frozen=True)
class InferenceArgs:
    """The inference flags of `xirang simulate`, as given (None = not given)."""

    load: str | None = None
    replica_qps: float | None = None
    replica_gpu_milli: int | None = None
    replica_memory_gb: float | None = None
    policy: str | None = None
    load_window_s: float | None = None
    loop_load: bool = False

    @property
    def given(self) -> bool:
        """Whether any inference flag was given."""
        fields = (self.load, self.replica_qps, self.replica_gpu_milli, self.replica_memory_gb, self.policy)
        return any(v is not None for v in (*fields, self.load_window_s)) or self.loop_load


def build_setup(args: InferenceArgs, jobs: list[TraceJob]) -> tuple[InferenceSetup, list[str]]:
    """The service and its load from the flags, and the policies to run; a LoadError/ValueError names
    the flag and the fix."""
    if args.load is None:
        raise ValueError("--replica-*, --policy and --loop-load need --inference-load FILE (the QPS over time)")
    if args.replica_qps is None:
        raise ValueError("--inference-load needs --replica-qps (the QPS one replica serves)")
    policy = args.policy or "unified"
    if policy not in POLICY_CHOICES:
        raise ValueError(f"--policy {policy!r}: write one of {', '.join(POLICY_CHOICES)}")
    path, tenant, project = _load_spec(args.load)
    load = read_load(path, args.load_window_s or DEFAULT_WINDOW_S)
    last_submit = max((j.request.submit_time for j in jobs), default=0.0)
    if args.loop_load and last_submit > load.end:
        load = load.looped(last_submit - load.start)
    spec = ServiceSpec(
        "inference",
        tenant,
        project,
        replica_qps=args.replica_qps,
        replica_gpu_milli=args.replica_gpu_milli or MILLI_PER_GPU,
        replica_gpu_memory_mib=round((args.replica_memory_gb or 0.0) * 1024),
    )
    return InferenceSetup(spec, load), list(POLICIES) if policy == "both" else [policy]


def _load_spec(raw: str) -> tuple[Path, str, str]:
    path, _, account = raw.partition(":")
    if not account:
        return Path(path), *DEFAULT_SERVICE_ACCOUNT
    tenant, slash, project = account.partition("/")
    if not slash or not tenant or not project:
        raise ValueError(f"--inference-load {raw!r}: write FILE or FILE:TENANT/PROJECT")
    return Path(path), tenant, project


def training_book(pool: Pool, setup: InferenceSetup, book: QuotaBook | None) -> QuotaBook:
    """The tenants of `--tenants`, or `default` owning what the inference partition leaves."""
    if book is not None:
        return book
    inference, _ = inference_partition(pool, setup)
    return QuotaBook({"default": pool.gpu_milli - inference.gpu_milli}, {("default", "default"): None})


def run_inference(
    pool: Pool,
    book: QuotaBook,
    jobs: list[TraceJob],
    setup: InferenceSetup,
    policies: list[str],
    config: SchedulerConfig | None,
    options: ReplayOptions,
) -> list[tuple[PolicyRun, dict]]:
    """Run each policy; its run and metrics."""
    out = []
    for policy in policies:
        run = run_policy(policy, pool, book, jobs, setup, config, options)
        out.append((run, policy_metrics(run) | notice_metrics(run.events, options.notice)))
    return out


def write_outputs(
    results: list[tuple[PolicyRun, dict]], json_out: bool, events: Path | None, report: Path | None
) -> str | None:
    """Write events (one file per policy when there are two) and the report; the JSON text when asked."""
    if events is not None:
        for run, _ in results:
            target = events if len(results) == 1 else events.with_name(f"{events.stem}.{run.policy}{events.suffix}")
            write_events(run.events, target)
    if report is not None:
        from xirang_platform.simulate.inference_report import write_inference_report

        write_inference_report(report, results)
    if json_out:
        body = results[0][1] if len(results) == 1 else {run.policy: m for run, m in results}
        return json.dumps(body, sort_keys=True, default=float)
    return None
