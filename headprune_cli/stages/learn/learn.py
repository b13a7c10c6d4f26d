"""Learned pruning around the training loop: set up the gates, close them, cut the model.

`learn --ratio R` (or `--target-params F` / `--target-flops F`) trains hard-concrete gates
on the heads jointly with the model, with `--gate-ffn` also on every FFN neuron and with
`--gate-layers` on every whole layer, all under the one budget (gates.LearnedGates: a
Lagrangian drives the expected share removed to the target). Afterwards the gates close
deterministically: the open probabilities become a ScoreTable (method `learned`) and `select`
chooses from it with the same amount and constraints (--min-heads, --multiple-of, --protect,
--uniform, --min-ffn, --ffn-multiple-of) that `headprune select` would apply, layers open with
probability below 0.5 dropped (`--layer-threshold 0.5`), so the cut is exactly what `select`
gives. The last steps train with the gates closed (--closed-share); then `cut` removes the
closed units physically. The same ScoreTable is what `--gates-out` writes, as a scores
artifact that `headprune select` reads back (`select gates.json --target-flops F
--layer-threshold 0.5` gives the same plan).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from headprune_cli.artifacts.schema import input_ref
from headprune_cli.errors import UsageError
from headprune_cli.stages.budget import Budget, block_params, checked
from headprune_cli.stages.constraints import Constraints
from headprune_cli.stages.select.chains import Selection
from headprune_cli.stages.select.plan import plan_artifact
from headprune_cli.stages.select.strategies import select


def check_learning(targets: list[Budget], constraints_given: list[str]) -> Budget:
    """The one budget learned pruning aims at, after refusing option combinations it cannot run with."""
    flags = [budget.option for budget in targets]
    if not flags:
        raise UsageError(
            "learn needs a target: --ratio R, --target-params F, --target-flops F or --target-block-params F"
        )
    if len(flags) > 1:
        raise UsageError(f"learn takes one target, not {' and '.join(flags)}")
    neuron_rules = [
        "--" + name.replace("_", "-") for name in ("min_ffn", "ffn_multiple_of") if name in constraints_given
    ]
    if neuron_rules and "gate_ffn" not in constraints_given:
        raise UsageError(f"{', '.join(neuron_rules)}: rules for the FFN widths the gates keep; they need --gate-ffn")
    return checked(targets[0])


# Layers whose gate is open with a probability below this are dropped at the closing (the layer
# gate rounded); heads and neurons are then chosen by `select` from their open probabilities on
# the layers left, so the budget is met exactly.
LAYER_CLOSED_BELOW = 0.5


def closing_constraints(constraints: Constraints, layers: bool) -> Constraints:
    """The constraints the gates close under: with layer gates, the closed layers dropped by threshold."""
    return replace(constraints, layer_threshold=LAYER_CLOSED_BELOW) if layers else constraints


def closer(budget: Budget, constraints: Constraints):
    """`close(table) -> Selection`: select from the gates' open probabilities as `headprune select` would."""

    def close(table) -> Selection:
        return select(table, budget=budget, constraints=constraints)

    return close


def make_gates(
    model,
    budget: Budget,
    constraints: Constraints,
    *,
    seed: int,
    seq_len: int,
    lr: float,
    warmup: float,
    closed_share: float,
    tolerance: float = 0.01,
    extra_steps: int = 0,
    ffn: bool = False,
    layers: bool = False,
):
    """The LearnedGates for `model`, after checking that the gates can be closed within the
    constraints (select on the untrained gates), so that a bad budget fails before training."""
    from headprune_cli.stages.learn.gates import LearnedGates  # noqa: PLC0415 (keeps torch, transformers out of this module's import)

    if (ffn or layers) and budget.kind == "heads":
        raise UsageError(
            "--gate-ffn and --gate-layers price every unit on one cost: give --target-flops, --target-params or "
            "--target-block-params, not --ratio"
        )
    gates = LearnedGates(
        model,
        budget,
        closer(budget, closing_constraints(constraints, layers)),
        seed,
        seq_len=seq_len,
        lr=lr,
        warmup=warmup,
        closed_share=closed_share,
        tolerance=tolerance,
        extra_steps=extra_steps,
        protect=constraints.protect,
        ffn=ffn,
        layers=layers,
    )
    reachable = gates.removed_share(gates.close(gates.table()))
    # Rounding to whole units costs up to half a unit; a constraint (--min-heads) that caps the cut, more.
    slack = max(tolerance, 0.5 * float(gates.space.head_price.max()))
    if reachable < budget.removed - slack - 1e-9:
        raise UsageError(
            f"{budget.option}: the gates would have to remove {budget.removed:.3f} of the "
            f"{'heads' if budget.kind == 'heads' else budget.kind.replace('_', ' ')}, but the closing (select with "
            f"--min-heads {constraints.min_heads} and the other constraints) can remove at most {reachable:.3f}; "
            "lower the target"
        )
    if budget.kind == "heads":  # aim at the share the closing removes (61 of 72 heads at --ratio 0.85: 0.847)
        gates.goal = reachable
    return gates


@dataclass
class Closed:
    table: object  # the ScoreTable of the final open probabilities
    selection: Selection
    scores: dict  # the scores artifact (method `learned`)
    plan: dict  # the plan artifact of the cut (its sha256 goes into the checkpoint's provenance)
    report: dict  # LearnedGates.report: expected vs closed share, the per-step trace (also the scores' config.gates)


def close_gates(
    model,
    gates,
    constraints: Constraints,
    budget: Budget,
    *,
    checkpoint,
    data,
    max_length: int,
    objective: str,
    samples: int,
    config: dict,
) -> Closed:
    """Close the trained gates: scores and plan artifacts, computed on the model before the cut,
    and the gates' report; FarFromTarget when gates never closed in training are far from the target."""
    from headprune_cli.stages.score.importance.api import scores_artifact  # noqa: PLC0415 (keeps torch, transformers out of this module's import)

    gates.check_reached()  # without a closed phase, the check the closing step would have made
    table = gates.table(objective, samples, config)
    selection = gates.close(table)
    report = gates.report(selection)
    scores = scores_artifact(
        model, table, model_path=checkpoint, data_path=data, max_length=max_length, extra_config={"gates": report}
    )
    amount = budget.as_options()
    constraints = closing_constraints(constraints, gates.space.gates_layers)
    neurons = table.num_ffn if table.ffn is not None else None
    plan_config = {
        "strategy": selection.strategy,
        "ratio": amount["ratio"],
        "threshold": None,
        "target_params": amount["target_params"],
        "target_flops": amount["target_flops"],
        **block_params(amount["target_block_params"]),
        **constraints.to_dict(ffn=neurons is not None),
    }
    inputs = [input_ref("model", checkpoint, model.headprune.source_sha), input_ref("data", data)]
    plan = plan_artifact(selection, constraints, inputs, list(table.num_heads), plan_config, num_ffn=neurons)
    return Closed(table, selection, scores, plan, report)
