"""The `prune` stage: a checkpoint cut by a plan (or by scores selected in place).

With compensation the model is built and cut by prune/cut.py's `cut`, the function every
stage cuts with; without, it is never built: the checkpoint is sliced tensor by tensor
(model/streaming.py), which gives the same file.
"""

from __future__ import annotations

from pathlib import Path

from headprune_cli.artifacts.schema import dumps, parse_artifact, read_text
from headprune_cli.data.readers import batches, read_data
from headprune_cli.errors import UsageError
from headprune_cli.files.io import sha256_bytes
from headprune_cli.files.outputs import check_output
from headprune_cli.names import did_you_mean
from headprune_cli.runtime.device import check as check_device
from headprune_cli.stages.options import BatchSize, DeviceOptions, TokenOptions
from headprune_cli.stages.prune.compensation import DEFAULT_RIDGE
from headprune_cli.stages.prune.compensation import METHODS as COMPENSATIONS
from headprune_cli.stages.prune.cut import Compensation, refit, write_refit_cut
from headprune_cli.stages.select.chains import Selection
from headprune_cli.stages.select.choosing import SELECTION_CHECKS, SelectionOptions, plan_from_scores
from headprune_cli.stages.select.plan import check_model, find_model, selection_of
from headprune_cli.stages.unit import Context, Result, Stage, option


class PruneOptions(SelectionOptions, TokenOptions, DeviceOptions):
    checkpoint: Path | None = option(
        None, "Checkpoint to prune (default: the model the plan/scores name).", argument=True
    )
    output: Path = option(..., "Pruned checkpoint to write (.safetensors).", "-o", "--output")
    plan: str | None = option(None, "Plan JSON from `headprune select` ('-': stdin).")
    scores: str | None = option(None, "Scores JSON; select in place with --ratio etc.")
    compensation: str | None = option(
        None,
        "none | bias | lstsq (bias and lstsq need --data). Default: lstsq when --data is given, else none.",
        "--compensate",
    )
    data: Path | None = option(None, "Calibration data for compensation (a few hundred examples).")
    samples: int = option(256, "Calibration examples to read from --data.", ge=1)
    batch_size: BatchSize = 16
    ridge: float = option(
        DEFAULT_RIDGE,
        "lstsq: strength of the pull towards the current weights, relative to the mean input energy.",
        ge=0.0,
    )
    force: bool = option(False, "Overwrite OUTPUT if it exists.")

    def check(self) -> None:
        _check(self)
        super().check()

    def chosen_compensation(self) -> str:
        """What the user asked for; unasked, the refit whenever calibration data is given: it
        beat no compensation in most of the measured cuts (BENCHMARKS.md §14 and §26)."""
        if self.compensation is not None:
            return self.compensation
        return "lstsq" if self.data is not None else "none"


def run(opts: PruneOptions, ctx: Context) -> Result:

    opts.check()
    check_device(opts.device, opts.dtype)
    given = [p for p in (opts.checkpoint, opts.plan, opts.scores, opts.data, opts.latency) if p is not None]
    check_output(opts.output, opts.force, inputs=given)
    artifact, source, text = _read_input(opts.plan, opts.scores)
    plan, plan_sha = _plan(opts, artifact, source, text)
    path = find_model(artifact, source, opts.checkpoint)
    check_output(opts.output, opts.force, inputs=[path])
    selection = selection_of(plan)
    if opts.chosen_compensation() == "none":
        digest = _streamed(artifact, path, opts.output, selection, plan_sha)
    else:
        digest = _compensated(artifact, path, opts, selection, plan_sha, ctx)
    heads = sum(len(v) for v in selection.remove_heads.values())
    neurons = sum(len(v) for v in selection.remove_ffn.values())
    ffn = f", {neurons} FFN neurons" if neurons else ""
    ctx.print(
        f"wrote {opts.output}: removed {heads} heads{ffn}, {len(selection.remove_layers)} layers (sha256 {digest[:12]})"
    )
    return Result([str(opts.output)])


def _check(opts: PruneOptions) -> None:
    compensation = opts.chosen_compensation()
    if compensation not in COMPENSATIONS:
        raise UsageError(f"unknown compensation {compensation!r}{did_you_mean(compensation, COMPENSATIONS)}")
    if compensation != "none" and opts.data is None:
        raise UsageError(f"--compensate {compensation} needs calibration data: --data FILE")
    if opts.plan is not None and opts.scores is not None:
        raise UsageError("give --plan or --scores, not both")


def _read_input(plan: str | None, scores: str | None):
    """The artifact, its source name, and its exact text (for its sha256)."""
    kinds: tuple[str, ...]
    if plan is not None:
        source, kinds = plan, ("plan",)
    elif scores is not None:
        source, kinds = scores, ("scores",)
    else:
        source, kinds = "-", ("plan", "scores")
    text, name = read_text(source, kinds)
    return parse_artifact(text, name, kinds), source, text


