"""Whether tasks share one pre-trained base, read from their checkpoints' provenance.

A checkpoint's base is, in order: the pre-trained model it was fine-tuned from (provenance
`base`, recorded by whoever fine-tuned it and carried down every pruning chain), else the
root of its pruning chain (provenance `root`), else the checkpoint itself (an unpruned
pre-trained model is its own base). Tasks whose bases differ are refused: importance
compared across two unrelated models says nothing about serving one backbone.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from headprune_cli.errors import CheckpointError
from headprune_cli.model.checkpoint import read_info, weights_sha
from headprune_cli.model.layout import Layout, ModelInfo
from headprune_cli.stages.tasks.spec import TaskSpec


@dataclass(frozen=True)
class Base:
    sha256: str
    how: str  # "base" (recorded), "root" (pruning chain) or "itself"


def base_of(path, info: ModelInfo | None = None) -> Base:
    """`info`: the checkpoint's, when already read."""
    provenance = (info or read_info(path)).provenance
    for key in ("base", "root"):
        if isinstance(provenance.get(key), str) and provenance[key]:
            return Base(provenance[key], key)
    return Base(weights_sha(path), "itself")


def check_shared_base(tasks: list[TaskSpec], base: Path | None = None) -> Base:
    """The one base every task's model names (the `base` checkpoint's, when given), and one
    layout; else a one-line refusal."""
    infos = {t.name: read_info(t.model) for t in tasks}  # headers only, read once
    bases = {t.name: base_of(t.model, infos[t.name]) for t in tasks}
    first = tasks[0]
    if base is not None:
        expected = base_of(base)
        for task in tasks:
            if bases[task.name].sha256 != expected.sha256:
                raise CheckpointError(
                    f"task {task.name} does not come from the base {base}: {task.model} comes from "
                    f"{_named(bases[task.name])}, the base is {_named(expected)}"
                )
    for task in tasks[1:]:
        if bases[task.name].sha256 != bases[first.name].sha256:
            raise CheckpointError(
                f"tasks {first.name} and {task.name} do not share a base: {first.model} comes from "
                f"{_named(bases[first.name])}, {task.model} from {_named(bases[task.name])} "
                "(fine-tune every task model from the same pre-trained checkpoint)"
            )
    _check_layouts(tasks, {name: info.layout for name, info in infos.items()})
    return bases[first.name]


def _named(base: Base) -> str:
    what = {"base": "base", "root": "root model", "itself": "itself (no recorded base)"}[base.how]
    return f"{what} {base.sha256[:12]}"


def _check_layouts(tasks: list[TaskSpec], layouts: dict[str, Layout]) -> None:
    """The same kept heads and FFN neurons: one plan must mean the same units in every task."""
    first = tasks[0]
    for task in tasks[1:]:
        a, b = layouts[first.name], layouts[task.name]
        if (a.num_heads, a.layers, a.heads, a.ffn) != (b.num_heads, b.layers, b.heads, b.ffn):
            raise CheckpointError(
                f"tasks {first.name} and {task.name} share a base but not a layout (one of them is pruned); "
                "compare models cut the same way, or their unpruned parents"
            )
