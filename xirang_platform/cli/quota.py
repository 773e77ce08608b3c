"""`xirang quota`: tenants, projects and quotas in the ledger; balances and history.

Quotas are given in GPUs as a decimal number (`8`, `0.5`, `12.25`) and stored in milli-GPU, so at
most three decimals. The ledger is `XIRANG_LEDGER_URL`, else the `ledger_url` of the platform config
`XIRANG_CONFIG` names (the ledger the platform writes), else the SQLite file `./.xirang/ledger.sqlite`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DatabaseError, DataError, IntegrityError

from xirang_platform.base.user_input import InputError, print_error, quota_milli, verbatim
from xirang_platform.control.platform_config import CONFIG_ENV, PlatformConfigError, config_path, load_config
from xirang_platform.control.pool_state import allocated_fraction
from xirang_platform.ledger.db import URL_ENV, ledger_url
from xirang_platform.ledger.errors import LedgerBusy, LedgerError, gpus
from xirang_platform.ledger.ledger import Ledger
from xirang_platform.ledger.tables import EntryKind
from xirang_platform.scheduling.quota import OvercommitPolicy

T = TypeVar("T")
HINT = "'--quota'"
QUOTA_HELP = "GPUs, as a decimal number: 8, 0.5 or 12.25 (stored as milli-GPU, so at most 3 decimals)."

quota_app = typer.Typer(
    no_args_is_help=True,
    help="Tenants, projects and their GPU quotas in the quota ledger (XIRANG_LEDGER_URL, else the "
    "ledger_url of the platform config XIRANG_CONFIG, else ./.xirang/ledger.sqlite).",
)
tenant_app = typer.Typer(no_args_is_help=True, help="Add tenants and set their quotas.")
project_app = typer.Typer(no_args_is_help=True, help="Add projects (each in one tenant) and set their quotas.")
quota_app.add_typer(tenant_app, name="tenant")
quota_app.add_typer(project_app, name="project")


def parse_gpus(text: str) -> int:
    """GPUs as a decimal string -> milli-GPU, by the one quota rule of `user_input.quota_milli`."""
    try:
        return quota_milli(text)
    except InputError as e:
        raise typer.BadParameter(str(e), param_hint=HINT) from None


QuotaOption = Annotated[str, typer.Option("--quota", "-q", help=QUOTA_HELP)]


EXIT_RETRY = 75  # EX_TEMPFAIL: the ledger was busy, nothing was written, the same command may succeed


def cli_ledger_url() -> str:
    """The ledger the CLI opens: `XIRANG_LEDGER_URL`, else the platform config's (`XIRANG_CONFIG`)
    `ledger_url`, else the default SQLite file."""
    if not os.environ.get(URL_ENV) and os.environ.get(CONFIG_ENV):
        configured = load_config().ledger_url
        if configured:
            return configured
    return ledger_url()


def _ledger() -> Ledger:
    return Ledger(cli_ledger_url())


def _fail(message: str, code: int = 1) -> typer.Exit:
    print_error(message)
    return typer.Exit(code)


def ledger_location(url: str) -> str:
    """Where the ledger at `url` is, for people: the URL without its password (and a SQLite file's full path)."""
    parsed = make_url(url)
    shown = parsed.render_as_string()
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        shown += f" ({Path(parsed.database).resolve()})"
    return shown


def _run(action: Callable[[Ledger], T], *, where: Callable[[Ledger], None] | None = None) -> T:
    """Run `action` on the ledger (after `where`, which may say which ledger it is); a LedgerError
    becomes a one-line message and exit code 1 (75 when retrying may succeed)."""
    ledger = None
    try:
        ledger = _ledger()
        if where is not None:
            where(ledger)
        return action(ledger)
    except LedgerBusy as e:
        raise _fail(str(e), EXIT_RETRY) from None
    except (LedgerError, PlatformConfigError) as e:
        raise _fail(str(e)) from None
    except (DataError, IntegrityError):
        raise  # the ledger's own checks should have refused the input first: a bug, keep the traceback
    except DatabaseError as e:
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
        float | None,
        typer.Option(
            help="Cluster allocation fraction 0..1 for the cap ratio (default: the pool's allocation now, "
            "read from the platform config's pool and the ledger's live allocations)."
        ),
    ] = None,
) -> None:
    """Every account: quota, cap (at the pool's allocation now), ceiling, used, reserved, borrowed, headroom (GPUs)."""
    if allocated is not None and not 0.0 <= allocated <= 1.0:
        raise typer.BadParameter(
            f"{allocated} is not in 0..1: pass the allocated share of the pool", param_hint="'--allocated'"
        )

    def where(ledger: Ledger) -> None:
        # On stderr with --json, so that stdout stays one JSON object.
        created = " (created now: it was empty; add a tenant with `xirang quota tenant add NAME --quota 8`)"
        Console(stderr=as_json, soft_wrap=True).print(
            verbatim(f"ledger: {ledger_location(ledger.url)}{created if ledger.created else ''}")
        )

    shares, views = _run(lambda ledger: (_cap_shares(ledger, allocated), ledger.accounts()), where=where)
    policy, fraction = shares
    ratio = policy.ratio(fraction)
    accounts = [
        {
            "account": str(v.key),
            "tenant": v.key.tenant,
            "project": v.key.project,
            "quota": v.quota,
            "cap": v.cap(ratio),
            "ceiling": v.cap(policy.max_ratio),
            "used": v.used,
            "reserved": v.reserved,
            "borrowed": v.borrowed,
            "headroom": v.headroom(ratio),
        }
        for v in views
    ]
    if as_json:
        document = {"unit": "milli-gpu", "allocated": round(fraction, 6), "ratio": ratio}
        typer.echo(json.dumps({**document, "max_ratio": policy.max_ratio, "accounts": accounts}, indent=2))
        return
    table = Table(
        title=f"quota ledger (GPUs; cap = quota x {ratio:.3f} with {fraction:.0%} of the pool allocated; "
        f"ceiling = quota x {policy.max_ratio:g}, the cap of a pool at most {policy.low:.0%} allocated)"
    )
    columns = ("quota", "cap", "ceiling", "used", "reserved", "borrowed", "headroom")
    table.add_column("account", justify="left")
    for column in columns:
        table.add_column(column, justify="right")
    for a in accounts:
        name = str(a["account"]) if a["project"] is None else f"  {a['account']}"
        table.add_row(verbatim(name), *(gpus(m if isinstance(m, int) else None) for m in (a[c] for c in columns)))
    Console(width=120).print(table)


def _cap_shares(ledger: Ledger, allocated: float | None) -> tuple[OvercommitPolicy, float]:
    """The overcommit policy and the pool's allocated share the caps are shown at: `allocated` when
    given, else the ledger's live allocations over the pool of the platform config (`XIRANG_CONFIG`,
    else ./xirang.yaml), as the scheduling tick and the exporter count them. Without a platform config
    the pool is unknown: the ledger's policy at `allocated` or an idle pool."""
    platform = load_config() if config_path().is_file() else None
    policy = platform.overcommit if platform is not None else ledger.policy
    if allocated is not None or platform is None:
        return policy, allocated or 0.0
    return policy, allocated_fraction(sum(a.milli for a in ledger.allocations()), platform.pool.gpu_milli)


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
        cells = (str(e.id), when, e.kind, e.account, e.bucket, amount, e.request_id or "", e.cause, details)
        table.add_row(*map(verbatim, cells))
    Console(width=160).print(table)
