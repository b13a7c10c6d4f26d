"""The `select` stage: scores JSON -> plan JSON. Its selection options and the choosing are
select/choosing.py's, shared with `prune --scores` and `tasks`."""

from __future__ import annotations

from pathlib import Path

from headprune_cli.artifacts.schema import write_artifact
from headprune_cli.files.outputs import check_output
from headprune_cli.stages.select.choosing import SELECTION_CHECKS, SelectionOptions, plan_from_scores
from headprune_cli.stages.unit import Context, Result, Stage, option


class SelectOptions(SelectionOptions):
    scores: str = option("-", "Scores JSON from `headprune score`; '-' or absent: stdin.", argument=True)
    output: Path | None = option(None, "Plan JSON to write (default: stdout).", "-o", "--output")
    force: bool = option(False, "Overwrite OUTPUT if it exists.")


def run(opts: SelectOptions, ctx: Context) -> Result:
    if opts.output is not None:
        check_output(opts.output, opts.force, inputs=[opts.scores, opts.latency])
    opts.check()
    plan = plan_from_scores(opts, opts.scores)
    write_artifact(plan, opts.output)
    ctx.print(summary(plan))
    return Result([str(opts.output)] if opts.output else [], value=plan)


def summary(plan: dict) -> str:
    heads = sum(len(v) for v in plan["remove_heads"].values())
    neurons = sum(len(v) for v in (plan.get("remove_ffn") or {}).values())
    before, after = plan["predicted"].get("before"), plan["predicted"].get("after")
    cost = ""
    if before and after:
        cost = (
            f"; params {after['params'] / before['params']:.1%}, "
            f"FLOPs/token {after['flops_per_token'] / before['flops_per_token']:.1%} of before"
        )
    shape = ", the same heads in every layer" if plan["constraints"].get("uniform") else ""
    ffn = f", {neurons} FFN neurons" if neurons else ""
    if plan.get("latency"):
        cost += (
            f"; latency {plan['latency']['after_ms']:.4g} ms predicted, "
            f"{plan['latency']['after_fraction']:.1%} of before"
        )
    return f"plan ({plan['strategy']}): remove {heads} heads{ffn}, {len(plan['remove_layers'])} layers{shape}{cost}"


# `headprune select --help`: the command's text (cli/ builds the command from STAGE).
HELP = """Choose the heads, FFN neurons and layers to remove from importance scores; writes a plan.

    Every strategy respects every constraint: --min-heads per layer, --multiple-of,
    whole KV groups for grouped-query attention, --protect, and with --uniform the same
    number of heads and KV groups in every layer.

    Examples:

      headprune select scores.json --ratio 0.3 -o plan.json

      headprune select scores.json --ratio 0.5 --strategy layer --multiple-of 2

      headprune select scores.json --target-flops 0.7 --protect 0:3,5:1

      headprune select scores.json --target-block-params 0.8 -o plan.json   # 20% of the non-embedding params removed

      headprune select scores.json --ratio 0.5 --uniform -o plan.json

      headprune select scores.json --target-flops 0.6 --runtime vllm -o plan.json   # only plans vLLM loads

      headprune select scores.json --target-flops 0.8 --runtime llama.cpp --gguf-type q4_0   # widths on q4_0's blocks

      headprune score m.safetensors --method taylor --data d.jsonl | headprune select --ratio 0.3 | headprune prune -o small.safetensors
    """  # noqa: E501 - the --help text, byte for byte: rich keeps its line breaks, so a paragraph is one line

STAGE = Stage(
    "select",
    SelectOptions,
    run,
    stem="plan",
    inputs={"scores": ("scores",), "latency": ("latency",)},
    outputs={"output": "{stem}.json"},
    makes={"plan": "output"},
    needs=("scores",),
    checks=SELECTION_CHECKS,
    help=HELP,
)
