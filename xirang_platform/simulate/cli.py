"""`xirang simulate`: replay traces through the scheduler's `cycle` (or run FGD's fill method).

The lead registers it on the main app:
    from xirang_platform.simulate.cli import simulate
    app.command("simulate")(simulate)
"""

from __future__ import annotations

import json
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

import xirang_platform
from xirang_platform.pool.model import MILLI_PER_GPU, Pool
from xirang_platform.scheduling.quota import QuotaBook
from xirang_platform.scheduling.scoring import scorer_for
from xirang_platform.scheduling.snapshot import SchedulerConfig
from xirang_platform.simulate.inference_cli import InferenceArgs
from xirang_platform.simulate.replay import ReplayOptions, replay
from xirang_platform.simulate.traces import TraceError, TraceJob, limit_jobs, merge_traces, parse_jobs_spec, read_jobs

OPENB = Path("data/traces/alibaba_openb_gpu_2023")
DEFAULT_NODES = OPENB / "openb_node_list_gpu_node.csv"
DEFAULT_JOBS = OPENB / "openb_pod_list_default.csv"


class Mode(StrEnum):
    REPLAY = "replay"
    FILL = "fill"


class SimulateError(ValueError):
    """Simulator input that cannot be used; the message names it and the fix."""


def repo_root() -> Path:
    """The repository root, found from the package's location (the bundled traces live under it)."""
    return Path(xirang_platform.__file__).resolve().parents[1]


def bundled(relative: Path) -> Path:
    """A bundled trace file, or a clear error when the checkout lacks it."""
    path = repo_root() / relative
    if not path.is_file():
        raise SimulateError(
            f"the bundled trace {relative} is not at {path}; run from a repository checkout "
            "or give --nodes and --jobs explicitly"
        )
    return path


def load_pool(nodes: Path | None, domain_size: int) -> Pool:
    """The pool of `--nodes` (YAML inventory or openb node CSV), or the bundled openb GPU nodes."""
    from xirang_platform.pool.readers import read_openb_nodes, read_pool

    if nodes is None:
        return read_openb_nodes(bundled(DEFAULT_NODES), domain_size=domain_size, unit_milli=1)
    return read_pool(nodes, domain_size=domain_size, unit_milli=1)


def load_book(tenants: Path | None, pool: Pool) -> QuotaBook:
    """The quota book of `--tenants`, or one tenant owning the whole pool."""
    from xirang_platform.simulate.tenants import default_book, read_tenants

    return default_book(pool.gpu_milli) if tenants is None else read_tenants(tenants, pool.gpu_milli)


def load_jobs(specs: list[str], book: QuotaBook, *, tenants_given: bool, keep_times: bool = False) -> list[TraceJob]:
    """The jobs of every `--jobs` spec (the bundled openb pods when none), merged in submit order."""
    if not specs:
        specs = [str(bundled(DEFAULT_JOBS))]
    accounts = sorted(book.projects)
    traces = []
    for raw in specs:
        spec = parse_jobs_spec(raw)
        if spec.tenant is None:
            if tenants_given and len(accounts) != 1:
                known = ", ".join(f"{t}/{p}" for t, p in accounts)
                raise SimulateError(
                    f"--jobs {raw!r}: the tenants file has several accounts ({known}); "
                    "say whose jobs these are with FILE:TIER:TENANT/PROJECT (TIER may be empty: FILE::t/p)"
                )
            tenant, project = accounts[0]
        else:
            if not tenants_given:
                raise SimulateError(f"--jobs {raw!r} names tenant {spec.tenant}; give their quotas with --tenants FILE")
            if not book.knows(spec.tenant, spec.project or ""):
                known = ", ".join(f"{t}/{p}" for t, p in accounts)
                raise SimulateError(
                    f"--jobs {raw!r}: no account {spec.tenant}/{spec.project} in --tenants; known: {known}"
                )
            tenant, project = spec.tenant, spec.project or ""
        read = read_jobs(spec, default_tenant=tenant, default_project=project, keep_times=keep_times)
        traces.append((spec.path.stem, read))
    return merge_traces(traces)


