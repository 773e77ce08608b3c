"""The `xirang` command: one entry point, a sub-command per layer."""

from __future__ import annotations

import sys
import warnings
from typing import TextIO

import typer

from xirang_platform.cli.demo import demo_command
from xirang_platform.cli.k8s import k8s_app
from xirang_platform.cli.operations import check_config_command, metrics_app, queue_command, usage_command
from xirang_platform.cli.pool import discover_command, pool_app
from xirang_platform.cli.quota import quota_app
from xirang_platform.cli.serving import load_command, serve_command
from xirang_platform.cli.simulate import simulate

app = typer.Typer(no_args_is_help=True, help="Xirang: one GPU pool for training and inference.")


def one_line_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """Print a warning as `warning: MESSAGE` on one line of stderr: the message names what and the fix,
    the Python source line that raised it says nothing to the person at the terminal."""
    print(f"warning: {' '.join(str(message).split())}", file=file or sys.stderr)


@app.callback()
def xirang() -> None:
    """Xirang: one GPU pool for training and inference."""
    warnings.showwarning = one_line_warning


app.add_typer(pool_app, name="pool")
app.add_typer(quota_app, name="quota")
app.add_typer(k8s_app, name="k8s")
app.add_typer(metrics_app, name="metrics")
app.command("discover")(discover_command)
app.command("simulate")(simulate)
app.command("demo")(demo_command)
app.command("usage")(usage_command)
app.command("queue")(queue_command)
app.command("check-config")(check_config_command)
app.command("load")(load_command)
app.command("serve")(serve_command)


def main() -> None:
    """Entry point for `python -m xirang_platform.cli`."""
    app()


if __name__ == "__main__":
    main()
