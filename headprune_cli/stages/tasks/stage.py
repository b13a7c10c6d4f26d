"""The `tasks` stage: several tasks fine-tuned from one base -> per-task plans, a shared
plan, and the cross-task view (tasks.json, tasks.md, tasks.png) in one folder.

Each task is scored (or its scores read), cut under the same budget as `select` would cut
it, and compared: which heads and FFN neurons every task keeps and which only one keeps,
Spearman correlation of the tasks' importance and Jaccard overlap of their kept sets. The
shared plan serves every task from one pruned backbone: the mean of the tasks' normalised
importance, cut under the same budget, written once per task as that model's plan.
"""

from __future__ import annotations

from pathlib import Path

from headprune_cli.artifacts.schema import envelope, input_ref, model_of, write_artifact
from headprune_cli.errors import UsageError
from headprune_cli.files.outputs import check_folder, check_output
from headprune_cli.files.staged import stage_folder
from headprune_cli.stages.budget import block_params
from headprune_cli.stages.options import BatchSize, DeviceOptions, Samples, TokenOptions
from headprune_cli.stages.score.importance.registry import check_ffn, head_method
from headprune_cli.stages.select.choosing import SelectionOptions
from headprune_cli.stages.tasks.spec import TaskSpec, input_paths, parse_tasks, spelled
from headprune_cli.stages.unit import Context, Result, Stage, option

TASK_HELP = (
    "A task: name=NAME,model=CKPT,data=DATA[,objective=OBJECTIVE][,scores=SCORES_JSON] "
    "(repeat: two or more, every model fine-tuned from the same base)."
)


# The artifact's `config`: every option but the files and the device, in the order tasks.json
# has always recorded them (so that its bytes stay), then the tasks as resolved.
CONFIG_KEYS = (
    "min_heads",
    "multiple_of",
    "protect",
    "gqa_unit",
    "uniform",
    "min_ffn",
    "ffn_multiple_of",
    "runtime",
    "gguf_type",
    "ratio",
    "strategy",
    "seed",
    "drop_layers",
    "layer_threshold",
    "threshold",
    "target_params",
    "target_flops",
    "latency",
    "target_latency",
    "target_ms",
    "latency_phase",
    "method",
    "ffn",
    "samples",
    "batch_size",
    "max_length",
)
NOT_RECORDED = ("task", "base", "output", "force", "device", "dtype")
# Recorded only when set, so artifacts made with the other budgets keep their bytes.
RECORDED_WHEN_GIVEN = ("target_block_params",)


class TasksOptions(SelectionOptions, TokenOptions, DeviceOptions):
    task: list[str] | None = option(None, TASK_HELP, "--task")
    base: Path | None = option(
        None,
        "The pre-trained base: every task's model must come from it; a task without model= is the base itself "
        "(the label-free fidelity task). `headprune run` passes its `model:` here.",
    )
    method: str = option("fisher", "Importance method for the tasks scored here (score --method).", "--method", "-m")
    ffn: bool = option(True, "Score FFN neurons too, and cut them under the budget.", negative="--no-ffn")
    samples: Samples = None
    batch_size: BatchSize = 32
    output: Path = option(
        ..., "Folder for tasks.json, tasks.md, tasks.png, and every task's scores and plans.", "-o", "--output"
    )
    force: bool = option(False, "Replace an earlier run's files in OUTPUT.")

    def check(self) -> None:
        super().check()
        file_names(parse_tasks(self.task, self.base))
        if self.budget() is None:
            raise UsageError(
                "give the one budget every plan meets: "
                "--target-flops, --target-params, --target-block-params or --ratio"
            )
        head_method(self.method)
        if self.ffn:
            check_ffn(self.method)


def file_names(tasks: list[TaskSpec]) -> dict[str, str]:
    """Every file the stage writes, by role, relative to the output folder."""
    names = {"artifact": "tasks.json", "markdown": "tasks.md", "png": "tasks.png"}
    for t in tasks:
        if t.scores is None:
            names[f"scores:{t.name}"] = f"scores-{t.name}.json"
        names[f"plan:{t.name}"] = f"plan-{t.name}.json"
        names[f"shared-plan:{t.name}"] = f"plan-shared-{t.name}.json"
    _refuse_collisions(names)
    return names


def _refuse_collisions(names: dict[str, str]) -> None:
    """Two roles may not share a file (tasks `b` and `shared-b` would both write plan-shared-b.json),
    nor two names differing only in case (one file on a case-insensitive file system)."""
    seen: dict[str, str] = {}
    for role, name in names.items():
        other = seen.setdefault(name.casefold(), role)
        if other != role:
            tasks = sorted({r.split(":", 1)[1] for r in (role, other) if ":" in r})
            who = " and ".join(repr(t) for t in tasks) if len(tasks) == 2 else f"task {tasks[0]!r}"
            raise UsageError(f"--task: {who} would both write {name} in the output folder; rename one of them")


def _outputs(folder: Path, force: bool, tasks: list[TaskSpec], base: Path | None) -> dict[str, Path]:
    inputs = [*input_paths(tasks), *([base] if base is not None else [])]
    check_folder(folder, inputs, "-o folder", force)
    paths = {role: folder / name for role, name in file_names(tasks).items()}
    if folder.is_dir():
        for path in paths.values():
            check_output(path, force, inputs)
    return paths