def _opt(name: str, help_text: str, **kw: object):
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
SeedOpt = Annotated[int, _opt("--seed", "seed of the fill order and tie-breaks, and of --placement random")]
JsonOpt = Annotated[bool, _opt("--json", "print the metrics as one JSON object")]
EventsOpt = Annotated[Path | None, _opt("--events", "write the event log here (JSON lines)")]
ReportOpt = Annotated[Path | None, _opt("--report", "write index.html with plots into this folder")]
DomainOpt = Annotated[int, _opt("--domain-size", "nodes per interconnect domain of a node CSV without one", min=1)]
MinRuntimeOpt = Annotated[float, _opt("--min-runtime", "seconds before an allocation may be preempted", min=0)]
PlacementOpt = Annotated[str, _opt("--placement", "node scorer: bestfit (default), fgd, xirang (ours), random")]
LimitOpt = Annotated[int | None, _opt("--limit", "replay only the first N jobs (in submit order)", min=1)]
IntervalOpt = Annotated[
    float, _opt("--interval", "seconds between cycles; 0 = a cycle at every arrival or finish", min=0)
]
CheckpointOpt = Annotated[
    float | None,
    _opt(
        "--checkpoint",
        "a preempted job resumes from its last checkpoint, taken every this many seconds [default: its work is lost]",
        min=0,
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
KeepTimesOpt = Annotated[bool, _opt("--keep-times", "job files keep their own clocks (no rebase to first submit)")]


def simulate(
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
    placement: PlacementOpt = "bestfit",
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
) -> None:
    """Replay GPU job traces through the scheduler on simulated time and report utilization and waits."""
    from xirang_platform.autoscale.load import LoadError

    inference = InferenceArgs(
        inference_load, replica_qps, replica_gpu_milli, replica_memory_gb, policy, load_window, loop_load
    )
    from xirang_platform.pool.readers import InventoryError
    from xirang_platform.simulate.tenants import TenantsError

    try:
        pool = load_pool(nodes, domain_size)
        book = load_book(tenants, pool)
        trace = limit_jobs(
            load_jobs(list(jobs or []), book, tenants_given=tenants is not None, keep_times=keep_times), limit
        )
        scorer = scorer_for(placement, [j.request for j in trace], seed) if mode is Mode.REPLAY else None
        options = ReplayOptions(interval_s=interval, checkpoint_interval_s=checkpoint)
        config = SchedulerConfig(min_runtime_s=min_runtime, scorer=scorer) if scorer else None
        if inference.given:
            if mode is Mode.FILL:
                raise SimulateError("--inference-load drives a replay; it does not apply to --mode fill")
            _run_inference(pool, book if tenants else None, trace, inference, config, options, json_out, events, report)
            return
    except (TraceError, TenantsError, InventoryError, SimulateError, LoadError, ValueError) as e:
        _fail(str(e))
    if mode is Mode.FILL:
        _run_fill(pool, trace, placement, seed, json_out)
        return
    _run_replay(pool, book, trace, config, options, json_out, events, report)


def _run_replay(
    pool: Pool,
    book: QuotaBook,
    trace: list[TraceJob],
    config: SchedulerConfig,
    options: ReplayOptions,
    json_out: bool,
    events: Path | None,
    report: Path | None,
) -> None:
    from xirang_platform.simulate.metrics import compute_metrics

    started = time.perf_counter()
    result = replay(pool, book, trace, config, options)
    wall = time.perf_counter() - started
    metrics = compute_metrics(result.events, pool.gpu_milli / MILLI_PER_GPU)
    metrics["cycles"] = result.cycles
    if events is not None:
        result.log.write(events)
    if report is not None:
        from xirang_platform.simulate.report import write_report

        write_report(report, result.events, metrics, pool.gpu_milli / MILLI_PER_GPU)
    if json_out:
        typer.echo(json.dumps(metrics, sort_keys=True))
        return
    _summary(metrics, f"replay of {len(trace)} jobs on {len(pool.nodes)} nodes, {pool.gpus} GPUs ({wall:.1f} s wall)")


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
    """Autoscaled inference beside the jobs, under one policy or both (`simulate/inference_cli.py`)."""
    from xirang_platform.simulate import inference_cli as ic

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


def _fail(message: str) -> None:
    Console(stderr=True).print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code=2)
