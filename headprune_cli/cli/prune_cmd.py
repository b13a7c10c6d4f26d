"""`headprune prune`: checkpoint + plan (or scores + amount) -> a smaller checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from headprune_cli.model.checkpoint import load, read_layout_only, save
from headprune_cli.stages.compensation import DEFAULT_RIDGE, METHODS, compensate
from headprune_cli.errors import UsageError
from headprune_cli.fileio import sha256_bytes
from headprune_cli.outputs import check_output
from headprune_cli.names import did_you_mean
from headprune_cli.stages.plan import check_model, find_model
from headprune_cli.schema import dumps, parse_artifact, read_text
from headprune_cli.model.streaming import prune_layout
from headprune_cli.model.surgery import apply_plan
from headprune_cli.cli import select_cmd as so
from headprune_cli.cli.common import console
from headprune_cli.device import DEVICE_HELP, check as check_device, place, restore


def prune(
    checkpoint: Annotated[Optional[Path], typer.Argument(help="Checkpoint to prune (default: the model the plan/scores name).")] = None,
    output: Annotated[Path, typer.Option("-o", "--output", help="Pruned checkpoint to write (.safetensors).")] = ...,
    plan: Annotated[Optional[str], typer.Option("--plan", help="Plan JSON from `headprune select` ('-': stdin).")] = None,
    scores: Annotated[Optional[str], typer.Option("--scores", help="Scores JSON; select in place with --ratio etc.")] = None,
    ratio: so.Ratio = None,
    strategy: so.Strategy = None,
    min_heads: so.MinHeads = 1,
    multiple_of: so.MultipleOf = 1,
    drop_layers: so.DropLayers = 0,
    layer_threshold: so.LayerThreshold = None,
    protect: so.Protect = None,
    threshold: so.Threshold = None,
    target_params: so.TargetParams = None,
    target_flops: so.TargetFlops = None,
    gqa_unit: so.GqaUnit = "group",
    uniform: so.Uniform = False,
    compensation: Annotated[str, typer.Option("--compensate", help="none | bias | lstsq (needs --data).")] = "none",
    data: Annotated[Optional[Path], typer.Option("--data", help="Calibration data for --compensate (a few hundred examples).")] = None,
    samples: Annotated[int, typer.Option("--samples", help="Calibration examples to read from --data.")] = 256,
    max_length: Annotated[int, typer.Option("--max-length", help="Tokens per calibration example.")] = 128,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Calibration batch size.")] = 16,
    ridge: Annotated[float, typer.Option("--ridge", min=0.0, help="lstsq: strength of the pull towards the current weights, relative to the mean input energy.")] = DEFAULT_RIDGE,
    force: Annotated[bool, typer.Option("--force", help="Overwrite OUTPUT if it exists.")] = False,
    device: Annotated[str, typer.Option("--device", help="Where --compensate computes: " + DEVICE_HELP)] = "auto",
    dtype: Annotated[str, typer.Option("--dtype", help="Compensation's compute dtype: auto (stored), float32, bfloat16, float16; the output keeps the stored dtype.")] = "auto",
) -> None:
    """Remove heads and layers physically (smaller dense matrices); optionally compensate.

    With neither --plan nor --scores, a plan or a scores JSON is read from stdin.
    Compensation (retraining-free, seconds): `bias` adds the removed heads' mean
    contribution to the output-projection bias; `lstsq` refits the kept columns of each
    pruned layer's output projection to match the unpruned layer on --data.

    Examples:

      headprune prune model.safetensors --plan plan.json -o small.safetensors

      headprune prune --scores scores.json --ratio 0.3 --compensate lstsq --data calib.txt -o small.safetensors

      headprune score m.safetensors --method taylor --data d.jsonl | headprune prune --ratio 0.3 --min-heads 1 -o small.safetensors
    """
    if compensation not in METHODS:
        raise UsageError(f"unknown compensation {compensation!r}{did_you_mean(compensation, METHODS)}")
    if compensation != "none" and data is None:
        raise UsageError(f"--compensate {compensation} needs calibration data: --data FILE")
    if plan is not None and scores is not None:
        raise UsageError("give --plan or --scores, not both")
    check_device(device, dtype)
    check_output(output, force, inputs=[p for p in (checkpoint, plan, scores, data) if p is not None])
    artifact, source, text = _read_input(plan, scores)
    select_opts = dict(
        ratio=ratio, strategy=strategy, min_heads=min_heads, multiple_of=multiple_of, drop_layers=drop_layers,
        layer_threshold=layer_threshold, protect=protect, threshold=threshold, target_params=target_params,
        target_flops=target_flops, gqa_unit=gqa_unit, uniform=uniform,
    )
    if artifact.kind == "plan":
        _refuse_select_options(select_opts)
        plan_dict, plan_sha = artifact.model_dump(mode="json"), sha256_bytes(text.encode())
    else:
        plan_dict = so.plan_from_scores(source, scores=artifact, scores_sha=sha256_bytes(text.encode()), **select_opts)
        plan_sha = sha256_bytes(dumps(plan_dict).encode())
    path = find_model(artifact, source, checkpoint)
    check_output(output, force, inputs=[path])
    remove_heads = {int(k): v for k, v in plan_dict["remove_heads"].items()}
    if compensation == "none":  # pure slicing: streamed tensor by tensor, the model is never built
        layout = read_layout_only(path, hashed=True)  # the file is hashed while its layout is built
        check_model(artifact, path)
        digest = prune_layout(layout, path, output, remove_heads, plan_dict["remove_layers"], plan_sha=plan_sha)
    else:
        check_model(artifact, path)
        model = load(path)
        placement = place(model, device, dtype, keep_originals=True)
        _compensate(model, remove_heads, plan_dict["remove_layers"], compensation, data, samples, max_length, batch_size, ridge)
        restore(model, placement)  # cut and saved on the CPU, in the stored dtype
        apply_plan(model, remove_heads, plan_dict["remove_layers"])
        digest = save(model, output, plan_sha=plan_sha, overwrite=force)
    heads = sum(len(v) for v in remove_heads.values())
    console.print(f"wrote {output}: removed {heads} heads, {len(plan_dict['remove_layers'])} layers (sha256 {digest[:12]})")


def _read_input(plan: str | None, scores: str | None):
    """The artifact, its source name, and its exact text (for its sha256)."""
    if plan is not None or scores is not None:
        source = plan if plan is not None else scores
        kinds = ("plan",) if plan is not None else ("scores",)
    else:
        source, kinds = "-", ("plan", "scores")
    text, name = read_text(source)
    return parse_artifact(text, name, kinds), source, text


def _refuse_select_options(opts: dict) -> None:
    defaults = dict(min_heads=1, multiple_of=1, drop_layers=0, gqa_unit="group", uniform=False)
    given = [k for k, v in opts.items() if v != defaults.get(k)]
    if given:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        raise UsageError(f"{flags}: selection options apply to scores, but the input is a plan (already selected)")


def _compensate(model, remove_heads, remove_layers, method, data, samples, max_length, batch_size, ridge) -> None:
    from headprune_cli.data import batches, read_data  # deferred: tokenizers load only when needed

    dataset = read_data(data, model, max_length=max_length, samples=samples, need_labels=False)
    result = compensate(model, remove_heads, remove_layers, list(batches(dataset, batch_size)), method=method, ridge=ridge)
    for layer, why in sorted(result.skipped.items()):
        console.print(f"[yellow]warning:[/] {method} compensation skipped layer {layer}: {why}")
    if result.layers:
        before = sum(result.error_before.values()) / len(result.layers)
        after = sum(result.error_after.values()) / len(result.layers)
        console.print(
            f"{method} compensation on {result.tokens} tokens, {len(result.layers)} layers: "
            f"relative attention-output error {before:.4f} -> {after:.4f}"
        )
