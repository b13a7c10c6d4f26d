"""The thin Typer layer: one module per command, errors mapped once in `main()`."""

from .app import app, main

__all__ = ["app", "main"]