def run(opts: TasksOptions, ctx: Context) -> Result:
    from headprune_cli.runtime.device import check as check_device  # noqa: PLC0415 (keeps torch out of `tasks --help`)
    from headprune_cli.stages.tasks.base import check_shared_base  # noqa: PLC0415 (keeps torch out of `tasks --help`)
    from headprune_cli.stages.tasks.payload import build  # noqa: PLC0415 (keeps numpy out of `tasks --help`)
    from headprune_cli.stages.tasks.plans import all_plans  # noqa: PLC0415 (keeps numpy out of `tasks --help`)
    from headprune_cli.stages.tasks.scoring import task_scores  # noqa: PLC0415 (keeps torch out of `tasks --help`)

    opts.check()
    tasks = parse_tasks(opts.task, opts.base)
    budget = opts.budget()
    assert budget is not None  # check() refuses a missing budget
    check_device(opts.device, opts.dtype)
    paths = _outputs(opts.output, opts.force, tasks, opts.base)
    base = check_shared_base(tasks, opts.base)  # before any model is built or any data read
    # Scores given as artifacts are read and checked first: a wrong one is refused before
    # any task is scored (and no line but the refusal reaches stderr).
    given = {t.name: task_scores(t, opts, "") for t in tasks if t.scores is not None}
    scored = [given.get(t.name) or task_scores(t, opts, str(paths[f"scores:{t.name}"])) for t in tasks]
    plans = all_plans(scored, opts, budget)
    payload = build(scored, plans, base, budget, file_names(tasks))
    artifact = {**envelope("tasks", _input_refs(scored), _config(opts)), **payload}
    model_of("tasks").model_validate(artifact)  # never write what cannot be read back
    _write(opts.output, paths, scored, plans, artifact)
    ctx.print(_summary(artifact), highlight=False)
    return Result([str(opts.output)], value=artifact)


def _input_refs(scored) -> list[dict]:
    refs = []
    for s in scored:
        refs.append(input_ref(f"model:{s.spec.name}", s.spec.model))
        if s.spec.scores is not None:
            refs.append(input_ref(f"scores:{s.spec.name}", s.spec.scores, s.sha256))
        else:
            refs.append(input_ref(f"data:{s.spec.name}", s.spec.data))
    return refs


def _config(opts: TasksOptions) -> dict:
    resolved = spelled(parse_tasks(opts.task, opts.base))
    dumped = opts.model_dump()
    return {k: dumped[k] for k in CONFIG_KEYS} | block_params(opts.target_block_params) | {"tasks": resolved}


def _write(folder: Path, paths: dict[str, Path], scored, plans, artifact: dict) -> None:
    from headprune_cli.files.io import atomic_write_bytes  # noqa: PLC0415 (only when writing)
    from headprune_cli.stages.tasks import render  # noqa: PLC0415 (matplotlib only when writing)

    def write(built: Path) -> None:
        at = {role: built / path.name for role, path in paths.items()}
        for s in scored:
            if s.text is not None:
                atomic_write_bytes(at[f"scores:{s.spec.name}"], s.text.encode())
            write_artifact(plans[s.spec.name].own, at[f"plan:{s.spec.name}"])
            write_artifact(plans[s.spec.name].shared, at[f"shared-plan:{s.spec.name}"])
        write_artifact(artifact, at["artifact"])
        atomic_write_bytes(at["markdown"], render.markdown(artifact).encode())
        render.png(artifact, at["png"])

    # Every file is written into a temporary folder beside OUTPUT, which then becomes OUTPUT:
    # a run that fails on any file (the plot, a full disk) leaves no folder and no part of one.
    stage_folder(folder, write)


def _summary(art: dict) -> str:
    parts = [f"{t['name']} {t['own']['heads_kept']} heads" for t in art["tasks"]]
    every = art["heads"]["every_count"]
    return f"kept: {', '.join(parts)}; every task keeps {every} heads; shared plan {art['shared']['heads_kept']} heads"


# `headprune tasks --help`: the command's text (cli/ builds the command from STAGE).
HELP = """Prune several tasks fine-tuned from one base under one budget, and compare them.

    Every task's model must name the same pre-trained base (provenance base, or root); others are refused. Each task is scored (or its --task ...,scores=S.json read) and cut as `select` would cut it. The folder gets every task's plan, a shared plan for serving all tasks from one pruned backbone (the mean of the tasks' normalised importance, cut under the same budget), and tasks.json / tasks.md / tasks.png: the heads and FFN neurons every task keeps, those only one keeps, Spearman correlation of importance and Jaccard overlap of the kept sets.

    Examples:

      headprune tasks --task name=sections,model=sections.safetensors,data=sections-calib.jsonl --task name=kinds,model=kinds.safetensors,data=kinds-calib.jsonl --task name=fidelity,model=minilm.safetensors,data=text.txt,objective=fidelity --target-flops 0.6 -o tasks/

      headprune prune --plan tasks/plan-shared-sections.json --compensate lstsq --data sections-calib.jsonl -o sections-small.safetensors
    """  # noqa: E501 - the --help text, byte for byte: rich keeps its line breaks, so a paragraph is one line

STAGE = Stage(
    "tasks",
    TasksOptions,
    run,
    stem="tasks",
    inputs={"base": ("model",)},
    outputs={"output": "{stem}"},
    makes={"tasks": "output"},
    help=HELP,
)
