"""The `select` stage: scores JSON -> plan JSON. Its selection options are shared with
`prune --scores`, so both spell (and default) the selection the same way."""

from __future__ import annotations

from pathlib import Path

from headprune_cli.artifacts.schema import input_ref, read_artifact, write_artifact
from headprune_cli.errors import UsageError
from headprune_cli.files.outputs import check_output
from headprune_cli.model.gguf_grid import grid_ffn_multiple
from headprune_cli.stages.budget import Budget, given
from headprune_cli.stages.score.table import ScoreTable
from headprune_cli.stages.select import latency as latency_select
from headprune_cli.stages.select.amounts import check_fractions, check_latency_options
from headprune_cli.stages.select.chains import Constraints, parse_protect
from headprune_cli.stages.select.plan import make_plan
from headprune_cli.stages.select.runtime import check_runtime, shape_rules
from headprune_cli.stages.select.strategies import select as choose
from headprune_cli.stages.unit import Context, Options, Result, Stage, option


def ratio_option():
    return option(None, "Fraction of the kept heads to remove, in [0, 1].")


def target_params_option():
    return option(None, "Keep this fraction of the parameters.")


def target_flops_option():
    return option(None, "Keep this fraction of the FLOPs per token.")


class ConstraintOptions(Options):
    """What every candidate plan must respect, whoever chooses it (select, prune, search)."""

    min_heads: int = option(1, "Heads every layer keeps at least (drop a whole layer with --drop-layers).", ge=1)
    multiple_of: int = option(1, "Heads kept per layer must be a multiple of this.", ge=1)
    protect: str | None = option(None, "Heads never removed: LAYER:HEAD,... (original indices).")
    gqa_unit: str = option("group", "GQA layers: remove whole KV 'group's, or query 'head's evenly from every group.")
    uniform: bool = option(
        False,
        "Keep the same number of heads (and KV groups, and FFN width) in every layer, chosen by score: "
        "LLaMA/Mistral/Qwen models then export as plain transformers folders.",
    )
    min_ffn: int | None = option(
        None,
        "FFN neurons every layer keeps at least, when the scores hold neuron scores (default: --ffn-multiple-of).",
        ge=1,
    )
    ffn_multiple_of: int = option(
        8, "FFN widths kept are multiples of this (8: what GPU matrix kernels tile by; 1 on CPUs costs nothing).", ge=1
    )
    runtime: str | None = option(
        None,
        "Choose only plans this engine loads: transformers (one shape for all layers, as --uniform), vllm (one "
        "head count, FFN widths per layer), llama.cpp or onnxruntime (any per-layer shapes).",
    )
    gguf_type: str | None = option(
        None,
        "With --runtime llama.cpp: the GGUF type the cut will ship in (q8_0, q4_0, q4_K_M, ...); FFN widths are kept "
        "on its quantization blocks (32 values, 256 for k-quants), so no matrix of the file falls back to a wider "
        "type and runs slower than the unpruned model's.",
    )

    def constraints(self) -> Constraints:
        rules = shape_rules(check_runtime(self.runtime))
        if self.gguf_type is not None and self.runtime != "llama.cpp":
            raise UsageError("--gguf-type goes with --runtime llama.cpp (the GGUF file's quantization grid)")
        return Constraints(
            min_heads=self.min_heads,
            multiple_of=self.multiple_of,
            protect=parse_protect(self.protect),
            drop_layers=getattr(self, "drop_layers", 0),
            layer_threshold=getattr(self, "layer_threshold", None),
            gqa_unit=self.gqa_unit,
            uniform=self.uniform or rules["uniform"],
            min_ffn=self.min_ffn,
            ffn_multiple_of=grid_ffn_multiple(self.ffn_multiple_of, self.gguf_type),
            uniform_heads=rules["uniform_heads"],
            runtime=self.runtime,
            gguf_type=self.gguf_type,
        )


