"""The `search` stage: checkpoint + calibration data -> a plan found by measured loss (stages/search.py).

The calibration data is split in two: the first part scores the heads (and layers) for
the greedy start and gives the compensation its statistics (refit.py), the held-out rest
judges every candidate, after that compensation, so every judgement is out of sample, as
the evaluation data will be. Evaluation data is never seen. The output is the same plan
artifact `select` writes, with the search's record (judged.py, local.py).
"""

from __future__ import annotations

from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from headprune_cli.artifacts.schema import input_ref, write_artifact
from headprune_cli.errors import DataError, UsageError
from headprune_cli.files.outputs import check_output
from headprune_cli.runtime.device import check as check_device
from headprune_cli.runtime.device import place
from headprune_cli.stages.budget import Budget, block_params
from headprune_cli.stages.options import (
    BatchSize,
    BudgetOptions,
    ConstraintOptions,
    DeviceOptions,
    Samples,
    Seconds,
    SeedOptions,
    TokenOptions,
)
from headprune_cli.stages.score.importance import score_model
from headprune_cli.stages.score.importance.registry import (
    DEFAULT_LAYER_METHOD,
    HEAD_METHODS,
    LAYER_METHOD_HELP,
    METHOD_DEFAULT_HELP,
    ChosenMethod,
    check_ffn,
    head_method,
    layer_method,
)
from headprune_cli.stages.score.table import ScoreTable
from headprune_cli.stages.search.judged import JUDGES
from headprune_cli.stages.search.layer_rescore import check_reachable
from headprune_cli.stages.search.local import search
from headprune_cli.stages.select.plan import plan_artifact
from headprune_cli.stages.select.strategies import select
from headprune_cli.stages.unit import Context, Result, Stage, option

DEFAULT_EVALUATIONS = 100  # about a minute on all-MiniLM-L6-v2 with 64 held-out texts (BENCHMARKS.md)
MAX_EVALUATIONS = 100_000
MIN_PART = 2  # examples each part of the split needs at least
COMPENSATIONS = ("none", "bias", "lstsq")  # prune/compensation.py METHODS (not imported: it brings torch)
# Search always has data, and the cut that ships from it is `prune --compensate lstsq` (README,
# BENCHMARKS.md section 15: lstsq adds 13-23 points to greedy plans), so candidates are judged
# after lstsq unless told otherwise.
DEFAULT_COMPENSATION = "lstsq"
DEFAULT_RIDGE = 0.1  # prune/compensation.py DEFAULT_RIDGE (a test keeps the two equal)


