"""`python -m headprune_cli` (and `torchrun -m headprune_cli`) runs the CLI."""

from .cli import main

raise SystemExit(main())
