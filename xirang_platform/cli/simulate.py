"""`xirang simulate`: replay traces through the scheduler's `cycle` (or run FGD's fill method).

`xirang_platform/cli/__init__.py` registers `simulate` on the `xirang` app; the inputs it reads (pool, quota
book, jobs) come from `simulate/inputs.py`, which the Dagster replay asset reads too.
"""

from __future__ import annotations

import json
import math
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from xirang_platform.base.user_input import print_error
from xirang_platform.cli.simulate_inference import InferenceArgs
from xirang_platform.pool.model import MILLI_PER_GPU, Pool
from xirang_platform.scheduling.quota import QuotaBook
from xirang_platform.scheduling.scorers import DEFAULT_PLACEMENT, make_scorer
from xirang_platform.scheduling.snapshot import SchedulerConfig
from xirang_platform.simulate.elastic import elastic_jobs, parse_range
from xirang_platform.simulate.inputs import (
    DEFAULT_JOBS,
    DEFAULT_NODES,
    SimulateError,
    load_book,
    load_jobs,
    load_pool,
    pool_catalog,
)
from xirang_platform.simulate.notice import NoticePolicy, notice_metrics
from xirang_platform.simulate.replay import ReplayOptions, replay
from xirang_platform.simulate.traces import TraceError, TraceJob, limit_jobs


class Mode(StrEnum):
    REPLAY = "replay"
    FILL = "fill"


def _opt(name: str, help_text: str, **kw: Any) -> Any:
    return typer.Option(name, help=help_text, **kw)


NodesOpt = Annotated[
    Path | None, _opt("--nodes", "YAML inventory or openb node CSV [default: bundled openb GPU nodes]")
]
JobsOpt = Annotated[
    list[str] | None,
    _opt(
        "--jobs",
        "FILE[:TIER[:TENANT/PROJECT]], an openb pod list or ITP job list; repeatable [default: bundled openb pods]",
    ),
]
TenantsOpt = Annotated[
    Path | None, _opt("--tenants", "YAML tenant quotas (data/tenants.example.yaml) [default: one tenant]")
]
ModeOpt = Annotated[Mode, _opt("--mode", "replay: the traces on simulated time; fill: FGD's method")]
SeedOpt = Annotated[int, _opt("--seed", "seed of the fill order and tie-breaks, and of --placement random", min=0)]
JsonOpt = Annotated[bool, _opt("--json", "print the metrics as one JSON object")]
EventsOpt = Annotated[Path | None, _opt("--events", "write the event log here (JSON lines)")]
ReportOpt = Annotated[Path | None, _opt("--report", "write index.html with plots into this folder")]
DomainOpt = Annotated[int, _opt("--domain-size", "nodes per interconnect domain of a node CSV without one", min=1)]
MinRuntimeOpt = Annotated[
    float,
    _opt("--min-runtime", "seconds before training may preempt an allocation (inference preempts at any age)", min=0),
]
PlacementOpt = Annotated[str, _opt("--placement", "node scorer: xirang (ours, the default), fgd, bestfit, random")]
LimitOpt = Annotated[int | None, _opt("--limit", "replay only the first N jobs (in submit order)", min=1)]


def _finite_seconds(value: float | None) -> float | None:
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a number of seconds: give a finite number")
    return value


def _positive_seconds(value: float | None) -> float | None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise typer.BadParameter(f"{value} is not a positive number of seconds: give a checkpoint interval > 0")
    return value


def _every_seconds(value: float | None) -> float | None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise typer.BadParameter(f"{value} is not a positive number of seconds: give how often to score, > 0")
    return value


def _grace_seconds(value: float) -> float:
    if not (math.isfinite(value) and value >= 0):
        raise typer.BadParameter(
            f"{value} is not a number of seconds >= 0: give how long a preempted victim may run on "
            "(0 = it stops at once, the default)"
        )
    return value


def _cost_seconds(value: float) -> float:
    if not (math.isfinite(value) and value >= 0):
        raise typer.BadParameter(
            f"{value} is not a number of seconds >= 0: give how long a victim takes to save a checkpoint"
        )
    return value


