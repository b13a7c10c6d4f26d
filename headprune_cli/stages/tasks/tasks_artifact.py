"""The `tasks` artifact (headprune tasks): per task what its own plan keeps, what every
task or only one task keeps, pairwise similarity, and the shared plan."""

from __future__ import annotations

from typing import Any, Literal

from headprune_cli.artifacts.schema import Envelope


class TasksArtifact(Envelope):
    kind: Literal["tasks"]
    base: dict[str, str]  # sha256 and how it was found: base | root | itself
    budget: dict[str, Any]  # the one Budget every plan meets: kind and value
    tasks: list[dict[str, Any]]  # per task: objective, its own plan's kept units, the shared plan's effect
    heads: dict[str, Any]  # kept by every task, and kept by only one ("L:H" original indices)
    ffn: dict[str, Any]  # the same for FFN neurons, per layer
    pairs: list[dict[str, Any]]  # Spearman of the scores and Jaccard of the kept sets, per pair of tasks
    shared: dict[str, Any]  # the rule, what the shared plan keeps, its cost
    files: dict[str, str]  # the scores and plans written beside the artifact