def _plan(opts: PruneOptions, artifact, source: str, text: str) -> tuple[dict, str]:
    """The plan to apply and its sha256: the plan given, or one selected from the scores."""
    if artifact.kind == "plan":
        given = opts.selection_given()
        if given:
            flags = ", ".join("--" + k.replace("_", "-") for k in given)
            raise UsageError(f"{flags}: selection options apply to scores, but the input is a plan (already selected)")
        return artifact.model_dump(mode="json"), sha256_bytes(text.encode())
    plan = plan_from_scores(opts, source, scores=artifact, scores_sha=sha256_bytes(text.encode()))
    return plan, sha256_bytes(dumps(plan).encode())


def _streamed(artifact, path: Path, output: Path, selection: Selection, plan_sha: str) -> str:
    """Pure slicing, tensor by tensor: the model is never built."""
    from headprune_cli.model.checkpoint import read_layout_only  # noqa: PLC0415 (keeps numpy out of this module's import)
    from headprune_cli.model.streaming import prune_layout  # noqa: PLC0415 (keeps numpy out of this module's import)

    layout = read_layout_only(path, hashed=True)  # the file is hashed while its layout is built
    check_model(artifact, path)
    return prune_layout(
        layout,
        path,
        output,
        selection.remove_heads,
        selection.remove_layers,
        plan_sha=plan_sha,
        remove_ffn=selection.remove_ffn,
    )


def _compensated(artifact, path: Path, opts: PruneOptions, selection: Selection, plan_sha: str, ctx: Context) -> str:
    """Refit in memory, then slice while writing (the bytes `cut` + `save` would write).
    The model is read from its file block by block as compensation walks it and each block
    given back once passed (model/filebacked.py); the refit projections are the only
    weights held, and the rest is sliced from the file as it is written."""
    from headprune_cli.model.checkpoint import load  # noqa: PLC0415 (keeps numpy out of this module's import)

    check_model(artifact, path)
    model = load(path, per_tensor=True)
    assert opts.data is not None  # check(): a compensation needs --data
    dataset = read_data(opts.data, model, max_length=opts.max_length, samples=opts.samples, need_labels=False)
    compensation = Compensation(
        opts.chosen_compensation(), list(batches(dataset, opts.batch_size)), opts.ridge, release=True
    )
    result = refit(model, selection, compensation, device=opts.device, dtype=opts.dtype)
    _tell(result, ctx)
    return write_refit_cut(model, path, opts.output, selection, result, plan_sha)


def _tell(result, ctx: Context) -> None:
    parts = [
        ("attention", result.skipped, result.layers, result.error_before, result.error_after),
        ("FFN", result.ffn_skipped, result.ffn_layers, result.ffn_error_before, result.ffn_error_after),
    ]
    for what, skipped, layers, before, after in parts:
        for layer, why in sorted(skipped.items()):
            ctx.print(f"[yellow]warning:[/] {result.method} compensation skipped the {what} of layer {layer}: {why}")
        if layers:
            ctx.print(
                f"{result.method} compensation on {result.tokens} tokens, "
                f"{len(layers)} layers: relative error of the residual stream after the {what} "
                f"{sum(before.values()) / len(layers):.4f} -> {sum(after.values()) / len(layers):.4f}"
            )


# `headprune prune --help`: the command's text (cli/ builds the command from STAGE).
HELP = """Remove heads, FFN neurons and layers physically (smaller dense matrices); optionally compensate.

    With neither --plan nor --scores, a plan or a scores JSON is read from stdin. Compensation (retraining-free, seconds): `bias` adds the removed heads' mean contribution to the output-projection bias; `lstsq` refits the kept columns of each pruned layer's output and down projections on --data so that the residual stream after each matches the unpruned model's (which also cancels the drift the cuts before it left).

    Examples:

      headprune prune model.safetensors --plan plan.json -o small.safetensors

      headprune prune --scores scores.json --ratio 0.3 --compensate lstsq --data calib.txt -o small.safetensors

      headprune prune lm.safetensors --scores scores.json --target-block-params 0.8 --data calib.txt -o small.safetensors

      headprune score m.safetensors --method taylor --data d.jsonl | headprune prune --ratio 0.3 --min-heads 1 -o small.safetensors
    """  # noqa: E501 - the --help text, byte for byte: rich keeps its line breaks, so a paragraph is one line

STAGE = Stage(
    "prune",
    PruneOptions,
    run,
    stem="pruned",
    inputs={
        "checkpoint": ("model",),
        "plan": ("plan",),
        "data": ("data",),
        "latency": ("latency",),
    },  # data: compensation only; latency: a latency target only
    outputs={"output": "{stem}.safetensors"},
    makes={"model": "output"},
    needs=("checkpoint",),
    checks=SELECTION_CHECKS,
    help=HELP,
)