NoticeOpt = Annotated[
    float,
    _opt(
        "--preemption-notice",
        "seconds of grace a preempted victim gets before it is stopped; its preemptor's units are reserved "
        "meanwhile [default: 0, stopped at once]",
        callback=_grace_seconds,
    ),
]
CheckpointCostOpt = Annotated[
    float,
    _opt(
        "--checkpoint-cost",
        "seconds a victim needs to save a checkpoint on notice: if it fits in the notice the victim loses "
        "nothing, else it is killed at the end of the grace [default: 0]",
        callback=_cost_seconds,
    ),
]
IntervalOpt = Annotated[
    float,
    _opt(
        "--interval",
        "seconds between cycles, at most the trace's span; 0 = a cycle at every arrival or finish",
        min=0,
        callback=_finite_seconds,
    ),
]
CheckpointOpt = Annotated[
    float | None,
    _opt(
        "--checkpoint",
        "a preempted job resumes from its last checkpoint, taken every this many seconds (> 0) "
        "[default: its work is lost]",
        callback=_positive_seconds,
    ),
]
LoadOpt = Annotated[
    str | None,
    _opt(
        "--inference-load",
        "FILE[:TENANT/PROJECT]: QPS over time (SD serving qps.csv, Azure LLM trace, or t,qps) of an autoscaled "
        "inference service (tenant serving/default unless named)",
    ),
]
ReplicaQpsOpt = Annotated[float | None, _opt("--replica-qps", "QPS one inference replica serves", min=0)]
ReplicaMilliOpt = Annotated[int | None, _opt("--replica-gpu-milli", "GPU milli per replica (default 1000)", min=1)]
ReplicaMemOpt = Annotated[float | None, _opt("--replica-memory-gb", "GPU memory per replica GPU (default 0)", min=0)]
PolicyOpt = Annotated[
    str | None, _opt("--policy", "unified (one pool, lending), siloed (fixed inference partition), or both")
]
LoadWindowOpt = Annotated[float | None, _opt("--load-window", "seconds per load window (default 600)", min=1)]
LoopLoadOpt = Annotated[bool, _opt("--loop-load", "repeat the load until the last job is submitted")]
ElasticOpt = Annotated[
    str | None,
    _opt(
        "--elastic",
        "MIN:MAX: every training job may run between MIN and MAX times its trace GPUs (rounded, at least 1), "
        "its work conserved at the stated scaling curve, e.g. 0.5:2 [default: fixed sizes]",
    ),
]


def _resize_seconds(value: float) -> float:
    if not (math.isfinite(value) and value >= 0):
        raise typer.BadParameter(f"{value} is not a number of seconds >= 0: give how long a resize stops a job")
    return value


ResizeCostOpt = Annotated[
    float,
    _opt(
        "--resize-cost",
        "seconds a resize of an elastic job stops it (checkpoint and restart at the new size) [default: 0]",
        callback=_resize_seconds,
    ),
]
KeepTimesOpt = Annotated[bool, _opt("--keep-times", "job files keep their own clocks (no rebase to first submit)")]
EtaEveryOpt = Annotated[
    float | None,
    _opt(
        "--eta-every",
        "every this many simulated seconds (> 0), score the queue view's estimated start of every waiting job "
        "against its start in the replay, beside the starts-now and declared-ends baselines (JSON: eta)",
        callback=_every_seconds,
    ),
]


REPLAY_ONLY = (
    "events",
    "report",
    "interval",
    "checkpoint",
    "min_runtime",
    "preemption_notice",
    "checkpoint_cost",
    "elastic",
    "resize_cost",
    "eta_every",
)


