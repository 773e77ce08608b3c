"""The `xirang` command."""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True, help="Xirang: one GPU pool for training and inference.")


def main() -> None:
    """Entry point for `python -m xirang_platform.cli`."""
    app()


if __name__ == "__main__":
    main()
