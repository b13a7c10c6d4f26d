"""A stage as one unit: an options model, its declared inputs and outputs, and `run`.

The options model (pydantic) is the single home of a stage's defaults, help text and
validation. The Typer command (cli/) turns its fields into command-line options, builds
the options and calls `run`; `headprune run` (pipeline/) builds the same options from
YAML and calls `run` directly, wiring stages together from the declarations below.
Nothing here imports torch: `select --help` and `headprune run --check` stay fast.
"""

from __future__ import annotations

import importlib
import keyword
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.json_schema import JsonDict

from headprune_cli.errors import UsageError
from headprune_cli.names import did_you_mean


class Options(BaseModel):
    """Base of every stage's options. Unknown keys, NaN and infinities are refused (NaN passes
    every bound: nan < 1 and nan > 0 are both false; no option means an infinite number);
    numbers given where text is expected (`threshold: 0.01`, `schedule: 0.5` in YAML) are
    read as their text."""

    model_config = ConfigDict(
        extra="forbid", coerce_numbers_to_str=True, arbitrary_types_allowed=True, allow_inf_nan=False
    )

    @model_validator(mode="before")
    @classmethod
    def _scalars_into_lists(cls, values: Any) -> Any:
        # A repeatable option (`--weights a=1 --weights b=2`) may be one value in YAML.
        if isinstance(values, dict):
            for name, info in cls.model_fields.items():
                if (
                    name in values
                    and _is_list(info.annotation)
                    and not isinstance(values[name], (list, tuple, type(None)))
                ):
                    values = {**values, name: [values[name]]}
        return values

    def check(self) -> None:
        """Refusals that need no file (names, ranges, options that exclude each other): a
        stage's `run` calls it first, and `headprune run` calls it for every stage before
        the first one runs. Stages override it; the base refuses nothing."""


def option(
    default: Any = ...,
    help: str = "",
    *flags: str,
    ge: float | None = None,
    le: float | None = None,
    negative: str | None = None,
    argument: bool = False,
    folder: bool = False,
) -> Any:
    """A field of an options model with what its command-line option needs: `flags`
    ('-o', '--output'; default --FIELD-NAME), `negative` ('--no-normalize'), whether it is
    a positional `argument`, whether a path names a `folder` rather than a file to read."""
    extra: JsonDict = {"flags": list(flags), "negative": negative, "argument": argument, "folder": folder}
    return Field(default, description=help, ge=ge, le=le, json_schema_extra=extra)


def internal(default: Any) -> Any:
    """A field a library caller (or a test) may set but no command line or YAML stage can:
    neither the Typer command nor the pipeline offers it."""
    return Field(default, json_schema_extra={"internal": True})


class CommaSeparated:
    """Marks a list field that the command line and YAML spell as one comma-separated text
    ('0.9,0.8'): its command-line option takes that text, and the model splits it."""


def text_form(info) -> tuple[Any, Any]:
    """(annotation, default) of a field as the command line and YAML spell it: a
    comma-separated list field is one text; any other field is itself."""
    optional = [getattr(a, "__metadata__", ()) for a in typing.get_args(info.annotation)]  # `X | None`
    if not any(isinstance(m, CommaSeparated) for m in [*info.metadata, *(m for ms in optional for m in ms)]):
        return info.annotation, info.default
    default = info.default if info.default is None else ",".join(str(v) for v in info.default)
    return (str | None) if default is None else str, default


def public_fields(options: type[BaseModel]) -> dict[str, Any]:
    """The fields that are options of the command and keys of its pipeline stage."""
    return {
        name: info
        for name, info in options.model_fields.items()
        if not (isinstance(info.json_schema_extra, dict) and info.json_schema_extra.get("internal"))
    }


def _is_list(annotation) -> bool:
    args = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    return any(typing.get_origin(a) in (list, tuple) for a in args)