def simulate(
    ctx: typer.Context,
    nodes: NodesOpt = None,
    jobs: JobsOpt = None,
    tenants: TenantsOpt = None,
    mode: ModeOpt = Mode.REPLAY,
    seed: SeedOpt = 42,
    json_out: JsonOpt = False,
    events: EventsOpt = None,
    report: ReportOpt = None,
    domain_size: DomainOpt = 8,
    min_runtime: MinRuntimeOpt = 600.0,
    placement: PlacementOpt = DEFAULT_PLACEMENT,
    limit: LimitOpt = None,
    interval: IntervalOpt = 0.0,
    checkpoint: CheckpointOpt = None,
    inference_load: LoadOpt = None,
    replica_qps: ReplicaQpsOpt = None,
    replica_gpu_milli: ReplicaMilliOpt = None,
    replica_memory_gb: ReplicaMemOpt = None,
    policy: PolicyOpt = None,
    load_window: LoadWindowOpt = None,
    loop_load: LoopLoadOpt = False,
    keep_times: KeepTimesOpt = False,
    preemption_notice: NoticeOpt = 0.0,
    checkpoint_cost: CheckpointCostOpt = 0.0,
    elastic: ElasticOpt = None,
    resize_cost: ResizeCostOpt = 0.0,
    eta_every: EtaEveryOpt = None,
) -> None:
    """Replay GPU job traces through the scheduler on simulated time and report utilization and waits."""
    from xirang_platform.load.traces import LoadError

    inference = InferenceArgs(
        inference_load, replica_qps, replica_gpu_milli, replica_memory_gb, policy, load_window, loop_load
    )
    from xirang_platform.control.tenants import TenantsError
    from xirang_platform.pool.inventory_error import InventoryError

    if mode is Mode.FILL:
        _refuse_replay_only_flags(ctx)
    try:
        notice = notice_policy(preemption_notice, checkpoint_cost)
        check_output_paths(events, report)
        pool = load_pool(nodes, domain_size)
        book = load_book(tenants, pool)
        specs = list(jobs or [])
        catalog = pool_catalog(pool)
        found = load_jobs(
            specs,
            book,
            tenants_given=tenants is not None,
            catalog=catalog,
            keep_times=keep_times,
            times=mode is Mode.REPLAY,
        )
        trace = limit_jobs(found, limit)
        check_interval(interval, trace)
        if elastic is not None:
            if notice.on:
                raise SimulateError(
                    "--elastic with --preemption-notice: the replay does not model a resize under a notice yet; "
                    "drop one of them"
                )
            trace = elastic_jobs(trace, *parse_range(elastic))
        scorer = make_scorer(placement, [j.request for j in trace], seed) if mode is Mode.REPLAY else None
        options = ReplayOptions(
            interval_s=interval, checkpoint_interval_s=checkpoint, notice=notice, resize_cost_s=resize_cost
        )
        config = SchedulerConfig(min_runtime_s=min_runtime, scorer=scorer) if scorer else None
        if inference.given:
            if eta_every is not None:
                raise SimulateError(
                    "--eta-every scores the estimate on a training replay; drop --inference-load or --eta-every"
                )
            if mode is Mode.FILL:
                raise SimulateError("--inference-load drives a replay; it does not apply to --mode fill")
            _run_inference(pool, book if tenants else None, trace, inference, config, options, json_out, events, report)
            return
    except (TraceError, TenantsError, InventoryError, SimulateError, LoadError, ValueError) as e:
        _fail(str(e))
    if mode is Mode.FILL:
        _run_fill(pool, trace, placement, seed, json_out)
        return
    inputs = {
        "nodes": str(nodes or DEFAULT_NODES),
        "jobs": " ".join(specs) or str(DEFAULT_JOBS),
        "tenants": str(tenants) if tenants else "one tenant owns the pool",
        "placement": placement,
        "seed": seed,
        "limit": limit if limit is not None else "all jobs",
        "interval_s": interval,
        "min_runtime_s": min_runtime,
        "checkpoint_s": checkpoint if checkpoint is not None else "none (a preempted job loses its work)",
        "preemption_notice_s": preemption_notice,
        "checkpoint_cost_s": checkpoint_cost,
        "elastic": elastic or "fixed sizes",
        "resize_cost_s": resize_cost,
        "pool": f"{len(pool.nodes)} nodes, {pool.gpus} GPUs",
        "jobs replayed": len(trace),
    }
    _run_replay(pool, book, trace, config, options, json_out, events, report, inputs, eta_every)


