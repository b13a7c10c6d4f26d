"""`python -m headprune_cli` (and `torchrun -m headprune_cli`) runs the CLI."""

from headprune_cli.cli.app import run

run()
