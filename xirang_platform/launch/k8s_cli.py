"""`xirang k8s`: render admitted allocations as Kubernetes objects; read the pool from node labels.

The main app registers it with `app.add_typer(k8s_app, name="k8s")`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, NoReturn

import typer
import yaml
from rich.console import Console

from xirang_platform.launch.k8s_gpu import LaunchError
from xirang_platform.launch.k8s_scenario import SCENARIO_POOL, render
from xirang_platform.launch.k8s_settings import K8sSettings, K8sSettingsError, load_settings
from xirang_platform.pool.catalog import CatalogError, default_catalog
from xirang_platform.pool.cli import pool_summary
from xirang_platform.pool.labels import LabelError, inventory_doc, read_cluster_pool
from xirang_platform.pool.readers import InventoryError

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
    from kubernetes import client, config

    units = {}
    for item in unit or []:
        model, _, milli = item.partition("=")
        try:
            units[default_catalog().lookup(model).name] = int(milli)
        except (CatalogError, ValueError) as exc:
            _fail(
                f"--unit-milli {item!r}: {exc if isinstance(exc, CatalogError) else 'write MODEL=MILLI, e.g. L40S=125'}"
            )
    try:
        if kubeconfig is None and context is None:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
        else:
            config.load_kube_config(config_file=str(kubeconfig) if kubeconfig else None, context=context)
    except (config.ConfigException, OSError) as exc:
        _fail(f"no cluster to read ({exc}); pass --kubeconfig, or run inside the cluster")
    try:
        found = read_cluster_pool(client.CoreV1Api(), selector, unit_milli=units)
    except LabelError as exc:
        _fail(str(exc))
    if as_yaml:
        typer.echo(yaml.safe_dump(inventory_doc(found), sort_keys=False), nl=False)
    else:
        typer.echo(json.dumps(pool_summary(found, "cluster"), indent=2))
