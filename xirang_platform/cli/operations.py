"""`xirang metrics serve`, `usage`, `queue`, `check-config`: the operations commands (DESIGN.md section 10).

They read the platform config (`--config`, else `XIRANG_CONFIG`, else `./xirang.yaml`) for the pool
and the overcommit policy, the ledger it names (`--ledger-url` overrides it) without migrating it, and
the Dagster instance of `DAGSTER_HOME`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from xirang_platform.base.user_input import print_error
from xirang_platform.control.live_config import read_live
from xirang_platform.control.platform_config import PlatformConfig, PlatformConfigError
from xirang_platform.ledger.errors import LedgerError
from xirang_platform.ledger.ledger import Ledger
from xirang_platform.ledger.read_only import open_for_reading
from xirang_platform.operations.config_check import check_config, quota_checks
from xirang_platform.operations.exporter import DEFAULT_HOST, DEFAULT_PORT, XirangCollector, serve
from xirang_platform.operations.queue_view import queue_table, read_queue
from xirang_platform.operations.usage import totals, usage, usage_table

if TYPE_CHECKING:  # imported where used: most commands never open the Dagster instance
    from dagster import DagsterInstance

DEFAULT_WORKSPACE = "workspace.yaml"
metrics_app = typer.Typer(no_args_is_help=True, help="The Prometheus exporter of the pool, the ledger and the queue.")

ConfigOption = Annotated[
    Path | None, typer.Option("--config", help="The platform config (default: XIRANG_CONFIG, else ./xirang.yaml).")
]
LedgerOption = Annotated[
    str | None, typer.Option("--ledger-url", help="The ledger to read (default: the platform config's).")
]


def fail(message: str) -> typer.Exit:
    """Print `message` as an error and return the exit to raise."""
    print_error(message)
    return typer.Exit(1)


@contextmanager
def platform_and_ledger(config: Path | None, ledger_url: str | None) -> Iterator[tuple[PlatformConfig, Ledger]]:
    """The platform config in force (while an edit of it is bad, the last good one, said on stderr) and
    its ledger opened for reading; a config with no good version, or a bad ledger, exits with the reason."""
    try:
        reading = read_live(config)
        if reading.problem:
            typer.echo(f"warning: {reading.line()}", err=True)
        platform = reading.config
        ledger = open_for_reading(ledger_url or platform.ledger_url)
    except (PlatformConfigError, LedgerError) as e:
        raise fail(str(e)) from None
    try:
        yield platform, ledger
    finally:
        ledger.close()


def dagster_instance() -> DagsterInstance:
    """The Dagster instance of `DAGSTER_HOME`; exits with the fix when it is unset or not a folder."""
    from dagster import DagsterInstance

    home = os.environ.get("DAGSTER_HOME", "")
    if not home or not Path(home).is_dir():
        raise fail(
            f"DAGSTER_HOME is {'unset' if not home else repr(home) + ', not a folder'}: point it at the platform's "
            f"Dagster home (the folder with its dagster.yaml; `make run` uses .xirang/dagster)"
        )
    return DagsterInstance.get()


@metrics_app.command("serve")
def serve_command(
    port: Annotated[int, typer.Option(help="The port of /metrics.", min=1, max=65535)] = DEFAULT_PORT,
    host: Annotated[
        str,
        typer.Option(
            "--host",
            help="The address to listen on: this machine only by default; 0.0.0.0 to let other machines "
            "(a Prometheus server elsewhere, a pod's Service) scrape it.",
        ),
    ] = DEFAULT_HOST,
    config: ConfigOption = None,
    ledger_url: LedgerOption = None,
) -> None:
    """Serve /metrics: pool, ledger, queue, counters and the tick's step durations, read on each scrape."""
    with platform_and_ledger(config, ledger_url) as (platform, ledger):
        for finding in quota_checks(platform):  # `xirang check-config` lists them all
            typer.echo(f"warning: {finding.message}", err=True)
        collector = XirangCollector(
            ledger,
            dagster_instance(),
            platform.pool,
            platform.overcommit,
            config_problem=lambda: read_live(config).problem,
        )
        try:
            serve(collector, port, host)
        except OSError as e:
            raise fail(f"cannot listen on {host}:{port} ({e.strerror}): pick a free port with --port") from None
        typer.echo(f"xirang exporter: http://{host}:{port}/metrics (Ctrl-C stops it)")
        with suppress(KeyboardInterrupt):
            threading.Event().wait()


