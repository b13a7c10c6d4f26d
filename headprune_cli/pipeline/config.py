"""The `headprune run` config: its structure, and every stage checked against its command.

A config names a model, data and a list of stages. A stage's keys, apart from `command`
and `name`, are exactly the long options of that `headprune` command (`--min-heads` is
`min_heads` or `min-heads`), so the YAML accepts what the command line accepts and
nothing else. The option table is read from each stage's options model (the same model
the command line is made from), so a new option needs no change here. All problems are
collected before any work starts.
"""

from __future__ import annotations

import enum
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, ValidationError, create_model

from headprune_cli.errors import UsageError, shorten
from headprune_cli.files.io import check_regular
from headprune_cli.names import did_you_mean
from headprune_cli.pipeline.yamlsafe import MAX_CONFIG_BYTES, UnsafeYaml, safe_load
from headprune_cli.stages.unit import all_stages, public_fields, text_form

# Pipeline-level defaults live here and nowhere else.
DEFAULT_OUT = "out/run"
CONTROL_KEYS = ("command", "name")


class ConfigError(UsageError):
    """Every problem found in a config; str() gives one line per problem."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


class PipelineConfig(BaseModel):
    """The top level of a run config. Paths are relative to the current directory."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="The checkpoint the pipeline starts from (the report's baseline).")
    data: str | None = Field(None, description="Default --data: scoring, calibration, compensation.")
    train_data: str | None = Field(None, description="finetune's --data (default: data).")
    eval_data: str | None = Field(None, description="report's --data, finetune/sweep --eval-data (default: data).")
    out: str = Field(DEFAULT_OUT, description="Folder for every artifact, resolved.yaml and run-state.json.")
    seed: StrictInt = Field(0, description="Passed as --seed to every stage that has one, unless the stage sets it.")
    stages: list[dict[str, Any]] = Field(min_length=1, description="The stages, run in order.")


# --- the option table of a stage, read from its options model ---------------------------
@dataclass
class OptionSpec:
    key: str  # YAML key: the long option without dashes, '-' -> '_'
    param: str  # the options model's field name
    flag: str | None  # '--min-heads'; None for a positional argument
    annotation: Any
    is_flag: bool = False
    negative: str | None = None  # '--no-normalize' when the flag has one
    multiple: bool = False
    minimum: float | None = None
    maximum: float | None = None
    is_path: bool = False
    is_folder: bool = False  # a path that names a folder the stage creates, not a file it reads


@dataclass
class CommandSpec:
    name: str
    options: dict[str, OptionSpec] = field(default_factory=dict)
    positional: list[str] = field(default_factory=list)  # keys of arguments, in order

    def by_param(self, param: str) -> OptionSpec | None:
        return next((o for o in self.options.values() if o.param == param), None)


def stage_specs() -> dict[str, CommandSpec]:
    """Every stage's options, keyed by stage name, read from its options model."""

    return {name: _command_spec(name, stage.options) for name, stage in all_stages().items()}


def _command_spec(name: str, options) -> CommandSpec:
    spec = CommandSpec(name)
    for param, info in public_fields(options).items():
        extra = info.json_schema_extra or {}
        flags = list(extra.get("flags") or ["--" + param.replace("_", "-")])
        longs = [f for f in flags if f.startswith("--")]
        flag = None if extra.get("argument") else (longs or flags)[0]
        key = (flag.lstrip("-") if flag else param).replace("-", "_")
        low = next((m.ge for m in info.metadata if hasattr(m, "ge")), None)
        high = next((m.le for m in info.metadata if hasattr(m, "le")), None)
        annotation = text_form(info)[0]
        base = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
        spec.options[key] = OptionSpec(
            key=key,
            param=param,
            flag=flag,
            annotation=annotation,
            is_flag=flag is not None and base == [bool],
            negative=extra.get("negative"),
            multiple=any(typing.get_origin(a) in (list, tuple) for a in base),
            minimum=low,
            maximum=high,
            is_path=_is_path(info.annotation),
            is_folder=bool(extra.get("folder")),
        )
        if flag is None:
            spec.positional.append(key)
    return spec


def _is_path(annotation) -> bool:
    return annotation is Path or Path in typing.get_args(annotation)


def _field_type(option: OptionSpec):
    """The pydantic type that a YAML value of this option must have."""
    base = option.annotation
    args = [a for a in typing.get_args(base) if a is not type(None)]
    if typing.get_origin(base) in (typing.Union, types.UnionType) and len(args) == 1:
        base = args[0]
    if typing.get_origin(base) in (list, tuple):
        inner = (typing.get_args(base) or (str,))[0]
        return _list_of(_scalar(inner)) | _scalar(inner)
    if option.multiple:
        return _list_of(_scalar(base)) | _scalar(base)
    return _scalar(base)


def _list_of(item: Any) -> Any:
    """list[item] for an item type known only at run time (what `list[item]` builds, spelled so a
    type checker does not read it as a static type)."""
    return types.GenericAlias(list, (item,))


def _scalar(base):
    if base is bool:
        return StrictBool
    if base is int:
        return StrictInt
    if base is float:
        return StrictFloat | StrictInt
    if base is Path or base is str:
        return str | StrictInt | StrictFloat  # YAML reads 0.1,0.2 or 25% as numbers/strings
    if isinstance(base, type) and issubclass(base, enum.Enum):
        return Literal[tuple(e.value for e in base)]
    return Any


def stage_model(spec: CommandSpec, reserved: set[str]) -> type[BaseModel]:
    """A pydantic model of one stage: the command's options (all optional), nothing else."""
    fields: dict[str, Any] = {"command": (str, ...), "name": (str | None, None)}
    for key, option in spec.options.items():
        if key in reserved:
            continue
        bounds: dict[str, Any] = {k: v for k, v in (("ge", option.minimum), ("le", option.maximum)) if v is not None}
        fields[key] = (_field_type(option) | None, Field(None, **bounds))
    # NaN passes every bound (nan < 1 and nan > 0 are both false); no option means it.
    return create_model(f"Stage_{spec.name}", __config__=ConfigDict(extra="forbid", allow_inf_nan=False), **fields)


def format_errors(exc: ValidationError, where: str, known: list[str]) -> list[str]:
    """One line per pydantic error, with 'did you mean' for unknown keys."""
    lines, seen = [], set()
    for err in exc.errors():
        if err["loc"][:1] in seen and err["type"] != "extra_forbidden":
            continue  # a union type fails once per member (float, int): one line per key
        seen.add(err["loc"][:1])
        loc = ".".join(str(p) for p in err["loc"] if not _is_type_tag(p))
        if err["type"] == "extra_forbidden":
            key = str(err["loc"][-1])
            lines.append(f"{where}{loc}: unknown key{did_you_mean(key, known)}")
        elif err["type"] == "missing":
            lines.append(f"{where}{loc}: required")
        else:
            lines.append(f"{where}{loc}: {err['msg']} (got {shorten(err.get('input'))})")
    return lines


def _is_type_tag(part) -> bool:
    """pydantic names the union member that failed ('float', 'int', 'list[str]'): not a key."""
    return isinstance(part, str) and (
        part in ("float", "int", "str", "bool") or "[" in part or part.startswith("literal")
    )


# --- reading the file, environment variables and --set ---------------------------------
PATH_KEYS = ("model", "data", "train_data", "eval_data", "out")


ENV_VAR = re.compile(r"\$\{(\w+)\}")  # only the braced form: a file may be named `a$b.json`


def expand_env(data: dict, unset: set[int] | None = None) -> list[str]:
    """`${VAR}` in top-level paths and in stage options, so a config can name a model
    installed elsewhere; an unset variable is a problem found before any stage runs. The
    stages that use one are added to `unset`: their options are not checked further, since
    every later refusal would only repeat this one in other words."""
    problems: list[str] = []
    for key in PATH_KEYS:
        if key in data:
            data[key] = _expand(key, data[key], problems)
    stages = data.get("stages")
    for i, stage in enumerate(stages if isinstance(stages, list) else []):
        for key, value in stage.items() if isinstance(stage, dict) else ():
            found = len(problems)
            stage[key] = _expand(f"stages.{i}.{key}", value, problems)
            if len(problems) > found:
                stage[key] = None  # reported once here, not again as a bad value
                if unset is not None:
                    unset.add(i)
    return problems


def _expand(where: str, value: Any, problems: list[str]) -> Any:
    if isinstance(value, list):
        return [_expand(where, item, problems) for item in value]
    if not isinstance(value, str):
        return value
    unset = [v for v in ENV_VAR.findall(value) if v not in os.environ]
    if unset:
        problems.append(f"{where}: environment variable {unset[0]} is not set (used in {shorten(value)})")
        return value
    return ENV_VAR.sub(lambda m: os.environ[m.group(1)], value)


# --- --set overrides -----------------------------------------------------------------
def load_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{path}: no such config file")
    try:
        check_regular(path, "config file", UsageError)
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise UnsafeYaml(f"{path.stat().st_size} bytes; a config is at most {MAX_CONFIG_BYTES}")
        data = safe_load(path.read_text(encoding="utf-8"))
    except UnsafeYaml as exc:
        raise UsageError(f"{path}: refused: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise UsageError(f"{path}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not a text file") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: a config must be a YAML mapping (model:, data:, stages: ...)")
    return data


def apply_overrides(data: dict, overrides: list[str]) -> list[str]:
    """`--set a.b=value`: value read as YAML; stages addressed by index or name."""
    problems = []
    for item in overrides:
        path, sep, text = item.partition("=")
        if not sep or not path:
            problems.append(f"--set {shorten(item)}: expected KEY.PATH=VALUE")
            continue
        try:
            value = safe_load(text) if text else ""
        except UnsafeYaml as exc:
            problems.append(f"--set {shorten(item)}: {exc}")
            continue
        except yaml.YAMLError:
            value = text
        problem = _set_path(data, path.split("."), value)
        if problem:
            problems.append(f"--set {shorten(item)}: {problem}")
    return problems


def _set_path(node: Any, keys: list[str], value: Any) -> str | None:
    for i, key in enumerate(keys):
        last = i == len(keys) - 1
        if isinstance(node, list):
            index = _stage_index(node, key)
            if index is None:
                names = [str(s.get("name") or s.get("command")) for s in node if isinstance(s, dict)]
                return f"no stage {key!r} (stages: {', '.join(names)}; or use an index 0..{len(node) - 1})"
            if last:
                node[index] = value
                return None
            node = node[index]
        elif isinstance(node, dict):
            if last:
                node[key] = value
                return None
            node = node.setdefault(key, {})
        else:
            return f"{'.'.join(keys[:i])} is not a mapping or a list"
    return None


def _stage_index(stages: list, key: str) -> int | None:
    if key.isdigit():
        return int(key) if int(key) < len(stages) else None
    matches = [i for i, s in enumerate(stages) if isinstance(s, dict) and (s.get("name") or s.get("command")) == key]
    return matches[0] if len(matches) == 1 else None
