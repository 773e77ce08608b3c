"""`xirang demo`: the command; the scenario itself is `demo.py` (imported on use: it loads Dagster)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import typer


@contextmanager
def stdout_to_stderr() -> Iterator[Callable[[str], None]]:
    """Send what Dagster and its child processes print on fd 1 to stderr; yield a writer to the real stdout,
    so stdout holds only the demo's own lines (or its JSON)."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    out = os.fdopen(os.dup(saved), "w", buffering=1)

    def echo(line: str) -> None:
        out.write(line + "\n")

    try:
        yield echo
    finally:
        sys.stdout.flush()
        out.close()
        os.dup2(saved, 1)
        os.close(saved)


def demo_command(
    as_json: bool = typer.Option(False, "--json", help="Print only the counts, as one JSON object."),
) -> None:
    """Play a scripted scenario on a temporary embedded platform: preemption, scaling, resumption."""
    from xirang_platform.devtools.demo import run_demo
    from xirang_platform.devtools.embedded import EmbeddedError

    try:
        if not as_json:
            typer.echo("xirang demo: a temporary platform, 2 nodes x 4 H100; research quota 4 GPUs, product 6")
        with stdout_to_stderr() as echo:
            report = run_demo(echo=None if as_json else echo)
        if as_json:
            typer.echo(json.dumps(report.counts, sort_keys=True))
            return
    except EmbeddedError as e:
        typer.echo(f"xirang demo: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo("\nledger (GPUs):")
    for line in report.ledger:
        typer.echo(f"  {line}")
    typer.echo("\n" + json.dumps(report.counts, sort_keys=True, indent=2))