def _day(text: str | None, option: str) -> date | None:
    if text is None:
        return None
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a day: write it as YYYY-MM-DD (UTC)", param_hint=option) from None


DEFAULT_USAGE_DAYS = 7


def usage_days(first: date | None, last: date | None, today: date) -> tuple[date, date]:
    """The days a usage report covers: the given ones; a missing `--to` is today, a missing `--from`
    the first of the `DEFAULT_USAGE_DAYS` days that end on the last."""
    end = last or today
    return first or end - timedelta(days=DEFAULT_USAGE_DAYS - 1), end


def usage_command(
    first: Annotated[
        str | None, typer.Option("--from", help="The first day, YYYY-MM-DD (UTC); default: 6 days before --to.")
    ] = None,
    last: Annotated[
        str | None, typer.Option("--to", help="The last day, YYYY-MM-DD (UTC), included; default: today.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object: the days, the rows, the totals.")] = False,
    config: ConfigOption = None,
    ledger_url: LedgerOption = None,
) -> None:
    """GPU-hours per tenant, project and day (7 days to today by default): in quota, borrowed, lent, preempted, lost."""
    now = time.time()
    start, end = usage_days(_day(first, "'--from'"), _day(last, "'--to'"), datetime.fromtimestamp(now, UTC).date())
    with platform_and_ledger(config, ledger_url) as (platform, ledger):
        try:
            rows = usage(ledger.entries(), start, end, now, platform.scheduler.checkpoint_interval_s)
        except ValueError as e:
            raise fail(str(e)) from None
    docs = [r.as_dict() for r in rows]
    sums = {k: round(v, 6) for k, v in totals(rows).items()}
    if as_json:
        typer.echo(json.dumps({"from": start.isoformat(), "to": end.isoformat(), "rows": docs, "totals": sums}))
        return
    if not rows:
        typer.echo(f"no GPU usage recorded from {start} to {end} (UTC days)")
        return
    typer.echo(usage_table(docs))


def queue_command(
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant's runs.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object: the time and the rows.")] = False,
    config: ConfigOption = None,
    ledger_url: LedgerOption = None,
) -> None:
    """Every waiting run: tenant, project, tier, GPUs, position in its tier, hold reason, since, estimated start."""
    now = time.time()
    with platform_and_ledger(config, ledger_url) as (platform, ledger):
        if tenant is not None and tenant not in platform.book.tenants:
            raise fail(f"unknown tenant {tenant!r}: use one of {', '.join(sorted(platform.book.tenants))}")
        rows = read_queue(dagster_instance(), ledger, platform, now, tenant)
    if as_json:
        typer.echo(json.dumps({"at": now, "rows": [r.as_dict(now) for r in rows]}))
        return
    if not rows:
        typer.echo("no run is waiting" + (f" for tenant {tenant}" if tenant else ""))
        return
    typer.echo(queue_table(rows, now))


def check_config_command(
    config: ConfigOption = None,
    workspace: Annotated[
        Path | None,
        typer.Option(
            "--workspace", help="The Dagster workspace whose code locations are checked (default: ./workspace.yaml)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="The findings as one JSON object.")] = False,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 1 on warnings too.")] = False,
) -> None:
    """Check the platform config: quotas past the pool, projects past their tenant, locations, tier preferences."""
    if workspace is None and Path(DEFAULT_WORKSPACE).is_file():
        workspace = Path(DEFAULT_WORKSPACE)
    try:
        found = check_config(config, workspace)
    except PlatformConfigError as e:
        raise fail(str(e)) from None
    if as_json:
        typer.echo(json.dumps({"findings": [f.as_dict() for f in found]}))
    elif not found:
        typer.echo("the platform config is fine" + ("" if workspace else " (no workspace: locations not checked)"))
    for f in [] if as_json else found:
        typer.echo(f"{f.severity}: {f.message} [{f.check}]")
    if any(f.severity == "error" for f in found) or (strict and found):
        raise typer.Exit(1)
