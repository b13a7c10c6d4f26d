"""`headprune report` on the workspace of tests/stages/report/conftest.py, kept fast."""

from __future__ import annotations

FAST_REPORT = ("--seq-len", "16", "--repeats", "2", "--warmup", "0", "--batch-size", "8")


def run_report(cli, folder, *extra):
    """Report on the pruned model of the `models` workspace against dev.jsonl, with `extra` options."""
    return cli("report", "--model", folder / "pruned.safetensors", "--data", folder / "dev.jsonl", *FAST_REPORT, *extra)
