"""`headprune run`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from headprune_cli.cli.common import console, context
from headprune_cli.errors import EXIT_USAGE, one_line
from headprune_cli.pipeline.config import ConfigError
from headprune_cli.pipeline.execute import RESOLVED_FILE, STATE_FILE, execute, exit_code, run_stage
from headprune_cli.pipeline.prepare import prepare


def run(
    config: Annotated[Path, typer.Argument(help="A pipeline config (YAML): model, data, out, seed, stages.")],
    overrides: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Override a config value: KEY.PATH=VALUE (value read as YAML; stages by name or index). Repeatable.",
        ),
    ] = None,
    out: Annotated[str | None, typer.Option("--out", help="Output folder (overrides `out:` in the config).")] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Redo every stage (the out folder must still be new, empty, or an earlier run's)."
        ),
    ] = False,
    check: Annotated[
        bool, typer.Option("--check", help="Validate the config and print the commands it would run; run nothing.")
    ] = False,
) -> None:
    """Run a whole pipeline from a YAML config; every stage's artifact is kept in one folder.

    Each stage's keys are exactly the long options of its command, and each stage runs
    in this process with those options, as the command would. A rerun skips
    stages whose options and input files are unchanged. Exit codes as the stages':
    3 when a report gate failed.

    Examples:

      headprune run configs/demo.yaml

      headprune run configs/demo.yaml --set stages.select.ratio=0.5 --out out/half

      headprune run configs/ci-gate.yaml --check
    """
    try:
        pipeline = prepare(config, overrides or [], out=out)
    except ConfigError as exc:
        # One line per problem: the CLI's single-line error mapping would hide all but one.
        for problem in exc.problems:
            print(f"Error: {one_line(problem)}", file=sys.stderr)
        raise typer.Exit(EXIT_USAGE) from None
    if check:
        for stage in pipeline.stages:
            sys.stdout.write("headprune " + " ".join(stage.argv) + "\n")
        return
    results = execute(
        pipeline,
        lambda stage: run_stage(stage, context()),
        force=force,
        log=lambda line: console.print(line, style="bold", highlight=False, markup=False),
    )
    _summary(results, pipeline.out)
    code = exit_code(results)
    if code:
        raise typer.Exit(code)


def _summary(results, out: Path) -> None:
    table = Table(title=f"headprune run -> {out}", show_header=True)
    for column in ("stage", "command", "status", "exit", "seconds", "artifacts"):
        table.add_column(column)
    for r in results:
        table.add_row(
            r.name, r.command, r.status, str(r.code), f"{r.seconds:.1f}", " ".join(Path(p).name for p in r.outputs)
        )
    console.print(table)
    console.print(f"config as run: {out / RESOLVED_FILE}; stage fingerprints: {out / STATE_FILE}", highlight=False)
