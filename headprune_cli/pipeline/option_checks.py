"""Stage option values checked the way their commands will check them, before any
stage runs: a bad `protect:` or a NaN ratio in the last stage must not cost the
scoring and fine-tuning before it (and must never be mistaken for a path to hash).

Each check is the parser the command itself uses, so the two cannot disagree; and once
the stages are wired, each stage's options are built as its `run` will build them and
their own `check()` is called (check_stage_options), so every refusal a stage makes from
its options alone comes before the first stage runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from headprune_cli.errors import HeadpruneError, first_line
from headprune_cli.pipeline.config import format_errors
from headprune_cli.stages import unit
from headprune_cli.stages.iterate.schedule import check_schedule
from headprune_cli.stages.score.importance import HEAD_METHODS
from headprune_cli.stages.select.chains import parse_protect, parse_threshold
from headprune_cli.stages.unit import comma_list


def _protect(value: Any) -> None:

    parse_protect(str(value))


def _threshold(value: Any) -> None:

    parse_threshold(str(value))


def _method(value: Any) -> None:
    from headprune_cli.stages.score.importance.api import make_scorer  # noqa: PLC0415 (keeps torch, transformers out of this module's import)

    make_scorer(str(value))


def _weights(value: Any) -> None:
    from headprune_cli.stages.score.importance.baselines import parse_weights  # noqa: PLC0415 (keeps torch, transformers out of this module's import)

    parse_weights([str(v) for v in value] if isinstance(value, list) else [str(value)], list(HEAD_METHODS))


def _schedule(value: Any) -> None:

    check_schedule(comma_list(value, float, "schedule"))


def _cost_schedule(budget: str) -> Callable[[Any], None]:
    def check(value: Any) -> None:

        check_schedule(comma_list(value, float, f"target_{budget}"), budget)

    return check


CHECKS: dict[tuple[str, str], Callable[[Any], None]] = {
    **{(command, "protect"): _protect for command in ("select", "prune")},
    **{(command, "threshold"): _threshold for command in ("select", "prune")},
    ("score", "method"): _method,
    ("score", "weights"): _weights,
    ("iterate", "schedule"): _schedule,
    ("iterate", "target_flops"): _cost_schedule("flops"),
    ("iterate", "target_params"): _cost_schedule("params"),
}


def check_values(command: str, options: dict[str, Any], where: str, problems: list[str]) -> None:
    """Append one problem per option value its command would refuse."""
    for key, value in options.items():
        check = CHECKS.get((command, key))
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
