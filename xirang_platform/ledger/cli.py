"""`xirang quota`: tenants, projects and quotas in the ledger; balances and history.

Quotas are given in GPUs as a decimal number (`8`, `0.5`, `12.25`) and stored in milli-GPU, so at
most three decimals. The ledger is `XIRANG_LEDGER_URL`, default the SQLite file
`./.xirang/ledger.sqlite`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Annotated, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from xirang_platform.ledger.db import URL_ENV, ledger_url
from xirang_platform.ledger.errors import LedgerError, gpus
from xirang_platform.ledger.ledger import Ledger
from xirang_platform.ledger.tables import EntryKind
from xirang_platform.pool.model import MILLI_PER_GPU

T = TypeVar("T")
HINT = "'--quota'"
QUOTA_HELP = "GPUs, as a decimal number: 8, 0.5 or 12.25 (stored as milli-GPU, so at most 3 decimals)."

quota_app = typer.Typer(
    no_args_is_help=True,
    help="Tenants, projects and their GPU quotas in the quota ledger (XIRANG_LEDGER_URL, "
    "default ./.xirang/ledger.sqlite).",
)
tenant_app = typer.Typer(no_args_is_help=True, help="Add tenants and set their quotas.")
project_app = typer.Typer(no_args_is_help=True, help="Add projects (each in one tenant) and set their quotas.")
quota_app.add_typer(tenant_app, name="tenant")
quota_app.add_typer(project_app, name="project")


def parse_gpus(text: str) -> int:
    """GPUs as a decimal string -> milli-GPU; refuses non-numbers, negatives and sub-milli fractions."""
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        raise typer.BadParameter(f"'{text}' is not a number of GPUs: write it like 8 or 0.5", param_hint=HINT) from None
    if not value.is_finite():
        raise typer.BadParameter(f"'{text}' is not a number of GPUs: write it like 8 or 0.5", param_hint=HINT)
    if value < 0:
        raise typer.BadParameter(f"'{text}' is negative: a quota is 0 GPUs or more", param_hint=HINT)
    milli = value * MILLI_PER_GPU
    if milli != milli.to_integral_value():
        raise typer.BadParameter(
            f"'{text}' is finer than 1 milli-GPU: use at most 3 decimals, e.g. 0.125", param_hint=HINT
        )
    return int(milli)


QuotaOption = Annotated[str, typer.Option("--quota", "-q", help=QUOTA_HELP)]


def _ledger() -> Ledger:
    return Ledger()


def _fail(message: str) -> typer.Exit:
    Console(stderr=True).print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(1)


def _run(action: Callable[[Ledger], T]) -> T:
    """Run `action` on the ledger; a LedgerError becomes a one-line message and exit code 1."""
    ledger = None
    try:
        ledger = _ledger()
        return action(ledger)
    except LedgerError as e:
        raise _fail(str(e)) from None
    except OperationalError as e:
        url = ledger.url if ledger is not None else ledger_url()
        raise _fail(
            f"cannot open the quota ledger at {make_url(url).render_as_string()}: {' '.join(str(e.orig).split())}; "
            f"check {URL_ENV} (unset: ./.xirang/ledger.sqlite)"
        ) from None
    finally:
        if ledger is not None:
            ledger.close()


@tenant_app.command("add")
def tenant_add(name: str, quota: QuotaOption) -> None:
    """Add tenant NAME with a quota of --quota GPUs."""
    milli = parse_gpus(quota)
    _run(lambda ledger: ledger.add_tenant(name, milli))
    typer.echo(f"tenant {name}: quota {gpus(milli)} GPUs")


@tenant_app.command("set")
def tenant_set(name: str, quota: QuotaOption) -> None:
    """Set tenant NAME's quota to --quota GPUs."""
    milli = parse_gpus(quota)
    _run(lambda ledger: ledger.set_tenant_quota(name, milli))
    typer.echo(f"tenant {name}: quota {gpus(milli)} GPUs")


