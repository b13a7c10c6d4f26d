"""Stage option values checked the way their commands will check them, before any
stage runs: a bad `protect:` or a NaN ratio in the last stage must not cost the
scoring and fine-tuning before it (and must never be mistaken for a path to hash).

Each check is the parser the command itself uses, declared by the stage (`Stage.checks`), so
the two cannot disagree and a new stage brings its own; and once
the stages are wired, each stage's options are built as its `run` will build them and
their own `check()` is called (check_stage_options), so every refusal a stage makes from
its options alone comes before the first stage runs.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from headprune_cli.errors import HeadpruneError, first_line
from headprune_cli.pipeline.config import format_errors
from headprune_cli.stages import unit


def check_values(command: str, options: dict[str, Any], where: str, problems: list[str]) -> None:
    """Append one problem per option value its command would refuse."""
    for key, value in options.items():
        check = unit.get(command).checks.get(key)
        if check is None or value is None:
            continue
        try:
            check(value)
        except HeadpruneError as exc:
            problems.append(f"{where}.{key}: {str(exc).splitlines()[0] if str(exc) else 'invalid'}")


def check_stage_options(stages: list, problems: list[str]) -> None:
    """Each wired stage's options model validated as execute will validate it, then its
    `check()`: one problem per stage that its `run` would refuse before reading a file.
    Stages whose keys were already refused are skipped (one report per mistake)."""

    for i, stage in enumerate(stages):
        if not stage.checked:
            continue
        where, declared = f"stages.{i} ({stage.name})", unit.get(stage.command)
        try:
            # A None is a value already reported (an unset ${VAR}) or `key: null`: the default here.
            declared.options.model_validate({k: v for k, v in stage.params.items() if v is not None}).check()
        except ValidationError as exc:
            missing = all(e["type"] == "missing" for e in exc.errors())  # wiring reports those itself
            problems += [] if missing else format_errors(exc, f"{where}.", list(declared.options.model_fields))
        except HeadpruneError as exc:
            problems.append(f"{where}: {first_line(exc)}")
