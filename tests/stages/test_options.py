"""The shared option groups (stages/options.py): one declaration per option, ranges stated once."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from headprune_cli.errors import UsageError
from headprune_cli.stages import unit
from headprune_cli.stages.options import MAX_SEED, Options, Schedule, SeedOptions
from headprune_cli.stages.unit import option, text_form

SHARED = ("ratio", "target_params", "target_flops", "min_heads", "protect", "seed", "device", "dtype", "lora_rank")


def _declaring_classes(name: str) -> set[type]:
    """The option classes whose own body declares field `name`."""
    found = set()
    for stage in unit.all_stages().values():
        for cls in stage.options.__mro__:
            if isinstance(cls, type) and issubclass(cls, Options) and name in cls.__dict__.get("__annotations__", {}):
                found.add(cls)
    return found


@pytest.mark.parametrize("name", SHARED)
def test_a_shared_option_is_declared_in_one_class(name):
    classes = _declaring_classes(name)
    # iterate's and sweep's --target-flops are schedules (a list, one budget per round or point)
    schedules = {c for c in classes if c.__name__ in ("IterateOptions", "SweepSettings")}
    assert len(classes - schedules) == 1, sorted(c.__qualname__ for c in classes)
    assert all(c.__module__ == "headprune_cli.stages.options" for c in classes - schedules)


@pytest.mark.parametrize("name", [n for n in unit.NAMES if "seed" in unit.get(n).options.model_fields])
def test_every_seed_is_within_what_torch_and_numpy_take(name):
    options = unit.get(name).options
    assert issubclass(options, SeedOptions)
    info = options.model_fields["seed"]
    for bad in (-1, MAX_SEED + 1, 2**70):
        with pytest.raises(ValidationError, match="seed"):
            SeedOptions(seed=bad)
    assert info.default == 0 and SeedOptions(seed=MAX_SEED).seed == MAX_SEED


def test_learning_rates_and_seconds_are_finite_and_in_range():
    from headprune_cli.stages.finetune.stage import FinetuneOptions
    from headprune_cli.stages.search.stage import SearchOptions

    base = {"checkpoint": "m", "data": "d", "output": "o"}
    for bad in (1e308, float("inf"), float("nan"), -0.1):
        with pytest.raises(ValidationError, match="lr"):
            FinetuneOptions(**base, lr=bad)
        with pytest.raises(ValidationError, match="gate_lr"):
            FinetuneOptions(**base, gate_lr=bad)
    for bad in (float("inf"), float("nan"), 0.0, -1.0):
        with pytest.raises(ValidationError, match="seconds"):
            SearchOptions(checkpoint="m", data="d", ratio=0.5, seconds=bad)
    assert SearchOptions(checkpoint="m", data="d", ratio=0.5, seconds=2.5).seconds == 2.5


class _Swept(Options):
    target_flops: Schedule | None = option(None, "x")
    ratios: Schedule = option([0.1, 0.2], "y")


def test_a_schedule_is_one_text_on_the_command_line_and_a_list_in_the_library():
    assert _Swept(target_flops="0.9,0.8").target_flops == [0.9, 0.8]
    assert _Swept(target_flops=[0.9, 0.8]).target_flops == [0.9, 0.8]
    assert _Swept(target_flops=0.7).target_flops == [0.7]
    assert text_form(_Swept.model_fields["target_flops"]) == (str | None, None)
    assert text_form(_Swept.model_fields["ratios"]) == (str, "0.1,0.2")
    for bad, message in (("a,b", "comma-separated list of float"), ("0.5,0.5", "repeats a value"), (",", "empty")):
        with pytest.raises(UsageError, match=message):
            _Swept(target_flops=bad)


def test_the_artifact_config_tables_name_every_option():
    from headprune_cli.stages.report.settings import CONFIG_KEYS as REPORT_KEYS
    from headprune_cli.stages.report.settings import ReportSettings
    from headprune_cli.stages.sweep.settings import CONFIG_KEYS as SWEEP_KEYS
    from headprune_cli.stages.sweep.settings import SweepSettings
    from headprune_cli.stages.tasks.stage import CONFIG_KEYS as TASKS_KEYS
    from headprune_cli.stages.tasks.stage import NOT_RECORDED, RECORDED_WHEN_GIVEN, TasksOptions

    assert set(TASKS_KEYS) | set(NOT_RECORDED) | set(RECORDED_WHEN_GIVEN) == set(TasksOptions.model_fields)
    assert set(REPORT_KEYS) | {"engine_python"} == set(ReportSettings.model_fields)
    assert {k if k != "targets" else "target_flops" for k in SWEEP_KEYS} == set(SweepSettings.model_fields)
