"""The `iterate` stage: gradual pruning with recovery between rounds (rounds.py)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.table import Table

from headprune_cli.errors import UsageError
from headprune_cli.files.outputs import check_output
from headprune_cli.names import did_you_mean
from headprune_cli.stages.budget import KINDS, OPTION_FIELDS, Budget
from headprune_cli.stages.iterate.schedule import DEFAULT_SCHEDULE, check_schedule, schedule_of
from headprune_cli.stages.options import BatchSize, LearningRate, RecoveryOptions, Schedule, SeedOptions, TokenOptions
from headprune_cli.stages.score.importance.registry import METHOD_DEFAULT_HELP, ChosenMethod, check_ffn
from headprune_cli.stages.unit import Context, Result, Stage, comma_list, option

# The cost budgets a schedule can step through, by option field (their kinds are budget.py's).
COST_TARGETS = {name: kind for name, kind in OPTION_FIELDS.items() if kind in ("flops", "params", "block_params")}

RECOVERIES = ("finetune", "lstsq")  # rounds.RECOVERIES, without importing torch here
LSTSQ_SAMPLES = 256  # as `prune --samples`


class IterateOptions(ChosenMethod, SeedOptions, TokenOptions):
    checkpoint: Path = option(..., "The model to prune (usually unpruned).", argument=True)
    data: Path = option(..., "Training data for recovery (and scoring unless --score-data).")
    eval_data: Path = option(..., "Dev set that decides the quality floor.")
    output: Path = option(..., "Where to write the last model above the floor.", "-o", "--output")
    schedule: Schedule | None = option(
        None,
        f"Fractions of the ORIGINAL heads removed after each round (default {','.join(map(str, DEFAULT_SCHEDULE))}).",
    )
    target_flops: Schedule | None = option(
        None,
        "Instead of --schedule: fractions of the ORIGINAL FLOPs per token to keep after each round, "
        "falling (e.g. 0.9,0.8,0.7); each round cuts under that budget.",
    )
    target_params: Schedule | None = option(
        None, "Instead of --schedule: fractions of the ORIGINAL parameters to keep after each round, falling."
    )
    target_block_params: Schedule | None = option(
        None,
        "Instead of --schedule: fractions of the ORIGINAL parameters inside the transformer blocks (embeddings "
        "and heads not counted) to keep after each round, falling.",
    )
    ffn: bool = option(
        False,
        "Also score FFN neurons every round and cut them with the heads under "
        "the --target-flops/--target-params budget.",
    )
    method: str | None = option(None, f"Scoring method used every round. {METHOD_DEFAULT_HELP}")
    score_data: Path | None = option(None, "Data for scoring (default: --data).")
    floor: float | None = option(None, "Stop before the dev metric crosses this value.")
    max_drop: float | None = option(
        None,
        "Stop before the dev metric is this much worse than the input's: points for accuracy/F1/fidelity (1.0 "
        "= one percentage point, as in `report`), or perplexity.",
        ge=0,
    )
    recover: str = option(
        "finetune",
        "finetune: train between rounds (on --data); lstsq: no training, refit the cut model in closed "
        "form on the first --samples rows of --data, rescoring the refit model every round.",
    )
    samples: int = option(LSTSQ_SAMPLES, "lstsq: calibration examples to read from --data.", ge=1)
    ridge: float | None = option(None, "lstsq: ridge strength, as `prune --ridge` (default: prune's).", ge=0.0)
    epochs: int = option(1, "Recovery epochs per round.", ge=1)
    lr: LearningRate | None = option(None, "Recovery learning rate (default by model size).")
    batch_size: BatchSize = 16
    teacher: str | None = option(None, "Distil from a checkpoint, or `self` = the input model.")
    kd_weight: float | None = option(None, "Distillation weight (default 0.5 with a teacher).")
    force: bool = option(False, "Overwrite OUT if it exists.")

    def check(self) -> None:
        self.schedule_budgets()
        self.check_recovery()

    def check_recovery(self) -> None:
        """Training options mean nothing to lstsq recovery: refused rather than ignored."""
        if self.recover not in RECOVERIES:
            raise UsageError(f"unknown --recover {self.recover!r}{did_you_mean(self.recover, RECOVERIES)}")
        training = {"--teacher": self.teacher, "--lr": self.lr, "--kd-weight": self.kd_weight}
        given = [flag for flag, value in training.items() if value is not None]
        given += ["--epochs"] if self.epochs != 1 else []
        if self.recover == "lstsq" and given:
            raise UsageError(f"{', '.join(given)}: training options, but --recover lstsq trains nothing")
        calibration = ["--samples"] if self.samples != LSTSQ_SAMPLES else []
        calibration += ["--ridge"] if self.ridge is not None else []
        if self.recover != "lstsq" and calibration:
            raise UsageError(f"{', '.join(calibration)}: calibration options, for --recover lstsq only")

    def schedule_budgets(self) -> list[Budget]:
        """The schedule: head fractions removed, or FLOPs or params fractions kept."""
        given = {kind: getattr(self, name) for name, kind in COST_TARGETS.items()}
        targets = [(kind, values) for kind, values in given.items() if values is not None]
        if len(targets) > 1:
            raise UsageError(f"give one of {', '.join(KINDS[kind][0] for kind in COST_TARGETS.values())}")
        if targets and self.schedule is not None:
            raise UsageError(
                "give --schedule (head fractions) or --target-flops/--target-params (cost fractions), not both"
            )
        if self.ffn and not targets:
            raise UsageError(
                "--ffn needs --target-flops or --target-params: a head fraction says nothing about FFN neurons"
            )
        if self.ffn:
            check_ffn(self.chosen_method())
        default = list(DEFAULT_SCHEDULE)
        budget, values = targets[0] if targets else (None, default if self.schedule is None else self.schedule)
        return schedule_of(values, budget or "heads")


def run(opts: IterateOptions, ctx: Context) -> Result:

    from headprune_cli.data.readers import read_data  # noqa: PLC0415 (keeps torch, transformers out of this module's import)
    from headprune_cli.model.checkpoint import load, save  # noqa: PLC0415 (keeps numpy, torch, transformers out of this module's import)
    from headprune_cli.model.layout import info_of  # noqa: PLC0415 (keeps torch, transformers out of this module's import)
    from headprune_cli.stages.iterate.rounds import iterative_prune  # noqa: PLC0415 (keeps numpy, safetensors, torch, transformers out of this module's import)
    from headprune_cli.stages.objectives import check_objective, needs_labels  # noqa: PLC0415 (keeps torch, transformers out of this module's import)
    from headprune_cli.stages.training.distill import load_teacher, resolve_teacher  # noqa: PLC0415 (keeps numpy, torch, transformers out of this module's import)

    schedule = opts.schedule_budgets()
    opts.check_recovery()
    budget = None if schedule[0].kind == "heads" else schedule[0].kind.replace("_", " ")
    check_output(opts.output, opts.force, [opts.checkpoint, opts.data, opts.eval_data, opts.score_data, opts.teacher])
    # lstsq rounds give the input model's pages back once it is scored (rounds.py)
    model = load(opts.checkpoint, per_tensor=opts.recover == "lstsq")
    objective = check_objective(None, model)
    teacher = copy.deepcopy(model) if opts.teacher == "self" else None  # the unpruned start; no second load
    if opts.teacher not in (None, "self"):
        path = resolve_teacher(opts.teacher, opts.checkpoint)
        assert path is not None  # a teacher that is named resolves to a file (or is refused)
        teacher = load_teacher(path, model)
    train = read_data(opts.data, model, max_length=opts.max_length, seed=opts.seed)
    dev = read_data(opts.eval_data, model, max_length=opts.max_length)
    calib = (
        read_data(opts.score_data, model, max_length=opts.max_length, need_labels=needs_labels(objective))
        if opts.score_data
        else None
    )
    # Each round's recovery reads the options iterate shares with finetune's by name (epochs,
    # lr, batch size, distillation weight, seed); the rest keep recovery's defaults.
    cfg = RecoveryOptions(**opts.model_dump(include=set(RecoveryOptions.model_fields)))
    with _rounds_folder(opts) as work:
        # Handed over, not kept: lstsq recovery lets the input model go once it is scored.
        held = [model]
        del model
        result = iterative_prune(
            held.pop(),
            train,
            dev,
            schedule=schedule,
            method=opts.chosen_method(),
            score_data=calib,
            objective=objective,
            floor=opts.floor,
            max_drop=opts.max_drop,
            finetune_config=cfg,
            teacher=teacher,
            seed=opts.seed,
            on_round=lambda r: ctx.print(_line(r, budget)),
            ffn=opts.ffn,
            seq_len=opts.max_length,
            recover=opts.recover,
            compensation=_compensation(opts, train),
            source=opts.checkpoint if work else None,
            work=work,
        )
        ctx.print(_table(result, budget))
        save(result.model, opts.output, overwrite=opts.force)
    layout = info_of(result.model).layout
    neurons = f", {sum(len(layout.kept_neurons(l)) for l in layout.layers)} FFN neurons" if opts.ffn else ""
    ctx.print(f"wrote {opts.output} ({sum(len(h) for h in layout.heads)} heads{neurons})")
    return Result([str(opts.output)], value=result)


@contextmanager
def _rounds_folder(opts: IterateOptions) -> Iterator[Path | None]:
    """lstsq recovery's rounds, each refit written beside the output in a locked temporary
    folder (removed afterwards, or by the next headprune if this one is killed)."""
    if opts.recover != "lstsq":
        yield None
        return
    from headprune_cli.files.temps import temp_folder  # noqa: PLC0415 (keeps the lstsq route's imports to it)

    with temp_folder(opts.output) as work:
        yield work


def _compensation(opts: IterateOptions, train):
    """lstsq recovery's calibration: the first --samples rows of --data, as `prune --data` reads them."""
    if opts.recover != "lstsq":
        return None
    from headprune_cli.data.readers import batches  # noqa: PLC0415 (keeps torch out of this module's import)
    from headprune_cli.stages.prune.compensation import DEFAULT_RIDGE  # noqa: PLC0415 (keeps torch out of this module's import)
    from headprune_cli.stages.prune.cut import Compensation  # noqa: PLC0415 (keeps torch out of this module's import)

    rows = train.select(0, min(opts.samples, len(train)))
    ridge = DEFAULT_RIDGE if opts.ridge is None else opts.ridge
    return Compensation("lstsq", list(batches(rows, 16)), ridge)