class SelectionOptions(ConstraintOptions):
    """How to choose from scores: the amount (one of ratio, threshold, targets) and the constraints."""

    ratio: float | None = ratio_option()
    strategy: str | None = option(
        None,
        "global | layer | threshold | budget | joint | random (default: from the amount given; "
        "a --target-* with loss-scale layer scores is joint; random: a seeded control, --ratio only).",
    )
    seed: int | None = option(None, "--strategy random: seed of the draw (default 0; other strategies ignore it).")
    drop_layers: int = option(0, "Also drop the N least important layers (needs layer scores).", ge=0)
    layer_threshold: float | None = option(None, "Also drop layers scoring below T.")
    threshold: str | None = option(None, "Remove heads scoring below T, or below the P-th percentile ('25%').")
    target_params: float | None = target_params_option()
    target_flops: float | None = target_flops_option()
    latency: str | None = option(
        None,
        "Latency table from `headprune profile`: price the budget in measured milliseconds (with "
        "--target-latency or --target-ms).",
    )
    target_latency: float | None = option(None, "With --latency: keep this fraction of the profiled latency.")
    target_ms: float | None = option(None, "With --latency: keep the predicted latency at most this many milliseconds.")
    latency_phase: str = option(
        "forward",
        "With --latency: price by the table's 'forward' profile, "
        "or its 'decode' one (causal LMs profiled with --context).",
    )

    def budget(self) -> Budget | None:
        """The one cost or head budget these options name (None with --threshold or none).
        Latency budgets are priced by their table (`_latency_plan`)."""
        found = given(ratio=self.ratio, target_params=self.target_params, target_flops=self.target_flops)
        if len(found) > 1 or (found and self.threshold is not None):
            raise UsageError("give exactly one of --ratio, --threshold, --target-params, --target-flops")
        return found[0] if found else None

    def check(self) -> None:
        """Refusals that need no file: the amount's range and the latency options' pairing."""

        check_fractions(self.ratio, self.target_params, self.target_flops)
        check_latency_options(self)

    def selection_given(self) -> list[str]:
        """The selection options set to other than their defaults."""
        return [
            name
            for name in SelectionOptions.model_fields
            if getattr(self, name) != SelectionOptions.model_fields[name].default
        ]


class SelectOptions(SelectionOptions):
    scores: str = option("-", "Scores JSON from `headprune score`; '-' or absent: stdin.", argument=True)
    output: Path | None = option(None, "Plan JSON to write (default: stdout).", "-o", "--output")
    force: bool = option(False, "Overwrite OUTPUT if it exists.")


def plan_from_scores(opts: SelectionOptions, source: str, scores=None, scores_sha: str | None = None) -> dict:
    """The plan artifact chosen from scores (read from `source` unless given parsed)."""
    if scores is None:
        scores, scores_sha = read_artifact(source, ("scores",))
    constraints = opts.constraints()
    latency = check_latency_options(opts)
    if latency is not None:
        return _latency_plan(opts, latency, scores, str(source), scores_sha, constraints)
    selection = choose(
        ScoreTable.from_scores(scores),
        opts.strategy,
        budget=opts.budget(),
        threshold=opts.threshold,
        constraints=constraints,
        seed=opts.seed,
    )
    return make_plan(
        selection, constraints, scores, str(source), scores_sha, _config(opts, selection, constraints, scores)
    )


def _config(opts: SelectionOptions, selection, constraints, scores, **latency) -> dict:
    return {
        "strategy": selection.strategy,
        "ratio": opts.ratio,
        "threshold": opts.threshold,
        "target_params": opts.target_params,
        "target_flops": opts.target_flops,
        **latency,
        **constraints.to_dict(ffn=getattr(scores, "ffn", None) is not None),
        **({"seed": 0 if opts.seed is None else opts.seed} if selection.strategy == "random" else {}),
    }


def _latency_plan(opts: SelectionOptions, latency: Budget, scores, source: str, scores_sha: str, constraints) -> dict:
    """A plan under a latency budget (latency.py), checked by check_latency_options."""
    table, table_sha = latency_select.read_latency(opts.latency, scores, opts.latency_phase)
    budget = latency_select.LatencyBudget(table, latency)
    pick = lambda t, strategy, flops, c: choose(t, strategy, budget=flops, constraints=c)  # noqa: E731
    selection, record = latency_select.select_by_latency(
        ScoreTable.from_scores(scores), opts.strategy, budget, constraints, pick
    )
    config = _config(
        opts,
        selection,
        constraints,
        scores,
        target_latency=opts.target_latency,
        target_ms=opts.target_ms,
        latency_phase=opts.latency_phase,
    )
    plan = make_plan(selection, constraints, scores, source, scores_sha, config, latency=record)
    plan["inputs"].append(input_ref("latency", opts.latency, table_sha))
    return plan


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


STAGE = Stage(
    "select",
    SelectOptions,
    run,
    stem="plan",
    inputs={"scores": ("scores",), "latency": ("latency",)},
    outputs={"output": "{stem}.json"},
    makes={"plan": "output"},
    needs=("scores",),
)
