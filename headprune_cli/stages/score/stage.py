"""The `score` stage: checkpoint + data -> scores JSON (importance of every head, and layer)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from headprune_cli.artifacts.schema import write_artifact
from headprune_cli.errors import UsageError
from headprune_cli.files.outputs import check_output
from headprune_cli.runtime.device import check as check_device
from headprune_cli.runtime.device import dtype_name, place
from headprune_cli.stages.options import BatchSize, DeviceOptions, RecomputeOptions, Samples, SeedOptions, TokenOptions
from headprune_cli.stages.score.importance import init_distributed, score_model, scores_artifact, world
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
from headprune_cli.stages.unit import Context, Result, Stage, option


class ScoreOptions(ChosenMethod, SeedOptions, TokenOptions, RecomputeOptions, DeviceOptions):
    checkpoint: Path = option(..., "A headprune checkpoint.", argument=True)
    data: Path = option(
        ..., "JSONL/CSV (text[, text_pair][, label]), plain text, or a tokenized .safetensors set.", "--data", "-d"
    )
    method: str | None = option(
        None, f"Importance method: {', '.join(HEAD_METHODS)}. {METHOD_DEFAULT_HELP}", "--method", "-m"
    )
    objective: str | None = option(None, "classification, causal-lm or fidelity (default: from the model's task).")
    samples: Samples = None
    batch_size: BatchSize = 32
    layers: bool = option(False, "Also score whole layers.")
    ffn: bool = option(
        False,
        "Also score every FFN neuron (gradient, taylor, taylor-weight, fisher, activation, flap, wanda-sp, minitron, "
        "llm-pruner, obs, random), "
        "in the same pass: `select --target-*` then cuts heads, neurons and layers under one budget.",
    )
    layer_method: str | None = option(None, LAYER_METHOD_HELP)
    weights: list[str] | None = option(None, "For combined: METHOD=WEIGHT[,METHOD=WEIGHT] (default taylor=1,loo=1).")
    normalize: bool = option(True, "gradient: divide each layer's scores by their L2 norm.", negative="--no-normalize")
    obs_norm: str | None = option(
        None,
        "obs: how layers' refit errors compare: relative (default: each token's error relative to the layer's "
        "output, as the refit weighs it), output (times the layer's output energy) or residual (relative to the "
        "residual stream).",
    )
    obs_score: str | None = option(
        None,
        "obs: a unit's score is the layer's error after its removal (cumulative, default) or the error its step "
        "added (marginal).",
    )
    obs_damp: float | None = option(None, "obs: damping of the input Gram, times its mean diagonal (default 0.1).")
    output: Path | None = option(None, "Write the scores JSON here (default: stdout).", "--output", "-o")
    force: bool = option(False, "Overwrite an existing output file.")

    def check(self) -> None:
        """Refusals that need neither the model nor the data."""
        entry = head_method(self.chosen_method())
        if self.weights and "weights" not in entry.options:
            raise UsageError("--weights only applies to --method combined")
        given = sorted(key for key, value in self.method_options().items() if key not in entry.options)
        if given:
            raise UsageError(f"--{given[0].replace('_', '-')} only applies to --method obs")
        if self.ffn:
            check_ffn(self.chosen_method())
        if self.layer_method is not None:
            if not self.layers:
                raise UsageError("--layer-method needs --layers (it names how whole layers are scored)")
            layer_method(self.layer_method)

    def method_options(self) -> dict[str, Any]:
        """The method's own options given on the command line (the method's defaults fill the rest)."""
        given = {"obs_norm": self.obs_norm, "obs_score": self.obs_score, "obs_damp": self.obs_damp}
        return {key: value for key, value in given.items() if value is not None}

    def chosen_layer_method(self) -> str | None:
        return (self.layer_method or DEFAULT_LAYER_METHOD) if self.layers else None


def run(opts: ScoreOptions, ctx: Context) -> Result:
    from headprune_cli.data.readers import position_limit, read_data  # noqa: PLC0415 (keeps torch, transformers out of this module's import)
    from headprune_cli.model.checkpoint import load  # noqa: PLC0415 (keeps numpy, torch, transformers out of this module's import)
    from headprune_cli.stages.objectives import check_objective, needs_labels  # noqa: PLC0415 (keeps torch, transformers out of this module's import)
    from headprune_cli.stages.score.importance.baselines import parse_weights  # noqa: PLC0415 (keeps torch, transformers out of this module's import)

    if opts.output is not None and str(opts.output) != "-":
        check_output(opts.output, opts.force, [opts.checkpoint, opts.data])
    opts.check()  # an unknown name or a stray option is answered before any model or data is read
    check_device(opts.device, opts.dtype)
    weights = parse_weights(opts.weights, list(HEAD_METHODS))
    init_distributed()
    rank, _ = world()
    model = load(opts.checkpoint)
    place(model, opts.device, opts.dtype)
    objective = check_objective(opts.objective, model)
    max_length = min(opts.max_length, position_limit(model) or opts.max_length)  # the demo model has 64 positions
    dataset = read_data(
        opts.data,
        model,
        max_length=max_length,
        samples=opts.samples,
        seed=opts.seed,
        need_labels=needs_labels(objective),
    )
    with _progress(ctx, rank == 0) as progress:
        result = score_model(
            model,
            dataset,
            opts.chosen_method(),
            objective,
            batch_size=opts.batch_size,
            seed=opts.seed,
            normalize=opts.normalize,
            weights=weights,
            layers=opts.chosen_layer_method(),
            progress=progress,
            ffn=opts.ffn,
            recompute=opts.recompute,
            method_options=opts.method_options(),
        )
    if rank == 0:
        dtype = dtype_name(opts.dtype)
        extra = {"samples": opts.samples, **({"dtype": dtype} if dtype != "auto" else {})}
        artifact = scores_artifact(
            model, result, model_path=opts.checkpoint, data_path=opts.data, max_length=max_length, extra_config=extra
        )
        write_artifact(artifact, opts.output)
    from headprune_cli.runtime.distributed import finish  # noqa: PLC0415 (keeps torch out of this module's import)

    finish()
    return Result([str(opts.output)] if opts.output is not None else [], value=result)


@contextmanager
def _progress(ctx: Context, show: bool):
    """A rich progress bar on stderr; scorers open one task per pass over the data."""

    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=ctx.console,
        transient=True,
        disable=not (show and ctx.progress),
    )

    def factory(description: str, total: int):
        task = bar.add_task(description, total=total)
        return lambda: bar.advance(task)

    with bar:
        yield factory


def _method(value: Any) -> None:
    from headprune_cli.stages.score.importance.api import make_scorer  # noqa: PLC0415 (keeps torch, transformers out of this module's import)

    make_scorer(str(value))


def _weights(value: Any) -> None:
    from headprune_cli.stages.score.importance.baselines import parse_weights  # noqa: PLC0415 (keeps torch, transformers out of this module's import)

    parse_weights([str(v) for v in value] if isinstance(value, list) else [str(value)], list(HEAD_METHODS))


# `headprune score --help`: the command's text (cli/ builds the command from STAGE).
HELP = """Score the importance of every attention head (and, with --layers, every layer; with --ffn, every FFN neuron).

    Runs unchanged under `torchrun --nproc-per-node N -m headprune_cli score ...`: each
    process scores a shard of the batches, sums are all-reduced, rank 0 writes.
    Scores are summed in float64 whatever --dtype the model computes in.

    Examples:

      headprune score model.safetensors --data dev.jsonl --method taylor -o scores.json

      headprune score lm.safetensors --data wiki.txt --method loo --layers --samples 256

      headprune score emb.safetensors --data sentences.txt --method combined --weights taylor=1,entropy=0.5

    --method obs scores what `prune --data` (the lstsq refit) cannot repair: per layer, the
    heads (KV groups) and FFN neurons in the order structured OBS removes them, each scored by
    the layer's refit error once it is gone; meant for cuts made with `prune --data`:

      headprune score lm.safetensors --data calib.txt --method obs --ffn -o scores.json
    """

STAGE = Stage(
    "score",
    ScoreOptions,
    run,
    stem="scores",
    inputs={"checkpoint": ("model",), "data": ("data",)},
    outputs={"output": "{stem}.json"},
    makes={"scores": "output"},
    needs=("checkpoint", "data"),
    checks={"method": _method, "weights": _weights},
    help=HELP,
)
