"""Small pieces every command module shares: the stderr console, JSON on stdout, --device/--dtype."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich.console import Console

from headprune_cli.device import DEVICE_HELP, DTYPE_HELP

# Everything a person reads while waiting goes to stderr; stdout carries data only.
console = Console(stderr=True)


def context():
    """The stage context of a command run from the shell: messages and progress on stderr."""
    from headprune_cli.stages.unit import Context

    return Context(console)


def print_json(value) -> None:
    sys.stdout.write(json.dumps(value, indent=2, allow_nan=False) + "\n")


# --device / --dtype, shared by every command that computes with a model (see device.py).
Device = Annotated[str, typer.Option("--device", help=DEVICE_HELP)]
Dtype = Annotated[str, typer.Option("--dtype", help=DTYPE_HELP)]
