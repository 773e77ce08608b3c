"""`xirang load`: replay a real inference trace against a service's ready replicas and report.
`xirang serve`: one replica as a plain process (the Kubernetes Deployment's container), until SIGTERM."""

from __future__ import annotations

import json
import pickle
import socket
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from xirang_platform.base.user_input import print_error
from xirang_platform.load.generator import DEFAULT_SPEED, LoadReport, plan_load, run_load
from xirang_platform.load.traces import DEFAULT_WINDOW_S
from xirang_platform.serving.registry import REGISTRY_ENV, registry_dir
from xirang_platform.serving.replica import Replica, serve_for

DEFAULT_TRACE = Path("data/traces/alibaba_genai_sd_serving_2026/qps.csv")


def load_command(
    service: Annotated[str, typer.Argument(help="The service to load (its registry file's name).")],
    trace: Annotated[
        Path,
        typer.Option(help="An SD serving qps.csv, an Azure LLM trace (AzureLLMInferenceTrace_*.csv) or a t,qps CSV."),
    ] = DEFAULT_TRACE,
    speed: Annotated[float, typer.Option(help="Time compression: trace seconds per wall second.")] = DEFAULT_SPEED,
    rate_scale: Annotated[float, typer.Option(help="Multiply the trace's QPS by this.")] = 1.0,
    duration: Annotated[
        float | None, typer.Option(help="Wall seconds to send for (default: the whole trace once).")
    ] = None,
    window_s: Annotated[float, typer.Option(help="Seconds per QPS step read from the trace.")] = DEFAULT_WINDOW_S,
    registry: Annotated[
        Path | None, typer.Option(help=f"The registry directory (default: {REGISTRY_ENV}, see docs/serving.md).")
    ] = None,
    wait_ready: Annotated[float, typer.Option(help="Seconds to wait for a first ready replica.")] = 10.0,
    timeout: Annotated[float, typer.Option(help="Seconds before a request counts as timed out.")] = 10.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object with the figures.")] = False,
) -> None:
    """Replay a trace against SERVICE's ready replicas; requests, errors and latency percentiles."""
    try:
        plan = plan_load(trace, speed=speed, rate_scale=rate_scale, duration_s=duration, window_s=window_s)
        report = run_load(service, plan, directory=registry, wait_ready_s=wait_ready, timeout_s=timeout)
    except ValueError as e:  # LoadError (a broken trace row), ServingLoadError, RegistryError
        print_error(str(e))
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(report.to_dict(), sort_keys=True))
    else:
        Console().print(report_table(report))


def report_table(report: LoadReport) -> Table:
    """The figures of a load run as a rich table."""
    doc = report.to_dict()
    table = Table(title=f"load on {report.service}: {report.trace}, {report.speed:g}x, rate x{report.rate_scale:g}")
    table.add_column("figure")
    table.add_column("value", justify="right")
    rows = [
        ("requests", doc["requests"]),
        ("answered (200)", doc["requests_ok"]),
        ("failed", doc["requests_failed"]),
        *((f"  {reason}", n) for reason, n in doc["errors_by_reason"].items()),
        ("wall seconds", doc["wall_s"]),
        ("achieved QPS", doc["achieved_qps"]),
        *((f"latency {p} ms", doc[f"latency_{p}_ms"]) for p in ("p50", "p90", "p99")),
        ("replicas used", doc["replicas_seen"]),
        *((f"  {target}", n) for target, n in doc["requests_by_replica"].items()),
    ]
    for name, value in rows:
        table.add_row(name, "-" if value is None else str(value))
    return table


def serve_command(
    model: Annotated[Path, typer.Option(help="The pickled model to serve (a deployed model-vN.pkl).")],
    service: Annotated[str, typer.Option(help="The service this replica belongs to.")],
    version: Annotated[str, typer.Option(help="The model version it serves (reported on /metrics).")] = "1",
    host: Annotated[str, typer.Option(help="Address to listen on (0.0.0.0 in a pod).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on; 0 takes a free one.")] = 8000,
    run_id: Annotated[str | None, typer.Option(help="The replica's id in the registry (default: hostname).")] = None,
) -> None:
    """Serve MODEL over HTTP as one replica of SERVICE until SIGTERM or Ctrl-C, then drain."""
    if not model.is_file():
        print_error(f"--model {model}: no such file; give a pickled model (a deployment's model-vN.pkl)")
        raise typer.Exit(2)
    with model.open("rb") as f:
        loaded = pickle.load(f)  # noqa: S301 - the operator's own model file
    try:
        replica = Replica(
            service, loaded, version, run_id or socket.gethostname(), registry_dir(), host=host, port=port
        )
        endpoint = replica.start()
    except (ValueError, OSError) as e:
        print_error(str(e))
        raise typer.Exit(2) from None
    typer.echo(f"serving {service} v{version} at {endpoint.url}", err=True)
    try:
        serve_for(replica, None)
    except KeyboardInterrupt:
        typer.echo(f"drained: answered {replica.answered()} prediction requests", err=True)