class SearchOptions(ChosenMethod, BudgetOptions, SeedOptions, TokenOptions, DeviceOptions, ConstraintOptions):
    checkpoint: Path = option(..., "A headprune checkpoint.", argument=True)
    data: Path = option(
        ...,
        "Calibration data: one part scores the greedy start, the held-out rest judges every candidate.",
        "--data",
        "-d",
    )
    evaluations: int | None = option(
        None,
        f"Candidates judged at most, the start included (default {DEFAULT_EVALUATIONS} unless --seconds is given).",
        ge=1,
        le=MAX_EVALUATIONS,
    )
    seconds: Seconds | None = option(
        None,
        "Stop searching after this many seconds (with --evaluations: whichever comes first); "
        "a time budget is not byte-deterministic.",
    )
    compensation: str = option(
        DEFAULT_COMPENSATION,
        "Judge every candidate after this compensation, as `prune --compensate` will cut it: none | bias | lstsq.",
        "--compensate",
    )
    ridge: float = option(DEFAULT_RIDGE, "lstsq: the ridge `prune --ridge` will use.", ge=0.0)
    judge: str | None = option(
        None,
        "metric: held-out accuracy, loss as the tie-breaker (classification only); loss: the mean held-out "
        "loss (default: metric for classification, else loss).",
    )
    holdout: float = option(0.5, "Fraction of --data held out to judge candidates.", ge=0.05, le=0.95)
    method: str | None = option(
        None,
        f"Importance method of the greedy start: {', '.join(HEAD_METHODS)}. {METHOD_DEFAULT_HELP}",
        "--method",
        "-m",
    )
    layers: bool = option(False, "Score layers too, so that a FLOPs/params budget may drop layers.")
    rescore_layers: bool = option(
        False,
        "Start from layers chosen one at a time by measured loss (each drop measured with the ones before it dropped, "
        "the rest of the budget filled by head scores), instead of from single-pass layer scores; "
        "needs --target-flops/--target-params.",
    )
    ffn: bool = option(
        False,
        "Score FFN neurons too, so that a FLOPs/params budget searches FFN widths as "
        "well (--method fisher, the default, or taylor).",
    )
    layer_method: str | None = option(None, LAYER_METHOD_HELP)
    objective: str | None = option(None, "classification, causal-lm or fidelity (default: from the model's task).")
    samples: Samples = None
    batch_size: BatchSize = 32
    output: Path | None = option(None, "Plan JSON to write (default: stdout).", "-o", "--output")
    force: bool = option(False, "Overwrite OUTPUT if it exists.")

    def given_budget(self) -> Budget:
        """The one budget given: a search needs one (check() refuses none)."""
        budget = self.budget()
        if budget is None:
            raise UsageError("give exactly one of --ratio, --target-params, --target-flops, --target-block-params")
        return budget

    def evaluation_limit(self) -> int:
        if self.evaluations is not None:
            return self.evaluations
        return MAX_EVALUATIONS if self.seconds is not None else DEFAULT_EVALUATIONS

    def check(self) -> None:
        if self.compensation not in COMPENSATIONS:
            raise UsageError(f"--compensate must be one of {', '.join(COMPENSATIONS)} (got {self.compensation!r})")
        if self.judge is not None and self.judge not in JUDGES:
            raise UsageError(f"--judge must be one of {', '.join(JUDGES)} (got {self.judge!r})")
        self.given_budget()
        if self.layer_method is not None and not self.layers:
            raise UsageError("--layer-method needs --layers (it names how whole layers are scored)")
        if self.rescore_layers and self.ratio is not None:
            raise UsageError(
                "--rescore-layers needs --target-flops or --target-params: --ratio counts heads, "
                "which dropping a layer does not change"
            )
        if self.rescore_layers and self.layers:
            raise UsageError("--rescore-layers measures the layers itself; leave out --layers")
        if self.rescore_layers and self.ffn:
            # the fill would weigh head and neuron scores against each other with no common scale
            raise UsageError(
                "--rescore-layers fills the budget with heads only; with --ffn use --layers --layer-method loo or refit"
            )
        if self.uniform:
            raise UsageError(
                "search does not take --uniform: one head count for every layer leaves nothing per layer "
                "to search; use select --uniform"
            )
        if self.runtime in ("transformers", "vllm"):
            raise UsageError(
                f"search does not take --runtime {self.runtime}: that engine loads one head count for every "
                f"layer, which leaves nothing per layer to search; use select --runtime {self.runtime}"
            )
        _check_method(self)


def run(opts: SearchOptions, ctx: Context) -> Result:
    from headprune_cli.data.readers import position_limit, read_data  # noqa: PLC0415 (keeps torch, transformers out of this module's import)
    from headprune_cli.model.checkpoint import load  # noqa: PLC0415 (keeps numpy, torch, transformers out of this module's import)
    from headprune_cli.stages.objectives import check_objective, needs_labels  # noqa: PLC0415 (keeps torch, transformers out of this module's import)

    if opts.output is not None:
        check_output(opts.output, opts.force, [opts.checkpoint, opts.data])
    opts.check()
    check_device(opts.device, opts.dtype)
    model = load(opts.checkpoint)
    place(model, opts.device, opts.dtype)
    objective = check_objective(opts.objective, model)
    judge = _judge_by(opts, objective)
    max_length = min(opts.max_length, position_limit(model) or opts.max_length)
    dataset = read_data(
        opts.data,
        model,
        max_length=max_length,
        samples=opts.samples,
        seed=opts.seed,
        need_labels=needs_labels(objective),
    )
    scoring, held_out = _split(dataset, opts.holdout, opts.data)
    if opts.rescore_layers or (not opts.layers and not opts.ffn):
        _check_reachable(model, opts, max_length)
    table = _score(model, scoring, objective, opts, max_length)
    result = _search(model, table, scoring, held_out, objective, judge, opts, ctx)
    plan = _plan(model, opts, result, max_length, judge)
    write_artifact(plan, opts.output)
    ctx.print(
        f"search ({result.evaluations} candidates judged after --compensate {opts.compensation}, "
        f"{result.improvements} improvements, {result.restarts} restarts, stopped: {result.stopped}): held-out "
        f"{result.start.describe()} ({_start_name(result)}) -> {result.best.describe()}; "
        f"removes {sum(len(v) for v in result.selection.remove_heads.values())} heads, "
        f"{sum(len(v) for v in result.selection.remove_ffn.values())} FFN neurons, "
        f"{len(result.selection.remove_layers)} layers",
        highlight=False,
    )
    return Result([str(opts.output)] if opts.output is not None else [], value=plan)


