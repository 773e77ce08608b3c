"""`xirang pool [show]` and `xirang discover`: the pool and this machine, as tables, JSON or YAML.

`xirang pool` alone is `xirang pool show`: the platform's pool (its config's, `XIRANG_CONFIG`, else
./xirang.yaml, else the bundled pool) and what its ledger's live allocations hold now, per GPU model
and tier; `xirang pool show FILE` reads an inventory file only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import typer
import yaml
from rich.console import Console
from rich.table import Table
from rich.text import Text

from xirang_platform.base.user_input import print_error, verbatim
from xirang_platform.cli.quota import cli_ledger_url, ledger_location
from xirang_platform.control.platform_config import PlatformConfigError, config_path, load_config
from xirang_platform.control.pool_state import allocated_by_model
from xirang_platform.ledger.errors import LedgerError
from xirang_platform.ledger.read_only import open_for_reading
from xirang_platform.pool.discover import Discovery, DiscoveryError, discover_details, inventory_fragment
from xirang_platform.pool.inventory_error import InventoryError
from xirang_platform.pool.model import MILLI_PER_GPU, Node, Pool
from xirang_platform.pool.readers import default_pool, read_pool
from xirang_platform.scheduling.model import Tier

pool_app = typer.Typer(help="Inspect the GPU pool: nodes, models, domains, compute units, what is allocated now.")


def _fail(message: str) -> NoReturn:
    print_error(message)
    raise typer.Exit(code=2)


def pool_groups(pool: Pool, by_domain: bool = True) -> list[dict[str, Any]]:
    """One summary row per (model, domain) of the pool, or per model; sorted by model then domain."""
    groups: dict[tuple[str, str], list[Node]] = {}
    for node in pool.nodes:
        groups.setdefault((node.model_name, node.domain if by_domain else ""), []).append(node)
    rows = []
    for (model_name, domain), nodes in sorted(groups.items()):
        model = nodes[0].model
        row: dict[str, Any] = {"model": model_name}
        if by_domain:
            row["domain"] = domain
        else:
            row["domains"] = len({n.domain for n in nodes})
        row.update(
            {
                "nodes": len(nodes),
                "gpus": sum(n.gpus for n in nodes),
                "gpu_memory_mib": model.memory_mib if model else 0,
                "compute_level": model.compute_level if model else 0,
                "unit_milli": sorted({n.unit_milli for n in nodes}) if model else [],
                "units": sum(n.gpus * (MILLI_PER_GPU // n.unit_milli) for n in nodes),
                "cpu_milli": sum(n.cpu_milli for n in nodes),
                "memory_mib": sum(n.memory_mib for n in nodes),
                "known": model.known if model else True,
                "notes": model.notes if model else "",
            }
        )
        rows.append(row)
    return rows


def pool_summary(pool: Pool, name: str = "") -> dict[str, Any]:
    """The pool as one JSON-ready object: totals, per-model rows and per-(model, domain) rows."""
    by_domain = pool_groups(pool)
    return {
        "name": name or pool.source,
        "source": pool.source,
        "nodes": len(pool.nodes),
        "gpus": pool.gpus,
        "units": sum(g["units"] for g in by_domain),
        "models": pool_groups(pool, by_domain=False),
        "domains": by_domain,
    }


def _model_notes(pool: Pool) -> Iterator[str]:
    models = {n.model.name: n.model for n in pool.nodes if n.model is not None and n.model.notes}
    for name in sorted(models):
        yield f"{name}: {models[name].notes}"


@pool_app.callback(invoke_without_command=True)
def pool_command(ctx: typer.Context) -> None:
    """The platform's pool and what is allocated on it now (`xirang pool show`)."""
    if ctx.invoked_subcommand is None:
        show(file=None, as_json=False, domains=False, domain_size=8, unit_milli=1, ledger_url=None)


