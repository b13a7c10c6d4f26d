"""`python -m headprune_cli` (and `torchrun -m headprune_cli`) runs the CLI."""

from headprune_cli.cli import main

raise SystemExit(main())
