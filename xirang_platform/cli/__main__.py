"""`python -m xirang_platform.cli`: the `xirang` command."""

from xirang_platform.cli import main

main()
