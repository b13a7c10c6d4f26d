"""One task of `headprune tasks`: a name, a model, its data and objective (or its scores).

Spelled on the command line and in YAML as one string of KEY=VALUE pairs separated by
commas, `name=sections,model=a.safetensors,data=calib.jsonl[,objective=fidelity][,scores=s.json]`,
so `--task` repeats like any other list option and the pipeline passes it through unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from headprune_cli.errors import UsageError, shorten
from headprune_cli.names import did_you_mean

KEYS = ("name", "model", "data", "objective", "scores")
REQUIRED = ("name",)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # a task's name becomes part of file names


@dataclass(frozen=True)
class TaskSpec:
    name: str
    model: Path
    data: Path | None = None  # scoring data; not needed when `scores` are given
    objective: str | None = None  # default: from the model's task
    scores: Path | None = None  # a scores artifact of this model, instead of scoring here


def parse_task(text: str, base: Path | None = None) -> TaskSpec:
    """One --task; without model= the task's model is `base` (the label-free task on the base)."""
    where = f"--task {shorten(text)}"  # a value quoted in an error is cut to 80 characters
    fields: dict[str, str] = {}
    for part in str(text).split(","):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or not value.strip():
            raise UsageError(f"{where}: expected KEY=VALUE pairs separated by commas (keys: {', '.join(KEYS)})")
        if key not in KEYS:
            raise UsageError(f"{where}: unknown key {key!r}{did_you_mean(key, KEYS)}")
        if key in fields:
            raise UsageError(f"{where}: {key} is given twice")
        fields[key] = value.strip()
    missing = [k for k in REQUIRED if k not in fields]
    if missing:
        raise UsageError(f"{where}: needs {' and '.join(missing)}")
    if "model" not in fields and base is None:
        raise UsageError(f"{where}: needs model= (or give --base: a task without model= is on the base)")
    if not NAME.fullmatch(fields["name"]):
        raise UsageError(f"{where}: a name is letters, digits, '.', '_' or '-' (it names the task's files)")
    if "data" not in fields and "scores" not in fields:
        raise UsageError(f"{where}: needs data= (to score on) or scores= (a scores artifact of the model)")
    return TaskSpec(
        name=fields["name"],
        model=Path(fields["model"]) if "model" in fields else Path(str(base)),
        data=Path(fields["data"]) if "data" in fields else None,
        objective=fields.get("objective"),
        scores=Path(fields["scores"]) if "scores" in fields else None,
    )


def parse_tasks(texts: list[str] | None, base: Path | None = None) -> list[TaskSpec]:
    """At least two tasks, each named once."""
    tasks = [parse_task(t, base) for t in texts or []]
    if len(tasks) < 2:
        raise UsageError("give at least two --task (a cross-task comparison needs two tasks)")
    names = [t.name for t in tasks]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(f"--task: the name {twice[0]!r} is given twice")
    return tasks


def input_paths(tasks: list[TaskSpec]) -> list[Path]:
    """Every file the tasks read (what no output may be)."""
    return [p for t in tasks for p in (t.model, t.data, t.scores) if p is not None]


def spelled(tasks: list[TaskSpec]) -> list[str]:
    """The tasks as resolved (the base filled in), for the artifact's config."""
    out = []
    for t in tasks:
        parts = [
            ("name", t.name),
            ("model", t.model),
            ("data", t.data),
            ("objective", t.objective),
            ("scores", t.scores),
        ]
        out.append(",".join(f"{k}={v}" for k, v in parts if v is not None))
    return out
