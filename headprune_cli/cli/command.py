"""A Typer command made from a stage's options model.

Each field of the options model becomes one option (or argument) with the field's
default, help text, flags and bounds, so a default or a help line is written once, in
the model. The command builds the options from what click parsed and hands them to the
body (which calls the stage's `run`); a non-zero exit code of the result ends the process
with that code (3: a report gate failed).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import annotated_types
import typer
from pydantic import ValidationError

from headprune_cli.errors import UsageError
from headprune_cli.stages.unit import Options, public_fields, text_form


def from_options(options: type[Options]) -> Callable:
    """Decorator: `body(opts) -> Result | None` becomes a Typer command function."""

    def decorate(body: Callable) -> Callable:
        parameters = [_parameter(name, info) for name, info in public_fields(options).items()]

        def command(**values):
            try:
                opts = options(**values)
            except ValidationError as exc:
                raise UsageError(_first_problem(exc, options)) from None
            result = body(opts)
            code = getattr(result, "exit_code", 0)
            if code:
                raise typer.Exit(code)

        # inspect.signature (which typer reads) honours __signature__; typeshed's function type does not declare it
        command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in parameters}
        command.__name__, command.__qualname__ = body.__name__, body.__qualname__
        command.__doc__, command.__module__ = body.__doc__, body.__module__
        return command

    return decorate


def _parameter(name: str, info) -> inspect.Parameter:
    extra = info.json_schema_extra or {}
    annotation, default = text_form(info)
    default = ... if info.is_required() else default
    if extra.get("argument"):
        param = typer.Argument(default, help=info.description)
    else:
        flags = flags_of(name, info)
        if extra.get("negative"):
            flags = [f"{flags[-1]}/{extra['negative']}", *flags[:-1]]
        low, high = bounds(info)
        param = typer.Option(default, *flags, help=info.description, min=low, max=high)
    return inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=param, annotation=annotation)


def flags_of(name: str, info) -> list[str]:
    """The option's flags, the long one last ('-o', '--output')."""
    flags = list((info.json_schema_extra or {}).get("flags") or [])
    return sorted(flags or ["--" + name.replace("_", "-")], key=lambda f: f.startswith("--"))


def bounds(info) -> tuple[float | None, float | None]:
    """The field's numeric ge/le bounds (an int stays an int: typer picks an IntRange from it)."""
    low = next(
        (m.ge for m in info.metadata if isinstance(m, annotated_types.Ge) and isinstance(m.ge, int | float)), None
    )
    high = next(
        (m.le for m in info.metadata if isinstance(m, annotated_types.Le) and isinstance(m.le, int | float)), None
    )
    return low, high


def _first_problem(exc: ValidationError, options: type[Options]) -> str:
    error = exc.errors()[0]
    name = str(error["loc"][0]) if error["loc"] else ""
    info = options.model_fields.get(name)
    where = flags_of(name, info)[-1] if info is not None else name
    return f"{where}: {error['msg']} (got {error.get('input')!r})"
