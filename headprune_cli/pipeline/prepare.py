"""`headprune run`: a YAML config -> validated, wired stages.

Every stage entry is checked against its stage's options model (the one its command is
made from), then becomes the stage's options plus the command line that would run it
(kept for resolved.yaml, `run --check` and the rerun fingerprints). execute.py calls
each stage's `run` with those options. The pipeline adds three things: implicit wiring
(select reads the last scores, prune the
last plan, finetune the current model, report compares the current model with the
starting one), one folder holding every artifact plus `resolved.yaml`, and reruns that
skip a stage whose options and input files (by sha256) are unchanged, redoing that stage
and every later one otherwise (fingerprints in `run-state.json`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from headprune_cli.errors import HeadpruneError, shorten
from headprune_cli.files.io import check_regular
from headprune_cli.files.outputs import MARKER, check_folder
from headprune_cli.names import did_you_mean
from headprune_cli.pipeline.config import (
    ConfigError,
    PipelineConfig,
    apply_overrides,
    expand_env,
    format_errors,
    load_yaml,
    stage_model,
    stage_specs,
)
from headprune_cli.pipeline.option_checks import check_stage_options, check_values
from headprune_cli.stages import unit

# prune options that mean "select inside prune from scores" rather than "apply a plan".
SELECT_KEYS = (
    "ratio",
    "target_params",
    "target_flops",
    "target_block_params",
    "threshold",
    "target_latency",
    "target_ms",
)
LATENCY_KEYS = ("target_latency", "target_ms")  # what makes select read a latency table
STATE_FILE = "run-state.json"  # stage fingerprints, written by execute
RESOLVED_FILE = "resolved.yaml"  # the config as it ran, written by execute
RESERVED = (STATE_FILE, RESOLVED_FILE, MARKER)  # no stage artifact may take these names
# A stage name becomes part of file names in `out`: one plain component, never a path.
STAGE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass
class Stage:
    name: str
    command: str
    options: dict[str, Any]  # YAML keys -> values, as the user wrote them (normalised keys)
    argv: list[str] = field(default_factory=list)  # the command line that does the same
    outputs: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)  # the stage's options, by field name
    checked: bool = True  # its entry passed the checks of its keys (else those problems are reported)


@dataclass
class Pipeline:
    config: PipelineConfig
    stages: list[Stage]
    out: Path
    raw: dict  # the config after --set, for resolved.yaml


# --- validation: everything, before any work ------------------------------------------
def prepare(source: str | Path | dict, overrides: Sequence[str] = (), out: str | None = None) -> Pipeline:
    """Read, override, validate and wire a config; raise ConfigError listing every problem."""
    raw = load_yaml(source) if not isinstance(source, dict) else json.loads(json.dumps(source))
    problems = apply_overrides(raw, list(overrides))
    if out is not None:
        raw["out"] = out
    unset: set[int] = set()
    problems += expand_env(raw, unset)
    config = _top_level(raw, problems)
    specs = stage_specs()
    stages = _check_stages(raw.get("stages"), specs, problems, unset)
    if isinstance(config.model, str) and (Path(config.model).is_dir() or _is_gguf(config.model)):
        stages.insert(0, Stage("import", "import", {}))  # an HF folder or a GGUF file: import it first
    _check_files(config, stages, specs, problems)
    pipeline = Pipeline(config, stages, Path(config.out), raw)
    _wire(pipeline, specs, problems)
    check_stage_options(pipeline.stages, problems)
    _check_out(pipeline, problems)
    if problems:
        raise ConfigError(problems)
    return pipeline


def _top_level(raw: dict, problems: list[str]) -> PipelineConfig:
    """The validated top level; on errors, the valid part (so later checks still run)."""
    try:
        return PipelineConfig.model_validate(raw)
    except ValidationError as exc:
        problems += format_errors(exc, "", list(PipelineConfig.model_fields))
        bad = {str(e["loc"][0]) for e in exc.errors() if e["loc"]}
        good = {k: v for k, v in raw.items() if k in PipelineConfig.model_fields and k not in bad}
        defaults = {k: f.default for k, f in PipelineConfig.model_fields.items() if not f.is_required()}
        return PipelineConfig.model_construct(**{**defaults, "model": None, "stages": [], **good})


def _check_stages(entries, specs, problems: list[str], unset: set[int]) -> list[Stage]:
    if not isinstance(entries, list):
        return []
    stages, seen = [], set()
    for i, entry in enumerate(entries):
        where = f"stages.{i}"
        if not isinstance(entry, dict):
            problems.append(f"{where}: a stage is a mapping with `command:` and the command's options")
            continue
        entry = {str(k).replace("-", "_"): v for k, v in entry.items()}
        command = entry.get("command")
        if (
            not isinstance(command, str) or command not in specs or command == "import"
        ):  # import is implicit: `model:` an HF folder
            known = [c for c in specs if c != "import"]
            problems.append(
                f"{where}.command: "
                f"{'missing' if command is None else f'unknown command {shorten(command)}'}"
                f"{did_you_mean(str(command), known)}"
            )
            continue
        name = str(entry.get("name") or command)
        where = f"stages.{i} ({name})"
        if not STAGE_NAME.fullmatch(name) or len(name) > 100:
            problems.append(
                f"{where}.name: {name!r} must be a plain file name (letters, digits, '_', '-', '.'; no '/' or '..')"
            )
            continue
        if name in seen:
            problems.append(f"{where}: stage name {shorten(name)} is used twice; give one of them `name:`")
        seen.add(name)
        found = len(problems)
        _check_options(entry, specs[command], where, problems)
        if len(problems) == found:  # values of the right types: now as their command reads them
            check_values(command, entry, where, problems)
        # Unknown keys are reported above; wiring goes on without them to find more problems.
        options = {
            k: v for k, v in entry.items() if k in specs[command].options or k in unit.get(command).optional_outputs
        }
        stages.append(Stage(name, command, options, checked=len(problems) == found and i not in unset))
    return stages


def _check_options(entry: dict, spec, where: str, problems: list[str]) -> None:
    declared = unit.get(spec.name)
    refused = declared.refused
    moved = [k for k in declared.moved if k in entry]  # one line for them all: they are one mistake
    if moved:
        stage = declared.moved[moved[0]]
        problems.append(f"{where}.{', '.join(moved)}: moved to the `{stage}` stage (`command: {stage}`); remove it")
    not_settable = set(declared.outputs) | {"force"} | set(refused) | set(moved)  # a stage entry may not set these
    reserved = not_settable | set(declared.optional_outputs)
    taken = sorted(k for k in entry if k in not_settable and k not in moved)
    for key in taken:
        why = refused.get(key, "set by the pipeline (artifacts go to the `out` folder)")
        problems.append(f"{where}.{key}: {why}; remove it")
    model = stage_model(spec, reserved)
    known = [k for k in model.model_fields] + sorted(declared.optional_outputs)
    extra = {k: True for k in declared.optional_outputs if k in entry}
    try:
        model.model_validate({k: v for k, v in entry.items() if k not in taken and k not in moved and k not in extra})
    except ValidationError as exc:
        problems += format_errors(exc, f"{where}.", known)
    for key in extra:
        if not isinstance(entry[key], bool):
            problems.append(f"{where}.{key}: true or false (the pipeline names the file; got {shorten(entry[key])})")


def _is_gguf(model: str) -> bool:
    return model.lower().endswith(".gguf")


def _check_files(config: PipelineConfig, stages: list[Stage], specs, problems: list[str]) -> None:
    from headprune_cli.model.checkpoint import read_info  # noqa: PLC0415 (keeps numpy, torch, transformers out of this module's import)

    if isinstance(config.model, str) and Path(config.model).is_dir():
        if not (Path(config.model) / "config.json").is_file():
            problems.append(
                f"model: {config.model}: a folder without config.json (neither a checkpoint nor a Hugging Face model)"
            )
    elif isinstance(config.model, str) and _is_gguf(config.model):
        if not Path(config.model).is_file():
            problems.append(f"model: {config.model}: no such GGUF file")
    elif isinstance(config.model, str):
        try:
            read_info(config.model)
        except HeadpruneError as exc:
            problems.append(f"model: {exc}")
    for key in ("data", "train_data", "eval_data"):
        value = getattr(config, key)
        if isinstance(value, str):
            _check_input(key, value, problems)
    for i, stage in enumerate(stages):
        spec = specs[stage.command]
        for key, value in stage.options.items():
            option = spec.options.get(key)
            declared = unit.get(stage.command)
            reads = option is not None and (option.is_path or key in declared.inputs)  # a path, or an artifact
            if not reads or not isinstance(value, str) or value == "-" or key in declared.refused:
                continue
            if option.is_folder:
                if not Path(value).exists():
                    problems.append(f"stages.{i} ({stage.name}).{key}: {shorten(value)}: no such file")
                continue
            _check_input(f"stages.{i} ({stage.name}).{key}", value, problems)


def _check_input(where: str, value: str, problems: list[str]) -> None:
    """An input file exists and is a regular file (a model folder may be an export)."""
    from headprune_cli.model.checkpoint import is_export_folder  # noqa: PLC0415 (keeps numpy, torch, transformers out of this module's import)

    path = Path(value)
    if not path.exists():
        problems.append(f"{where}: {shorten(value)}: no such file")
    elif not is_export_folder(path):
        try:
            check_regular(path, "file", HeadpruneError)
        except HeadpruneError as exc:
            problems.append(f"{where}: {exc}")


# --- wiring: which file each option reads and writes ---------------------------------
def _wire(pipeline: Pipeline, specs, problems: list[str]) -> None:
    config, out = pipeline.config, pipeline.out
    roles: dict[str, str] = {"model": str(config.model), "baseline": str(config.model), "source": str(config.model)}
    for key in ("data", "train_data", "eval_data"):
        value = getattr(config, key, None) or getattr(config, "data", None)
        if value is not None:
            roles[key] = str(value)
    for i, stage in enumerate(pipeline.stages):
        wiring, spec = unit.get(stage.command), specs[stage.command]
        values = dict(stage.options)
        for key, candidates in wiring.inputs.items():
            if key in values or key not in spec.options or _unused(stage.command, key, values):
                continue
            found = next((roles[r] for r in candidates if r in roles), None)
            if key == "plan" and set(SELECT_KEYS) & set(values):
                # prune --scores --ratio: select inside prune, from the last scores
                if "scores" in roles and "scores" not in values:
                    values["scores"] = roles["scores"]
            elif found is not None:
                values[key] = found
        if "seed" in spec.options and "seed" not in values and not _unused(stage.command, "seed", values):
            values["seed"] = config.seed
        stem = stage.name if stage.name != stage.command else wiring.stem
        produced = {key: str(out / pattern.format(stem=stem)) for key, pattern in wiring.outputs.items()}
        for key, pattern in wiring.optional_outputs.items():
            if values.pop(key, False) is True:
                produced[key] = str(out / pattern.format(stem=stem))
        needs = wiring.needs + (("data",) if stage.command == "prune" and _compensates(values) else ())
        missing = [k for k in needs if k not in values]
        if (
            stage.command == "prune"
            and "plan" not in values
            and not ("scores" in values and set(SELECT_KEYS) & set(values))
        ):
            missing.append("plan")
        for key in missing:
            problems.append(
                f"stages.{i} ({stage.name}): needs `{key}`, which no earlier stage makes and the config does "
                f"not give{_hint(stage.command, key)}"
            )
        for role, key in wiring.makes.items():
            roles[role] = produced[key]
        values.update(produced)
        if "force" in spec.options:
            values["force"] = True
        stage.outputs = list(produced.values())
        stage.argv = build_argv(stage.command, values, spec)
        stage.params = {spec.options[k].param: v for k, v in values.items()}
        stage.options = {k: v for k, v in values.items() if k not in produced and k != "force"}


def _unused(command: str, key: str, values: dict) -> bool:
    """Inputs a command reads only in some modes: prune reads data only to compensate (given
    data, `prune` compensates with lstsq unless `compensate: none`, as on the command line),
    select a latency table only for a latency target, prune a seed only to select from scores
    (its --seed is a selection option, refused beside a plan)."""
    if key == "latency" and command in ("select", "prune"):
        return not set(LATENCY_KEYS) & set(values)
    if key == "seed" and command == "prune":
        return not set(SELECT_KEYS) & set(values)
    return command == "prune" and key == "data" and values.get("compensate") == "none"


def _compensates(values: dict) -> bool:
    """A prune stage that must have data: it names a compensation. Without `compensate`, it
    takes the pipeline's data when there is some (and compensates by default) and prunes
    without compensation when there is none."""
    return values.get("compensate") not in (None, "none")


def _hint(command: str, key: str) -> str:
    hints = {
        ("select", "scores"): " (add a `score` stage before it, or set `scores:`)",
        ("prune", "plan"): " (add a `select` stage before it, set `plan:`, or give `ratio:` after a `score` stage)",
        ("score", "data"): " (set top-level `data:`)",
        ("prune", "data"): " (compensation needs calibration data: set top-level `data:`)",
        ("finetune", "data"): " (set top-level `train_data:` or `data:`)",
        ("report", "data"): " (set top-level `eval_data:` or `data:`)",
    }
    return hints.get((command, key), "")


def build_argv(command: str, values: dict[str, Any], spec) -> list[str]:
    """The command line that the stage runs: positionals in order, then options."""
    argv = [command] + [str(values[k]) for k in spec.positional if k in values]
    for key, value in values.items():
        option = spec.options[key]
        if option.flag is None or value is None:
            continue
        if option.is_flag:
            if value:
                argv.append(option.flag)
            elif option.negative:
                argv.append(option.negative)
            continue
        for item in value if isinstance(value, list) else [value]:
            argv += [option.flag, _text(item)]
    return argv


def _text(value: Any) -> str:
    return json.dumps(value) if isinstance(value, bool) else str(value)


def _check_out(pipeline: Pipeline, problems: list[str]) -> None:
    """`out` is new, empty or an earlier run's (never a user's folder, even with --force),
    holds no input, and every stage writes its own file inside it."""
    out, config = pipeline.out, pipeline.config
    inputs = [getattr(config, key, None) for key in ("model", "data", "train_data", "eval_data")]
    try:
        check_folder(out, [p for p in inputs if isinstance(p, str)], "out folder")
    except HeadpruneError as exc:
        problems.append(str(exc))
    root, owner = os.path.realpath(out), dict[str, str]()
    for stage in pipeline.stages:
        for path in stage.outputs:
            resolved = os.path.realpath(path)
            if os.path.dirname(resolved) != root or os.path.basename(resolved) in RESERVED:
                problems.append(f"stages ({stage.name}): output {path} is not a file of its own in {out}")
            elif resolved in owner:
                problems.append(
                    f"stages ({stage.name}): writes {path}, as stage {owner[resolved]!r} does; rename one with `name:`"
                )
            owner.setdefault(resolved, stage.name)
