"""The `headprune` application and its single error mapping.

Exit codes: 0 success, 1 error, 2 usage, 3 a report gate failed, 70 an internal error
(a bug), 130 interrupted (SIGINT or SIGTERM; temporaries are removed first). Refusals
print one line `Error: ...` on stderr, bugs one line `Internal error: ...`;
HEADPRUNE_DEBUG=1 adds the traceback.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import typer
from typer._click import Command, Context, HelpFormatter  # typer's vendored click: the classes its groups use
from typer.core import TyperCommand, TyperGroup

from headprune_cli.cli.command import from_options
from headprune_cli.cli.common import context
from headprune_cli.errors import EXIT_INTERRUPTED, EXIT_USAGE, Interrupted, PeerFault, UsageError, report
from headprune_cli.files.outputs import own_claims
from headprune_cli.files.temps import forget_sweeps, sweep
from headprune_cli.files.watcher import watched
from headprune_cli.model.optional_imports import in_cli
from headprune_cli.names import did_you_mean
from headprune_cli.runtime.allocator import return_freed_memory
from headprune_cli.stages import unit

# The commands that are not stages: command name -> (module in this package, function).
TOOLS = {"inspect": ("inspect_cmd", "inspect"), "run": ("run_cmd", "run")}


def _command_names() -> tuple[str, ...]:
    """Every stage of the registry (stages/unit.py NAMES) in pipeline order, which is also the
    order `headprune --help` lists them, with `inspect` after `import` (it reads what import
    writes) and `run` (all the stages at once) last."""
    names = list(unit.NAMES)
    names.insert(names.index("import") + 1, "inspect")
    return (*names, "run")


# Command modules load only when their command runs, so a JSON stage such as `select` never
# imports torch (it starts in well under 1 s, BENCHMARKS.md §9).
COMMANDS = _command_names()


def command_function(name: str) -> Callable:
    """The Typer function of command `name`: a stage's is made from its unit (options, run,
    help), a tool's is its module's function. Imports what the command needs."""
    if name in TOOLS:
        module_name, function = TOOLS[name]
        return getattr(importlib.import_module(f"{__package__}.{module_name}"), function)
    stage = unit.get(name)

    def body(opts):
        return stage.run(opts, context())

    body.__doc__, body.__name__, body.__qualname__ = stage.help, name, name
    return from_options(stage.options)(body)


def load_command(name: str) -> Command:
    """The real click command for `name`: imports its module (and what that needs)."""
    single = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode="rich")
    single.command(name)(command_function(name))
    return typer.main.get_command(single)


def all_commands() -> dict[str, Command]:
    """Every command, loaded: what `headprune run` validates stage options against."""
    return {name: load_command(name) for name in COMMANDS}


def _short_help(name: str) -> str:
    """The first line of a command's help, read from its source without importing it (a stage
    module may import torch): a tool's docstring, or the HELP its stage module declares."""
    if name in TOOLS:
        module_name, function = TOOLS[name]
        source = _source(f"{__package__}.{module_name}")
        node = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == function)
        return (ast.get_docstring(node) or "").strip().splitlines()[0]
    source = _source(unit.module_of(name))
    help_text = next(
        n.value.value
        for n in ast.parse(source).body
        if isinstance(n, ast.Assign)
        and [getattr(t, "id", None) for t in n.targets] == ["HELP"]
        and isinstance(n.value, ast.Constant)
    )
    return str(help_text).strip().splitlines()[0]


def _source(module: str) -> str:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module  # a registered module is in the package
    return Path(spec.origin).read_text()


class LazyCommands(TyperGroup):
    """Lists the commands of COMMANDS and imports one only when it is needed: to run it,
    to show its --help, or to read its options (`headprune run`)."""

    _listing = False

    def list_commands(self, ctx: Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Context, name: str) -> Command | None:
        if name not in COMMANDS:
            return None
        if self._listing:  # `headprune --help` shows names and one-line help only
            return TyperCommand(name, help=_short_help(name))
        return load_command(name)

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False

    def resolve_command(self, ctx: Context, args: list[str]):
        if args and args[0] not in COMMANDS and not args[0].startswith("-"):
            ctx.fail(f"No such command {args[0]!r}.{did_you_mean(args[0], COMMANDS)}")
        if args:
            refuse_moved(args[0], args[1:])
        return super().resolve_command(ctx, args)