def _judged_name(judge: str, result) -> str:
    """What the search ranked by: accuracy (loss breaking ties) or loss."""
    return "accuracy" if judge == "metric" and len(result.best.key) > 1 else "loss"


def _start_name(result) -> str:
    if result.rescored_layers is None:
        return "greedy"
    return (
        f"layers rescored: dropped {result.rescored_layers}"
        if result.rescored_layers
        else "layers rescored: none dropped"
    )


def _judge_by(opts: SearchOptions, objective: str) -> str:
    """metric (accuracy) where the objective has class labels, loss otherwise."""
    if opts.judge is None:
        return "metric" if objective == "classification" else "loss"
    if opts.judge == "metric" and objective != "classification":
        raise UsageError(
            f"--judge metric needs class labels (a classification objective); {objective} is judged by its loss: "
            "--judge loss"
        )
    return opts.judge


def _check_method(opts: SearchOptions) -> None:

    head_method(opts.chosen_method())
    if opts.ffn:
        check_ffn(opts.chosen_method())
    if opts.layer_method is not None:
        layer_method(opts.layer_method)


def _split(dataset, holdout: float, path: Path):
    """(scoring part, held-out part): the held-out part is the last rows."""
    held = round(len(dataset) * holdout)
    if held < MIN_PART or len(dataset) - held < MIN_PART:
        raise DataError(
            f"{path}: {len(dataset)} examples are too few to split for search (each part needs at least "
            f"{MIN_PART}; --holdout {holdout:g})"
        )
    cut = len(dataset) - held
    return dataset.select(0, cut), dataset.select(cut, len(dataset))


def _check_reachable(model, opts: SearchOptions, max_length: int) -> None:
    """Refuse a budget the constraints cannot reach before any scoring: heads alone (with
    --rescore-layers, heads and layers), priced by the cost table, whatever their scores
    (with --layers or --ffn, the units that may reach it are only known once scored)."""
    from headprune_cli.model.cost import cost_table  # noqa: PLC0415 (keeps torch, transformers out of this module's import)
    from headprune_cli.model.layout import info_of  # noqa: PLC0415 (keeps torch, transformers out of this module's import)

    layout = info_of(model).layout
    flat = ScoreTable(
        {layer: {h: 0.0 for h in heads} for layer, heads in zip(layout.layers, layout.heads)},
        list(layout.num_heads),
        list(layout.num_kv_heads),
        cost=cost_table(model, max_length),
    )
    if opts.rescore_layers:
        check_reachable(flat, opts.given_budget(), opts.constraints())
        return
    select(flat, None, budget=opts.given_budget(), constraints=opts.constraints())


def _score(model, scoring, objective: str, opts: SearchOptions, max_length: int):

    layers = (opts.layer_method or DEFAULT_LAYER_METHOD) if opts.layers else None
    return score_model(
        model,
        scoring,
        opts.chosen_method(),
        objective,
        batch_size=opts.batch_size,
        seed=opts.seed,
        layers=layers,
        seq_len=max_length,
        ffn=opts.ffn,
        normalize=not opts.ffn,
    )


def _search(model, table, scoring, held_out, objective: str, by: str, opts: SearchOptions, ctx: Context):

    from headprune_cli.stages.search.judged import HeldOutJudge  # noqa: PLC0415 (keeps torch, transformers out of this module's import)
    from headprune_cli.stages.search.masked_loss import MaskedLoss  # noqa: PLC0415 (keeps torch, transformers out of this module's import)

    refit = _refit(model, scoring, opts) if opts.compensation != "none" else None
    loss = HeldOutJudge(MaskedLoss(model, held_out, objective, opts.batch_size), by, refit)
    bar = Progress(
        TextColumn("search"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[best]}"),
        TimeElapsedColumn(),
        console=ctx.console,
        transient=True,
        disable=not ctx.progress,
    )
    with bar:
        task = bar.add_task("search", total=opts.evaluation_limit(), best="")
        return search(
            table,
            loss,
            budget=opts.given_budget(),
            constraints=opts.constraints(),
            evaluations=opts.evaluation_limit(),
            seconds=opts.seconds,
            seed=opts.seed,
            rescore_layers=opts.rescore_layers,
            on_evaluation=lambda n, best: bar.update(task, completed=n, best=f"best {best.describe()}"),
        )


