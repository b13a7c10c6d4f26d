"""`headprune tasks` (the stage: stages/tasks/stage.py)."""

from __future__ import annotations

from headprune_cli.cli.command import from_options
from headprune_cli.cli.common import context
from headprune_cli.stages.tasks import stage


@from_options(stage.TasksOptions)
def tasks(opts: stage.TasksOptions):
    """Prune several tasks fine-tuned from one base under one budget, and compare them.

    Every task's model must name the same pre-trained base (provenance base, or root); others are refused. Each task is scored (or its --task ...,scores=S.json read) and cut as `select` would cut it. The folder gets every task's plan, a shared plan for serving all tasks from one pruned backbone (the mean of the tasks' normalised importance, cut under the same budget), and tasks.json / tasks.md / tasks.png: the heads and FFN neurons every task keeps, those only one keeps, Spearman correlation of importance and Jaccard overlap of the kept sets.

    Examples:

      headprune tasks --task name=sections,model=sections.safetensors,data=sections-calib.jsonl --task name=kinds,model=kinds.safetensors,data=kinds-calib.jsonl --task name=fidelity,model=minilm.safetensors,data=text.txt,objective=fidelity --target-flops 0.6 -o tasks/

      headprune prune --plan tasks/plan-shared-sections.json --compensate lstsq --data sections-calib.jsonl -o sections-small.safetensors
    """  # noqa: E501 - the --help text, byte for byte: rich keeps its line breaks, so a paragraph is one line
    return stage.run(opts, context())