def _refuse_replay_only_flags(ctx: typer.Context) -> None:
    """Fill mode places pods once and keeps no timeline: flags of the replay would be silently ignored."""

    def on_command_line(name: str) -> bool:
        source = ctx.get_parameter_source(name)
        return source is not None and source.name == "COMMANDLINE"

    given = [p.opts[0] for p in ctx.command.params if p.name in REPLAY_ONLY and on_command_line(p.name)]
    if given:
        _fail(
            f"{', '.join(given)}: only --mode replay uses {'this flag' if len(given) == 1 else 'these flags'}; "
            "fill mode places the pods once, with no timeline, event log or report (it prints the allocation "
            "ratio, --json for the curve). Drop the flag, or use --mode replay"
        )


def notice_policy(notice_s: float, checkpoint_cost_s: float) -> NoticePolicy:
    """The preemption notice of the flags; a checkpoint cost without a notice would be ignored: refused."""
    if checkpoint_cost_s > 0 and notice_s == 0:
        raise SimulateError(
            f"--checkpoint-cost {checkpoint_cost_s:g} needs a notice to save in: give --preemption-notice S > 0 "
            "too, or drop --checkpoint-cost"
        )
    return NoticePolicy(notice_s, checkpoint_cost_s)


def check_output_paths(events: Path | None, report: Path | None) -> None:
    """Refuse output paths that cannot be written before replaying, so no run's metrics are lost."""
    if events is not None:
        if events.is_dir():
            raise SimulateError(f"--events {events}: is a folder; give a file path for the event log")
        if not events.parent.is_dir():
            raise SimulateError(
                f"--events {events}: the folder {events.parent} does not exist; create it or give another path"
            )
        existed = events.exists()
        try:
            events.open("a").close()
        except OSError as e:
            raise SimulateError(f"--events {events}: cannot be written ({e.strerror}); give another path") from None
        if not existed:
            events.unlink()
    if report is not None:
        if report.exists() and not report.is_dir():
            raise SimulateError(
                f"--report {report}: is a file; give a folder for index.html and its plots (created if missing)"
            )
        try:
            report.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SimulateError(f"--report {report}: cannot create the folder ({e.strerror}); give another") from None


def check_interval(interval: float, trace: list[TraceJob]) -> None:
    """An interval longer than the trace itself would hold every job for one late cycle: refuse it."""
    span = max((j.request.submit_time + j.duration_s for j in trace), default=0.0)
    if trace and interval > max(span, 1.0):
        raise SimulateError(
            f"--interval {interval:g} s is longer than the trace, which spans {span:,.0f} s from the first submit "
            f"to the last finish; every job would wait for one late cycle. Give at most {max(span, 1.0):g} s, "
            "or 0 for a cycle at every arrival and finish"
        )


def _run_replay(
    pool: Pool,
    book: QuotaBook,
    trace: list[TraceJob],
    config: SchedulerConfig | None,
    options: ReplayOptions,
    json_out: bool,
    events: Path | None,
    report: Path | None,
    inputs: dict | None = None,
    eta_every: float | None = None,
) -> None:
    from xirang_platform.simulate.eta_score import EtaSampler, eta_metrics
    from xirang_platform.simulate.metrics import compute_metrics
    from xirang_platform.simulate.replay import replay_config

    started = time.perf_counter()
    sampler = None
    if eta_every is not None:
        durations = {j.request.id: j.duration_s for j in trace}
        effective = replay_config(config, options)
        sampler = EtaSampler(pool, book, effective, durations, eta_every, tick_s=options.interval_s)
    result = replay(pool, book, trace, config, options, observe=sampler)
    wall = time.perf_counter() - started
    metrics = compute_metrics(result.events, pool.gpu_milli / MILLI_PER_GPU)
    metrics["cycles"] = result.cycles
    if sampler is not None:
        metrics["eta"] = eta_metrics(sampler.samples, result.events, sampler.every_s)
    metrics.update(notice_metrics(result.events, options.notice))
    # The metrics first: should writing a file still fail (a full disk), the run is not lost.
    if json_out:
        typer.echo(json.dumps(metrics, sort_keys=True))
    else:
        _summary(
            metrics, f"replay of {len(trace)} jobs on {len(pool.nodes)} nodes, {pool.gpus} GPUs ({wall:.1f} s wall)"
        )
    try:
        if events is not None:
            result.log.write(events)
            typer.echo(f"event log: {events}", err=json_out)  # with --json on stderr: stdout stays one object
        if report is not None:
            from xirang_platform.simulate.report import write_report

            page = write_report(report, result.events, metrics, pool.gpu_milli / MILLI_PER_GPU, inputs=inputs)
            typer.echo(f"report: {page}", err=json_out)
    except OSError as e:
        _fail(f"cannot write {e.filename}: {e.strerror}; the metrics above are complete")