def _step(r, budget) -> str:
    return f"{r.ratio:.0%}" if budget is None else f"{budget} {r.ratio:.0%}"


def _line(r, budget=None) -> str:
    verdict = "kept" if r.accepted else "below the floor: stop"
    size = f"{r.heads_kept} heads" + (f", {r.neurons_kept} FFN neurons" if r.remove_ffn else "")
    cost = "" if r.cost_kept is None else f" ({r.cost_kept:.1%} of the {budget})"
    return (
        f"round {_step(r, budget)}: {size}{cost}, {r.metric_pruned:.4f} pruned -> "
        f"{r.metric_recovered:.4f} recovered ({verdict})"
    )


def _table(result, budget=None):

    table = Table(title=f"iterative pruning ({result.metric_name}; baseline {result.baseline:.4f})")
    first = "removed (of original)" if budget is None else f"{budget} kept (target)"
    for column in (first, "heads", "FFN neurons", "pruned", "recovered", "accepted"):
        table.add_column(column, justify="right")
    for r in result.rounds:
        table.add_row(
            _step(r, budget),
            str(r.heads_kept),
            str(r.neurons_kept),
            f"{r.metric_pruned:.4f}",
            f"{r.metric_recovered:.4f}",
            "yes" if r.accepted else "no",
        )
    return table


