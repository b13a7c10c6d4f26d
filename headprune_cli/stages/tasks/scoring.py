"""Each task's scores: computed here (as `headprune score` would) or read from its artifact."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from headprune_cli.artifacts.schema import Scores, dumps, read_artifact
from headprune_cli.files.io import sha256_bytes
from headprune_cli.stages.select.plan import check_model
from headprune_cli.stages.tasks.spec import TaskSpec

if TYPE_CHECKING:
    from headprune_cli.stages.tasks.stage import TasksOptions


@dataclass
class TaskScores:
    spec: TaskSpec
    artifact: Scores
    sha256: str
    text: str | None  # the JSON to write beside the plans, when scored here
    path: str  # where the scores are (or will be) on disk


def task_scores(spec: TaskSpec, settings: TasksOptions, out_path: str) -> TaskScores:
    if spec.scores is not None:
        artifact, sha = read_artifact(spec.scores, ("scores",))
        assert isinstance(artifact, Scores)  # read_artifact gives the kind asked for
        check_model(artifact, spec.model)  # the scores must be of this task's model
        return TaskScores(spec, artifact, sha, None, str(spec.scores))
    data = score_here(spec, settings)
    text = dumps(data)
    return TaskScores(spec, Scores.model_validate(data), sha256_bytes(text.encode()), text, out_path)


def score_here(spec: TaskSpec, s: TasksOptions) -> dict:
    """The scores artifact of one task, with the options `headprune score` would take (the
    stage's own: method, ffn, samples, batch size, max length, seed, device, dtype)."""
    from headprune_cli.data.readers import position_limit, read_data  # noqa: PLC0415 (keeps torch, transformers out of this module's import)
    from headprune_cli.model.checkpoint import load  # noqa: PLC0415 (keeps numpy, torch, transformers out of this module's import)
    from headprune_cli.runtime.device import place  # noqa: PLC0415 (keeps torch out of this module's import)
    from headprune_cli.stages.objectives import check_objective, needs_labels  # noqa: PLC0415 (keeps torch, transformers out of this module's import)
    from headprune_cli.stages.score.importance import score_model, scores_artifact  # noqa: PLC0415 (keeps torch out of this module's import)

    assert spec.data is not None  # parse_task: a task without scores= has data=
    model = load(spec.model)
    place(model, s.device, s.dtype)
    objective = check_objective(spec.objective, model)
    max_length = min(s.max_length, position_limit(model) or s.max_length)
    dataset = read_data(
        spec.data, model, max_length=max_length, samples=s.samples, seed=s.seed, need_labels=needs_labels(objective)
    )
    result = score_model(model, dataset, s.method, objective, batch_size=s.batch_size, seed=s.seed, ffn=s.ffn)
    return scores_artifact(
        model,
        result,
        model_path=spec.model,
        data_path=spec.data,
        max_length=max_length,
        extra_config={"samples": s.samples},
    )