@dataclass
class Context:
    """What a running stage talks to: a stderr console for people, progress bars on or off."""

    console: Any = None  # a rich Console on stderr
    progress: bool = True

    def __post_init__(self):
        if self.console is None:
            from rich.console import Console  # noqa: PLC0415 (rich's console only when a stage runs)

            self.console = Console(stderr=True)

    def print(self, *args, **kwargs) -> None:
        self.console.print(*args, **kwargs)


@dataclass
class Result:
    """What every stage returns: the files it wrote and its exit code (3 = a gate failed)."""

    outputs: list[str] = field(default_factory=list)
    exit_code: int = 0
    value: Any = None  # the stage's own result (a report, a plan, a model)


@dataclass(frozen=True)
class Stage:
    """One stage: its options, its `run`, and how the pipeline wires it.

    `inputs` maps an option to the artifact roles that may feed it, tried in order;
    `outputs` maps an option to the file it writes inside the pipeline's folder
    (`{stem}` = the stage's name); `makes` names the roles its outputs become; `needs` the
    options that must end up set. `optional_outputs` are extra files a stage entry may
    switch on with `KEY: true`; `refused` options its pipeline stage cannot take, and why;
    `moved` options it no longer has, each with the stage that took it over (the command
    line and the pipeline refuse them with a line naming that stage).
    `checks` maps an option to the parser its command reads it with: `headprune run` runs it on
    the YAML value before any stage runs (raising HeadpruneError on a value the command refuses).
    The command line is made from the same unit (cli/app.py): a stage needs no command module.
    """

    name: str
    options: type[Options]
    run: Callable[[Any, Context], Result]  # takes its own Options subclass (a Callable's argument is contravariant)
    stem: str
    inputs: dict[str, tuple[str, ...]] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)
    makes: dict[str, str] = field(default_factory=dict)
    needs: tuple[str, ...] = ()
    optional_outputs: dict[str, str] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    moved: dict[str, str] = field(default_factory=dict)
    in_pipeline: bool = True
    checks: dict[str, Callable[[Any], None]] = field(default_factory=dict)  # option -> its parser, for raw YAML
    help: str = ""  # `headprune NAME --help` (its first line: the command list); cli/ builds the command from this unit


# The stages, in pipeline order. Stage NAME is defined by the module
# headprune_cli.stages.NAME.stage (a Python keyword gets a trailing underscore: import_),
# imported only when asked for.
NAMES = (
    "import",
    "profile",
    "score",
    "select",
    "search",
    "prune",
    "learn",
    "finetune",
    "iterate",
    "report",
    "sweep",
    "tasks",
    "export",
)


def module_of(name: str) -> str:
    """The module that defines stage `name`'s STAGE: the rule every stage follows."""
    package = f"{name}_" if keyword.iskeyword(name) else name
    return f"headprune_cli.stages.{package}.stage"


def get(name: str) -> Stage:
    if name not in NAMES:
        raise UsageError(f"unknown stage {name!r}{did_you_mean(name, NAMES)}")
    return importlib.import_module(module_of(name)).STAGE


def run_stage(name: str, *, progress: bool = False, **options: Any) -> Result:
    """Stage `name` run in this process as `headprune NAME` runs it: its options model built from
    `options` (the keys of a `headprune run` YAML stage entry), checked and run. The library's one
    entry to every stage, so scripts need no stage's internals."""
    stage = get(name)
    return stage.run(stage.options(**options), Context(progress=progress))


def all_stages() -> dict[str, Stage]:
    return {name: get(name) for name in NAMES}


def comma_list(text: str, kind: type, name: str) -> list:
    """'0.1,0.2' -> [0.1, 0.2]: the one parser of comma-separated option values."""
    try:
        values = [kind(part) for part in str(text).split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"{name}: expected a comma-separated list of {kind.__name__} values, got {text!r}") from None
    if not values:
        raise UsageError(f"{name}: empty list")
    if len(set(values)) != len(values):
        raise UsageError(f"{name}: {text!r} repeats a value")
    return values