def _refit(model, scoring, opts: SearchOptions):
    """The compensation's statistics, collected once over the scoring rows (refit.py)."""
    from headprune_cli.data.readers import batches  # noqa: PLC0415 (keeps torch, transformers out of this module's import)
    from headprune_cli.stages.search.refit import Refit  # noqa: PLC0415 (keeps torch, transformers out of this module's import)

    cuts_ffn = opts.ffn and opts.given_budget().is_cost  # --ratio searches heads only
    return Refit(model, list(batches(scoring, opts.batch_size)), opts.compensation, opts.ridge, ffn=cuts_ffn)


def _plan(model, opts: SearchOptions, result, max_length: int, judge: str) -> dict:
    from headprune_cli.model.layout import info_of  # noqa: PLC0415 (keeps torch, transformers out of this module's import)

    info = info_of(model)
    inputs = [input_ref("model", opts.checkpoint, info.source_sha), input_ref("data", opts.data)]
    config = {
        "strategy": "search",
        "ratio": opts.ratio,
        "target_params": opts.target_params,
        "target_flops": opts.target_flops,
        **block_params(opts.target_block_params),
        "method": opts.chosen_method(),
        "layers": opts.layers,
        "layer_method": opts.layer_method,
        "evaluations": opts.evaluation_limit(),
        **({"seconds": opts.seconds} if opts.seconds is not None else {}),
        "compensation": opts.compensation,
        **({"ridge": opts.ridge} if opts.compensation == "lstsq" else {}),
        "judge": judge,
        **({"rescore_layers": True} if opts.rescore_layers else {}),
        "holdout": opts.holdout,
        "samples": opts.samples,
        "max_length": max_length,
        "seed": opts.seed,
        **({"ffn": True} if opts.ffn else {}),
        **opts.constraints().to_dict(ffn=opts.ffn),
    }
    num_ffn = list(info.layout.num_ffn) if opts.ffn else None
    return plan_artifact(
        result.selection,
        opts.constraints(),
        inputs,
        list(info.layout.num_heads),
        config,
        num_ffn=num_ffn,
        search={**result.summary(), "compensation": opts.compensation, "judge": _judged_name(judge, result)},
    )


# `headprune search --help`: the command's text (cli/ builds the command from STAGE).
HELP = """Find a plan by measured quality: start from the greedy plan, try per-layer head counts (and layer drops) on held-out calibration data.

    Each candidate is judged as `prune --compensate` will ship it (--compensate lstsq by
    default: the refit solved from statistics collected once), by held-out accuracy for a
    classifier (loss breaking ties) or by loss (--judge loss); at a local optimum the search
    restarts from a random perturbation of the best plan until --evaluations (or --seconds)
    is spent. Every candidate respects the same constraints as `select` (--min-heads, --multiple-of,
    --protect, whole KV groups) and the same budget (--ratio of heads, or a
    --target-flops/--target-params budget, where layers may be dropped too with
    --layers). The result is a plan for `headprune prune --plan`.

    Examples:

      headprune search model.safetensors --data calib.jsonl --ratio 0.7 -o plan.json

      headprune search model.safetensors --data calib.jsonl --target-flops 0.5 --layers --layer-method loo --evaluations 200 -o plan.json

      headprune search m.safetensors --data calib.jsonl --ratio 0.85 --method fisher --compensate lstsq --evaluations 200 -o plan.json && headprune prune --plan plan.json --compensate lstsq --data calib.jsonl -o small.safetensors

      headprune search m.safetensors --data calib.jsonl --ratio 0.5 --seconds 60 --compensate none | headprune prune -o small.safetensors
    """  # noqa: E501 - the --help text, byte for byte: rich keeps its line breaks, so a paragraph is one line

STAGE = Stage(
    "search",
    SearchOptions,
    run,
    stem="plan",
    inputs={"checkpoint": ("model",), "data": ("data",)},
    outputs={"output": "{stem}.json"},
    makes={"plan": "output"},
    needs=("checkpoint", "data"),
    help=HELP,
)