@pool_app.command("show")
def show(
    file: Path | None = typer.Argument(None, help="YAML inventory or openb node CSV; the platform's pool if absent."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
    domains: bool = typer.Option(False, "--domains", help="One row per interconnect domain, not per model."),
    domain_size: int = typer.Option(8, "--domain-size", min=1, help="CSV only: nodes of one model per domain."),
    unit_milli: int = typer.Option(1, "--unit-milli", help="CSV only: the compute unit in milli-GPU."),
    ledger_url: str | None = typer.Option(
        None, "--ledger-url", help="The ledger to read (default: XIRANG_LEDGER_URL, else the platform config's)."
    ),
) -> None:
    """Show the pool per GPU model (or per interconnect domain): nodes, GPUs, memory, compute level, units;
    without FILE also the GPUs allocated now per model and tier (from the platform's ledger)."""
    try:
        pool = read_pool(file, domain_size=domain_size, unit_milli=unit_milli) if file else _platform_pool()
    except (InventoryError, PlatformConfigError) as exc:
        _fail(str(exc))
    summary = pool_summary(pool, "" if file else "default")
    occupancy = None if file else read_occupancy(pool, ledger_url)
    if as_json:
        typer.echo(json.dumps({**summary, **({"occupancy": occupancy.as_dict()} if occupancy else {})}, indent=2))
        return
    rows = summary["domains"] if domains else summary["models"]
    table = Table(
        title=verbatim(
            f"pool {file or pool.source}: {summary['nodes']} nodes, {summary['gpus']} GPUs, "
            f"{summary['units']} units, {len(pool.domains)} domains"
        )
    )
    table.add_column("model")
    table.add_column("domain" if domains else "domains", justify="left" if domains else "right")
    for column in ("nodes", "GPUs", "GiB/GPU", "compute", "unit milli", "units"):
        table.add_column(column, justify="right")
    for g in rows:
        model = g["model"] or "(cpu only)"
        if not g["known"] or g["notes"].startswith("ASSUMED"):
            model += " *"
        table.add_row(
            verbatim(model),
            verbatim(str(g["domain"] if domains else g["domains"])),
            str(g["nodes"]),
            str(g["gpus"]),
            f"{g['gpu_memory_mib'] / 1024:.0f}" if g["gpus"] else "-",
            str(g["compute_level"]) if g["gpus"] else "-",
            ",".join(map(str, g["unit_milli"])) or "-",
            str(g["units"]),
        )
    console = Console(width=max(120, Console().width))
    console.print(table)
    for note in _model_notes(pool):
        console.print(verbatim(f"* {note}"), highlight=False)
    if occupancy is not None:
        occupancy.print(console, summary["models"])


def _platform_pool() -> Pool:
    """The platform config's pool, else (no config file) the bundled pool."""
    return load_config().pool if config_path().is_file() else default_pool()


@dataclass(frozen=True)
class Occupancy:
    """What the ledger's live allocations hold per GPU model and tier (None: the ledger could not be
    read, `note` says why), and which ledger it is."""

    by_model: dict[str, dict[str, float]] | None
    note: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: GPUs per model and tier, and the ledger (or why there is none)."""
        return {"gpus_by_model_and_tier": self.by_model, "ledger": self.note}

    def print(self, console: Console, models: list[dict[str, Any]]) -> None:
        """A table: per model its GPUs, what each tier holds and what is idle."""
        if self.by_model is None:
            console.print(verbatim(f"allocated now: unknown ({self.note})"), highlight=False)
            return
        size = {g["model"]: g["gpus"] for g in models}
        tiers = [t.value for t in Tier]
        table = Table(title=verbatim(f"allocated now, GPUs ({self.note})"))
        for column in ("model", "GPUs", *tiers, "idle"):
            table.add_column(column, justify="left" if column == "model" else "right")
        for model, held in self.by_model.items():
            total = size.get(model, 0)
            idle = f"{total - sum(held.values()):g}" if model in size else "-"
            table.add_row(verbatim(model), str(total), *(f"{held[t]:g}" for t in tiers), idle)
        console.print(table)


def read_occupancy(pool: Pool, url: str | None = None) -> Occupancy:
    """The live allocations on `pool` of the ledger at `url` (default: the platform's), per model and
    tier; read only, never created."""
    url = url or cli_ledger_url()
    try:
        ledger = open_for_reading(url)
    except LedgerError as e:
        return Occupancy(None, str(e))
    try:
        return Occupancy(allocated_by_model(pool, ledger.allocations()), f"ledger {ledger_location(url)}")
    finally:
        ledger.close()


def node_dict(node: Node) -> dict[str, Any]:
    """A node as a JSON-ready object."""
    return {
        "name": node.name,
        "model": node.model_name,
        "model_known": node.model.known if node.model else True,
        "gpus": node.gpus,
        "gpu_memory_mib": node.model.memory_mib if node.model else 0,
        "compute_level": node.model.compute_level if node.model else 0,
        "cpu_milli": node.cpu_milli,
        "memory_mib": node.memory_mib,
        "domain": node.domain,
        "unit_milli": node.unit_milli,
        "labels": dict(node.labels),
        "gpu_uuids": list(node.gpu_uuids),
    }


def discovery_dict(found: Discovery) -> dict[str, Any]:
    """A discovery result as a JSON-ready object: the node, each GPU, driver and warnings."""
    return {
        "node": node_dict(found.node),
        "gpus": [
            {
                "index": g.index,
                "name": g.name,
                "uuid": g.uuid,
                "memory_mib": g.memory_mib,
                "compute_capability": f"{g.compute_capability[0]}.{g.compute_capability[1]}",
                "mig_capable": g.mig_capable,
                "mig_enabled": g.mig_enabled,
                "mig_devices": list(g.mig_devices),
                "nvlink_links": g.nvlink_links,
                "clique": g.clique,
            }
            for g in found.gpus
        ],
        "driver_version": found.driver_version,
        "warnings": list(found.warnings),
    }


def discover_command(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print the node and its GPUs as one JSON object."),
    as_yaml: bool = typer.Option(False, "--yaml", help="Print a YAML inventory fragment for this node."),
    unit_milli: int = typer.Option(MILLI_PER_GPU, "--unit-milli", help="The node's compute unit in milli-GPU."),
) -> None:
    """Describe this machine's GPUs through NVML: models, memory, MIG mode, NVLink, CPU and memory."""
    if as_json and as_yaml:
        _fail("--json and --yaml both given: choose one output format")
    if unit_milli < 1 or MILLI_PER_GPU % unit_milli:
        _fail(f"--unit-milli {unit_milli} does not divide 1000: use e.g. 1000, 500, 250 or 125")
    # Tests (and embedding code) hand in an NVML backend through the click context object.
    backend = ctx.obj.get("nvml_backend") if isinstance(ctx.obj, dict) else None
    try:
        found = discover_details(backend, unit_milli=unit_milli)
    except DiscoveryError as exc:
        _fail(str(exc))
    if as_json:
        typer.echo(json.dumps(discovery_dict(found), indent=2))
        return
    if as_yaml:
        typer.echo(yaml.safe_dump(inventory_fragment(found), sort_keys=False), nl=False)
        return
    node = found.node
    console = Console(width=max(120, Console().width))
    console.print(
        verbatim(
            f"node {node.name}: {node.gpus} x {node.model_name or 'no GPU'}, "
            f"{node.cpu_milli // 1000} CPUs, {node.memory_mib // 1024} GiB, domain {node.domain}, "
            f"driver {found.driver_version or '?'}"
        ),
        highlight=False,
    )
    table = Table()
    for column in ("index", "name", "memory MiB", "CC", "MIG", "NVLink links", "clique", "uuid"):
        table.add_column(column)
    for g in found.gpus:
        mig = "enabled" if g.mig_enabled else ("capable" if g.mig_capable else "-")
        if g.mig_devices:
            mig += f" ({len(g.mig_devices)} devices)"
        cells = (
            str(g.index),
            g.name,
            str(g.memory_mib),
            f"{g.compute_capability[0]}.{g.compute_capability[1]}",
            mig,
            str(g.nvlink_links),
            g.clique or "-",
            g.uuid,
        )
        table.add_row(*map(verbatim, cells))
    console.print(table)
    for warning in found.warnings:
        console.print(Text.assemble(("warning:", "yellow"), " ", warning), highlight=False)
