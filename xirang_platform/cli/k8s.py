"""`xirang k8s`: render admitted allocations as Kubernetes objects; read the pool from node labels.

The main app registers it with `app.add_typer(k8s_app, name="k8s")`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, NoReturn

import typer
import urllib3
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from rich.console import Console

from xirang_platform.cli.pool import pool_summary
from xirang_platform.launch.k8s_gpu import LaunchError
from xirang_platform.launch.k8s_scenario import SCENARIO_POOL, render
from xirang_platform.launch.k8s_settings import K8sSettings, K8sSettingsError, load_settings
from xirang_platform.launch.k8s_submit import LaunchRefused, connect, refusal
from xirang_platform.pool.catalog import CatalogError, default_catalog
from xirang_platform.pool.inventory_error import InventoryError
from xirang_platform.pool.labels import LabelError, inventory_doc, read_cluster_pool
from xirang_platform.pool.model import MILLI_PER_GPU

k8s_app = typer.Typer(
    no_args_is_help=True, help="Kubernetes: render allocations as objects, read the pool from labels."
)


def _fail(message: str) -> NoReturn:
    Console(stderr=True).print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code=2)


def _settings(path: Path | None) -> K8sSettings:
    try:
        return load_settings(path) if path else K8sSettings()
    except K8sSettingsError as exc:
        _fail(str(exc))


@k8s_app.command("render")
def render_command(
    out: Annotated[Path, typer.Option("--out", help="Directory to write the objects into (created if absent).")],
    settings: Annotated[
        Path | None, typer.Option("--settings", help="Launcher settings YAML (deploy/xirang-k8s.yaml).")
    ] = None,
    pool: Annotated[Path, typer.Option("--pool", help="Inventory the scenario is scheduled on.")] = SCENARIO_POOL,
) -> None:
    """Schedule the scripted scenario with the real cycle and write every admission's objects as YAML."""
    chosen = _settings(settings)
    try:
        written = render(out, chosen, pool)
    except (LaunchError, InventoryError, ValueError) as exc:
        _fail(str(exc))
    for path in written:
        typer.echo(str(path))


@k8s_app.command("pool")
def pool_command(
    ctx: typer.Context,
    kubeconfig: Annotated[
        Path | None, typer.Option("--kubeconfig", help="Kubeconfig file; in-cluster config if absent.")
    ] = None,
    context: Annotated[str | None, typer.Option("--context", help="Kubeconfig context.")] = None,
    selector: Annotated[
        str, typer.Option("--selector", help="Label selector of the nodes to read, e.g. nvidia.com/gpu.present=true.")
    ] = "",
    unit: Annotated[
        list[str] | None, typer.Option("--unit-milli", help="MODEL=MILLI: a model's compute unit (repeatable).")
    ] = None,
    as_yaml: Annotated[
        bool, typer.Option("--yaml", help="Print a YAML inventory instead of the JSON summary.")
    ] = False,
) -> None:
    """Read the pool from the nodes' GPU Feature Discovery labels (the same pool model as a YAML inventory)."""
    units = {}
    for item in unit or []:
        model, _, milli = item.partition("=")
        try:
            name = default_catalog().lookup(model).name
        except CatalogError as exc:
            _fail(f"--unit-milli {item!r}: {exc}")
        if not milli.isdigit() or not 0 < int(milli) <= MILLI_PER_GPU or MILLI_PER_GPU % int(milli):
            _fail(f"--unit-milli {item!r}: write MODEL=MILLI with MILLI dividing 1000, e.g. L40S=125")
        units[name] = int(milli)
    # Tests (and embedding code) hand in a CoreV1Api-like object through the click context.
    core = ctx.obj.get("k8s_core_api") if isinstance(ctx.obj, dict) else None
    try:
        if core is None:
            connect(str(kubeconfig) if kubeconfig else None, context)
            core = client.CoreV1Api()
        found = read_cluster_pool(core, selector, unit_milli=units)
    except (LaunchRefused, LabelError) as exc:
        _fail(str(exc))
    except ApiException as exc:
        _fail(str(refusal(exc, "list", "Node", selector or "(all)", "(cluster)")))
    except urllib3.exceptions.HTTPError as exc:
        _fail(f"cannot reach the cluster ({exc}); check the kubeconfig's server and your network")
    if as_yaml:
        typer.echo(yaml.safe_dump(inventory_doc(found), sort_keys=False), nl=False)
    else:
        typer.echo(json.dumps(pool_summary(found, "cluster"), indent=2))
