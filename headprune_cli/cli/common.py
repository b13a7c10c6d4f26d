"""Small pieces every command module shares: the stderr console, the stage context, JSON on stdout."""

from __future__ import annotations

import json
import sys

from rich.console import Console

from headprune_cli.stages.unit import Context

# Everything a person reads while waiting goes to stderr; stdout carries data only.
console = Console(stderr=True)


def context():
    """The stage context of a command run from the shell: messages and progress on stderr."""
    return Context(console)


def print_json(value) -> None:
    sys.stdout.write(json.dumps(value, indent=2, allow_nan=False) + "\n")
