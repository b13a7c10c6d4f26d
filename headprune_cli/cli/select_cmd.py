"""`headprune select`: scores JSON -> plan JSON. The option types here are shared
with `headprune prune --scores`, so both spell the selection the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from headprune_cli.outputs import check_output
from headprune_cli.stages.plan import make_plan
from headprune_cli.schema import read_artifact, write_artifact
from headprune_cli.stages.selection import Constraints, ScoreTable, parse_protect, select as choose
from headprune_cli.cli.common import console

Ratio = Annotated[Optional[float], typer.Option("--ratio", help="Fraction of the kept heads to remove, in [0, 1].")]
Strategy = Annotated[
    Optional[str],
    typer.Option("--strategy", help="global | layer | threshold | budget | joint (default: from the amount given; a --target-* with loss-scale layer scores is joint)."),
]
MinHeads = Annotated[int, typer.Option("--min-heads", help="Heads every layer keeps at least.")]
MultipleOf = Annotated[int, typer.Option("--multiple-of", help="Heads kept per layer must be a multiple of this.")]
DropLayers = Annotated[int, typer.Option("--drop-layers", help="Also drop the N least important layers (needs layer scores).")]
LayerThreshold = Annotated[Optional[float], typer.Option("--layer-threshold", help="Also drop layers scoring below T.")]
Protect = Annotated[Optional[str], typer.Option("--protect", help="Heads never removed: LAYER:HEAD,... (original indices).")]
Threshold = Annotated[Optional[str], typer.Option("--threshold", help="Remove heads scoring below T, or below the P-th percentile ('25%').")]
TargetParams = Annotated[Optional[float], typer.Option("--target-params", help="Keep this fraction of the parameters.")]
TargetFlops = Annotated[Optional[float], typer.Option("--target-flops", help="Keep this fraction of the FLOPs per token.")]
GqaUnit = Annotated[str, typer.Option("--gqa-unit", help="GQA layers: remove whole KV 'group's, or query 'head's evenly from every group.")]
Uniform = Annotated[
    bool,
    typer.Option("--uniform", help="Keep the same number of heads (and KV groups) in every layer, chosen by score: "
                 "LLaMA/Mistral/Qwen models then export as plain transformers folders."),
]


def plan_from_scores(
    source: str,
    *,
    ratio=None,
    strategy=None,
    min_heads=1,
    multiple_of=1,
    drop_layers=0,
    layer_threshold=None,
    protect=None,
    threshold=None,
    target_params=None,
    target_flops=None,
    gqa_unit="group",
    uniform=False,
    scores=None,
    scores_sha=None,
) -> dict:
    """Read scores (unless given already parsed) and return the plan artifact."""
    if scores is None:
        scores, scores_sha = read_artifact(source, ("scores",))
    constraints = Constraints(
        min_heads=min_heads,
        multiple_of=multiple_of,
        protect=parse_protect(protect),
        drop_layers=drop_layers,
        layer_threshold=layer_threshold,
        gqa_unit=gqa_unit,
        uniform=uniform,
    )
    selection = choose(
        ScoreTable.from_scores(scores),
        strategy,
        ratio=ratio,
        threshold=threshold,
        target_params=target_params,
        target_flops=target_flops,
        constraints=constraints,
    )
    config = {
        "strategy": selection.strategy,
        "ratio": ratio,
        "threshold": threshold,
        "target_params": target_params,
        "target_flops": target_flops,
        **constraints.to_dict(),
    }
    return make_plan(selection, constraints, scores, str(source), scores_sha, config)


def select(
    scores: Annotated[str, typer.Argument(help="Scores JSON from `headprune score`; '-' or absent: stdin.")] = "-",
    ratio: Ratio = None,
    strategy: Strategy = None,
    min_heads: MinHeads = 1,
    multiple_of: MultipleOf = 1,
    drop_layers: DropLayers = 0,
    layer_threshold: LayerThreshold = None,
    protect: Protect = None,
    threshold: Threshold = None,
    target_params: TargetParams = None,
    target_flops: TargetFlops = None,
    gqa_unit: GqaUnit = "group",
    uniform: Uniform = False,
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="Plan JSON to write (default: stdout).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite OUTPUT if it exists.")] = False,
) -> None:
    """Choose the heads (and layers) to remove from importance scores; writes a plan.

    Every strategy respects every constraint: --min-heads per layer, --multiple-of,
    whole KV groups for grouped-query attention, --protect, and with --uniform the same
    number of heads and KV groups in every layer.

    Examples:

      headprune select scores.json --ratio 0.3 -o plan.json

      headprune select scores.json --ratio 0.5 --strategy layer --multiple-of 2

      headprune select scores.json --target-flops 0.7 --protect 0:3,5:1

      headprune select scores.json --ratio 0.5 --uniform -o plan.json

      headprune score m.safetensors --method taylor --data d.jsonl | headprune select --ratio 0.3 | headprune prune -o small.safetensors
    """
    if output is not None:
        check_output(output, force, inputs=[scores])
    plan = plan_from_scores(
        scores,
        ratio=ratio,
        strategy=strategy,
        min_heads=min_heads,
        multiple_of=multiple_of,
        drop_layers=drop_layers,
        layer_threshold=layer_threshold,
        protect=protect,
        threshold=threshold,
        target_params=target_params,
        target_flops=target_flops,
        gqa_unit=gqa_unit,
        uniform=uniform,
    )
    write_artifact(plan, output)
    summarize(plan)


def summarize(plan: dict) -> None:
    heads = sum(len(v) for v in plan["remove_heads"].values())
    before, after = plan["predicted"].get("before"), plan["predicted"].get("after")
    cost = ""
    if before and after:
        cost = (
            f"; params {after['params'] / before['params']:.1%}, "
            f"FLOPs/token {after['flops_per_token'] / before['flops_per_token']:.1%} of before"
        )
    shape = ", the same heads in every layer" if plan["constraints"].get("uniform") else ""
    console.print(f"plan ({plan['strategy']}): remove {heads} heads, {len(plan['remove_layers'])} layers{shape}{cost}")
