"""The thin Typer layer: one module per command, errors mapped once in `main()`."""

from headprune_cli.cli.app import app, main

__all__ = ["app", "main"]
