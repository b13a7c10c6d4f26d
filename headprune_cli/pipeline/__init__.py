"""`headprune run`: YAML config (config) -> prepared stages (prepare) -> execution with rerun skipping (execute)."""