def refuse_moved(command: str, args: list[str]) -> None:
    """An option that moved to another command (the stage's `moved`) is refused with one line
    naming that command, where click would only call it unknown."""
    if command not in unit.NAMES:
        return
    moved = unit.get(command).moved
    given = [arg.split("=", 1)[0][2:].replace("-", "_") for arg in args if arg.startswith("--")]
    name = next((name for name in given if name in moved), None)  # the first one on the line
    if name is not None:
        new = moved[name]
        flag = "--" + name.replace("_", "-")
        raise UsageError(f"{command} {flag}: moved to `headprune {new}` (see `headprune {new} --help`)")


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
    cls=LazyCommands,
)


@app.callback()
def _root() -> None:
    pass


def _debug() -> bool:
    return os.environ.get("HEADPRUNE_DEBUG", "") not in ("", "0")


def _fail(message: str, code: int, prefix: str = "Error") -> int:
    if _debug():
        traceback.print_exc()
    first = (message.strip().splitlines() or ["unknown error"])[0]
    print(f"{prefix}: {first}", file=sys.stderr)
    return code


def _quiet_transformers() -> None:
    # transformers' own progress bars and advice would mix into our stderr output. The
    # environment reaches it without importing it here (seconds that `select` does not need).
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules:  # already imported (a library caller): tell it directly
        from transformers.utils import logging as hf_logging  # noqa: PLC0415 (keeps transformers out of --help)

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()


@contextmanager
def _signals_interrupt():
    """While a command runs, SIGINT and SIGTERM raise Interrupted in the main thread.

    SIGTERM's default action kills the process on the spot, leaving a half-written
    temporary beside its output; as an exception it unwinds through atomic_write's
    cleanup instead. A second SIGTERM is ignored: torchrun stops a worker with killpg, so
    the rank gets one SIGTERM and its watcher (files/watcher.py) passes on another, which
    would otherwise land in the middle of the first one's unwinding (say, while the rank
    names its dead peer). A second Ctrl-C still stops the cleanup; the watcher sweeps what
    it leaves. The previous handlers come back afterwards (tests call main in-process)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stopping = False

    def interrupt(signum, frame):
        nonlocal stopping
        if signum == signal.SIGTERM:
            if stopping:
                return
            stopping = True
        raise Interrupted(signal.Signals(signum).name)

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    _quiet_transformers()
    return_freed_memory()  # peak memory is what is alive, not what glibc kept
    in_cli()  # transformers' unused optional imports stay out (model/optional_imports.py)
    forget_sweeps()
    try:
        with _signals_interrupt(), own_claims():
            result = app(args=argv, prog_name="headprune", standalone_mode=False)
    except Interrupted as exc:
        if str(exc) == "SIGTERM" and isinstance(exc.__context__, PeerFault):
            # torchrun's stop of the survivors landed while this rank was already failing on
            # the peer it names (in a cleanup on the way out): that line is the news
            return report(exc.__context__)
        return _fail("interrupted", EXIT_INTERRUPTED)
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        return _fail("interrupted", EXIT_INTERRUPTED)
    except typer.TyperException as exc:  # click's usage errors, as Typer vendors them
        ctx = getattr(exc, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        return _fail(exc.format_message() + hint, getattr(exc, "exit_code", EXIT_USAGE))
    except KeyboardInterrupt:
        return _fail("interrupted", EXIT_INTERRUPTED)
    except (SystemExit, GeneratorExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - refusals, the environment, bugs (pyo3's PanicException too)
        return report(exc)
    return result if isinstance(result, int) else 0


def run() -> NoReturn:
    """Console-script entry point (and `python -m headprune_cli`, under torchrun too).

    The command runs in a child that this process watches (files/watcher.py): a memory-mapped
    input truncated by another process kills a process by SIGBUS, which only a parent can
    turn into one `Error:` line, exit 1 and removed temporaries."""
    exit_without_teardown(watched(main, lambda folder: sweep(folder, quiet=True)))


def exit_without_teardown(code: int) -> NoReturn:
    """Flush stdout and stderr, then leave without the interpreter's teardown.

    The teardown does nothing a finished command needs and costs seconds: torch
    deregisters, one by one, the ~130 operators that importing it and transformers
    registered (2.3 s on the 2-core machine, a tenth of a streamed prune of a 1 B model).
    By the time main() returns every output is closed, fsynced and renamed, and every
    temporary removed (their own `finally` blocks), so nothing is left to the teardown.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # the reader went away, or the stream was closed
            pass
    os._exit(code)
