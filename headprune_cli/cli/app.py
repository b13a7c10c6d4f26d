"""The `headprune` application and its single error mapping.

Exit codes: 0 success, 1 error, 2 usage, 3 a report gate failed. Errors print one
line `Error: ...` on stderr; HEADPRUNE_DEBUG=1 adds the traceback.
"""

from __future__ import annotations

import os
import sys
import traceback

import typer

from headprune_cli.errors import EXIT_ERROR, EXIT_USAGE, HeadpruneError
from headprune_cli.cli import (
    export_cmd, finetune_cmd, import_cmd, inspect_cmd, iterate_cmd, prune_cmd, report_cmd, run_cmd, score_cmd, select_cmd, sweep_cmd,
)

app = typer.Typer(
    name="headprune",
    help=(
        "Remove attention heads and layers from trained Transformers, with the quality loss "
        "measured.\n\nPipeline: import -> score -> select -> prune -> finetune -> report "
        "(or all at once: headprune run config.yaml)."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode="rich",
)
# In pipeline order, which is also the order `headprune --help` lists them.
app.command("import")(import_cmd.import_model)
app.command("inspect")(inspect_cmd.inspect)
app.command("score")(score_cmd.score)
app.command("select")(select_cmd.select)
app.command("prune")(prune_cmd.prune)
app.command("finetune")(finetune_cmd.finetune_command)
app.command("iterate")(iterate_cmd.iterate)
app.command("report")(report_cmd.report)
app.command("sweep")(sweep_cmd.sweep)
app.command("export")(export_cmd.export)
app.command("run")(run_cmd.run)


def _debug() -> bool:
    return os.environ.get("HEADPRUNE_DEBUG", "") not in ("", "0")


def _fail(message: str, code: int) -> int:
    if _debug():
        traceback.print_exc()
    first = (message.strip().splitlines() or ["unknown error"])[0]
    print(f"Error: {first}", file=sys.stderr)
    return code


def _quiet_transformers() -> None:
    # transformers' own progress bars and advice would mix into our stderr output.
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def main(argv: list[str] | None = None) -> int:
    _quiet_transformers()
    try:
        result = app(args=argv, prog_name="headprune", standalone_mode=False)
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        return _fail("interrupted", 130)
    except typer.TyperException as exc:  # click's usage errors, as Typer vendors them
        ctx = getattr(exc, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        return _fail(exc.format_message() + hint, getattr(exc, "exit_code", EXIT_USAGE))
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except HeadpruneError as exc:
        return _fail(str(exc), exc.exit_code)
    except BrokenPipeError:
        return EXIT_ERROR
    except MemoryError:
        return _fail("out of memory", EXIT_ERROR)
    except Exception as exc:  # a bug: still one line, traceback on request
        return _fail(f"unexpected {type(exc).__name__}: {exc} (set HEADPRUNE_DEBUG=1 for details)", EXIT_ERROR)
    return result if isinstance(result, int) else 0


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