def _run_inference(
    pool: Pool,
    book: QuotaBook | None,
    trace: list[TraceJob],
    inference: InferenceArgs,
    config: SchedulerConfig | None,
    options: ReplayOptions,
    json_out: bool,
    events: Path | None,
    report: Path | None,
) -> None:
    """Autoscaled inference beside the jobs, under one policy or both (`cli/simulate_inference.py`)."""
    from xirang_platform.cli import simulate_inference as ic

    setup, policies = ic.build_setup(inference, trace)
    results = ic.run_inference(pool, ic.training_book(pool, setup, book), trace, setup, policies, config, options)
    text = ic.write_outputs(results, json_out, events, report)
    if text is not None:
        typer.echo(text)
        return
    for run, metrics in results:
        title = (
            f"{run.policy}: {len(trace)} jobs + autoscaled inference on {pool.gpus} GPUs; {metrics['inference_load']}"
        )
        _summary(metrics, title)


def _run_fill(pool: Pool, trace: list[TraceJob], placement: str, seed: int, json_out: bool) -> None:
    from xirang_platform.simulate.fill import run_fill  # FGD's fill method lives beside the replay

    try:
        result = run_fill(pool, [j.request for j in trace], placement, seed)
    except ValueError as e:
        _fail(str(e))
    out = {
        "policy": result.policy,
        "seed": result.seed,
        "alloc_ratio_at_100": result.alloc_ratio_at_100,
        "alloc_ratio_at_130": result.alloc_ratio_at_130,
        "pods": result.pods,
        "placed": result.placed,
        "dropped": result.dropped,
        "curve": {str(k): v for k, v in sorted(result.curve.items())},
    }
    if json_out:
        typer.echo(json.dumps(_nan_to_none(out), sort_keys=True))
        return
    _summary({k: v for k, v in out.items() if k != "curve"}, f"fill of {len(pool.nodes)} nodes, {pool.gpus} GPUs")


def _nan_to_none(out: dict) -> dict:
    """JSON has no NaN: figures and curve points without data become null."""

    def fix(v):
        return None if isinstance(v, float) and v != v else v

    return {k: ({ck: fix(cv) for ck, cv in v.items()} if isinstance(v, dict) else fix(v)) for k, v in out.items()}


def _summary(metrics: dict, title: str) -> None:
    console = Console()
    console.print(title, highlight=False, soft_wrap=True)
    table = Table()
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in metrics.items():
        if isinstance(value, dict):
            continue
        table.add_row(key, "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value))
    console.print(table)
    tiers = metrics.get("tiers")
    if tiers:
        t = Table(title="per tier")
        cols = ["submitted", "finished", "rejected", "preempted", "wait_mean_s"]
        t.add_column("tier")
        for c in cols:
            t.add_column(c, justify="right")
        for name, row in tiers.items():
            t.add_row(
                name,
                *(
                    "-" if row[c] is None else f"{row[c]:.4g}" if isinstance(row[c], float) else str(row[c])
                    for c in cols
                ),
            )
        console.print(t)


def _fail(message: str) -> NoReturn:
    print_error(message)
    raise typer.Exit(code=2)