@project_app.command("add")
def project_add(
    tenant: str,
    name: str,
    quota: Annotated[
        str | None, typer.Option("--quota", "-q", help=f"{QUOTA_HELP} Omit it: no limit of its own.")
    ] = None,
) -> None:
    """Add project NAME to TENANT, with --quota GPUs (omitted: only the tenant's quota applies)."""
    milli = None if quota is None else parse_gpus(quota)
    _run(lambda ledger: ledger.add_project(tenant, name, milli))
    typer.echo(f"project {tenant}/{name}: quota {f'{gpus(milli)} GPUs' if milli is not None else 'none of its own'}")


@project_app.command("set")
def project_set(tenant: str, name: str, quota: QuotaOption) -> None:
    """Set project TENANT/NAME's quota to --quota GPUs."""
    milli = parse_gpus(quota)
    _run(lambda ledger: ledger.set_project_quota(tenant, name, milli))
    typer.echo(f"project {tenant}/{name}: quota {gpus(milli)} GPUs")


@quota_app.command("show")
def show(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (amounts in milli-GPU).")] = False,
    allocated: Annotated[
        float, typer.Option(help="Cluster allocation fraction 0..1 for the cap ratio (default: idle, max ratio).")
    ] = 0.0,
) -> None:
    """Every account: quota, cap, used, reserved, borrowed and headroom (GPUs)."""
    if not 0.0 <= allocated <= 1.0:
        raise typer.BadParameter(
            f"{allocated} is not in 0..1: pass the allocated share of the pool", param_hint="'--allocated'"
        )
    ratio, views = _run(lambda ledger: (ledger.policy.ratio(allocated), ledger.accounts()))
    accounts = [
        {
            "account": str(v.key),
            "tenant": v.key.tenant,
            "project": v.key.project,
            "quota": v.quota,
            "cap": v.cap(ratio),
            "used": v.used,
            "reserved": v.reserved,
            "borrowed": v.borrowed,
            "headroom": v.headroom(ratio),
        }
        for v in views
    ]
    if as_json:
        typer.echo(json.dumps({"unit": "milli-gpu", "ratio": ratio, "accounts": accounts}, indent=2))
        return
    table = Table(title=f"quota ledger (GPUs; cap = quota x {ratio:.3f})")
    for column in ("account", "quota", "cap", "used", "reserved", "borrowed", "headroom"):
        table.add_column(column, justify="left" if column == "account" else "right")
    for a in accounts:
        name = str(a["account"]) if a["project"] is None else f"  {a['account']}"
        table.add_row(name, *(gpus(a[c]) for c in ("quota", "cap", "used", "reserved", "borrowed", "headroom")))  # type: ignore[arg-type]
    Console(width=120).print(table)


@quota_app.command("history")
def history(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's accounts.")] = None,
    project: Annotated[str | None, typer.Option(help="Only this project's account.")] = None,
    kind: Annotated[
        str | None, typer.Option(help=f"Only entries of this kind: {', '.join(k.value for k in EntryKind)}.")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, help="Show the latest LIMIT entries.")] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON lines (amounts in milli-GPU).")] = False,
) -> None:
    """Ledger entries, oldest first, filtered by tenant, project and kind."""
    found = _run(lambda ledger: ledger.entries(tenant, project, kind, limit))
    if as_json:
        for e in found:
            typer.echo(json.dumps(e.__dict__, sort_keys=True))
        return
    table = Table(title=f"ledger entries ({len(found)}, GPUs)")
    for column in ("id", "time (UTC)", "kind", "account", "bucket", "amount", "request", "cause", "details"):
        table.add_column(column, justify="right" if column in ("id", "amount") else "left")
    for e in found:
        when = datetime.fromtimestamp(e.at, UTC).strftime("%Y-%m-%d %H:%M:%S")
        amount = gpus(e.amount) if e.amount <= 0 else f"+{gpus(e.amount)}"
        details = ", ".join(f"{k}={v}" for k, v in sorted(e.details.items()))
        table.add_row(str(e.id), when, e.kind, e.account, e.bucket, amount, e.request_id or "", e.cause, details)
    Console(width=160).print(table)