def _schedule(kind: str) -> Callable[[Any], None]:
    key = "schedule" if kind == "heads" else f"target_{kind}"
    return lambda value: check_schedule(comma_list(value, float, key), kind)


# `headprune iterate --help`: the command's text (cli/ builds the command from STAGE).
HELP = """Prune gradually: each round rescores the current model, removes heads up to the next fraction of the original heads (or, with --target-flops/--target-params/--target-block-params, heads and with --ffn FFN neurons down to the next fraction of the original cost), and recovers; stops before the dev metric crosses the floor and writes the last model above it.

    Examples:

      headprune iterate model.safetensors --data train.jsonl --eval-data dev.jsonl --max-drop 1.0 -o small.safetensors

      headprune iterate model.safetensors --data train.jsonl --eval-data dev.jsonl --schedule 0.2,0.4,0.6 --teacher self -o small.safetensors

      headprune iterate model.safetensors --data train.jsonl --eval-data dev.jsonl --method fisher --ffn --target-flops 0.8,0.65,0.5 -o small.safetensors

      headprune iterate lm.safetensors --data calib.txt --eval-data dev.txt --ffn --target-block-params 0.9,0.8 --recover lstsq -o small.safetensors
    """  # noqa: E501 - the --help text, byte for byte: rich keeps its line breaks, so a paragraph is one line

STAGE = Stage(
    "iterate",
    IterateOptions,
    run,
    stem="iterated",
    # rescore -> prune -> recover per step of a schedule of ratios
    inputs={"checkpoint": ("model",), "data": ("train_data",), "eval_data": ("eval_data",), "score_data": ("data",)},
    outputs={"output": "{stem}.safetensors"},
    makes={"model": "output"},
    needs=("checkpoint", "data", "eval_data"),
    checks={"schedule": _schedule("heads"), **{name: _schedule(kind) for name, kind in COST_TARGETS.items()}},
    help=HELP,
)
