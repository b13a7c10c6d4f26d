"""`select --latency TABLE --target-latency F | --target-ms X`: the cost budget in measured
milliseconds.

The table becomes linear prices (model/latency_table.priced) in the cost table's FLOPs
fields, and the same selection that spends a FLOPs budget (heads, FFN neurons and layers
together; every constraint) spends it. The chosen plan's latency is then predicted from
the measured points themselves (piecewise-linear), which the linear prices only
approximate: when that prediction misses the target, the linear budget is tightened by
the miss and the selection rerun; then the budget is bisected between that plan and the
loosest one that missed, so the plan kept is the slowest (least cut) that the measured
points say fits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, cast

from headprune_cli.artifacts.schema import read_artifact
from headprune_cli.errors import UsageError
from headprune_cli.model.cost_table import predict
from headprune_cli.model.latency_table import LatencyTable, priced
from headprune_cli.stages.budget import Budget, BudgetUnreachable, checked
from headprune_cli.stages.select.plan import model_ref

if TYPE_CHECKING:  # the artifact's type only: select runs without the profile stage's modules
    from headprune_cli.stages.profile.latency_artifact import LatencyTableArtifact

MAX_TIGHTENINGS = 8
BISECTIONS = 12  # selections spent closing in on the target from below


@dataclass
class LatencyBudget:
    table: LatencyTable
    budget: Budget  # kind "latency" (a fraction of the profiled latency) or "ms"

    def target_ms(self) -> float:
        if self.budget.kind == "ms":
            return self.budget.value
        return self.budget.value * self.table.full_ms()


def latency_budget(fraction, ms, others: dict) -> Budget:
    """The budget of --target-latency / --target-ms; --latency takes one of them and no other amount."""
    given = [name for name, value in others.items() if value is not None]
    if given:
        raise UsageError(
            "--latency prices a latency target; "
            f"leave out {', '.join(given)} (give --target-latency F or --target-ms X)"
        )
    if (fraction is None) == (ms is None):
        raise UsageError(
            "--latency needs exactly one of --target-latency F (a fraction of the profiled latency) or --target-ms X"
        )
    return checked(Budget("latency", fraction) if fraction is not None else Budget("ms", ms))


def plan_ms(table: LatencyTable, scores, remove_heads: dict, remove_layers: list, remove_ffn: dict) -> float:
    """The table's interpolated latency of the scored model after a plan."""
    heads, widths = {}, {}
    for layer, kept in scores.kept().items():
        if layer in remove_layers:
            continue
        heads[layer] = len(kept) - len(remove_heads.get(layer, []))
        widths[layer] = table.layers[layer].ffn.xs[-1] - len((remove_ffn or {}).get(layer, []))
    return table.predict_ms(heads, widths)


def select_by_latency(scores, strategy, budget: LatencyBudget, constraints, choose):
    """(selection, latency record). `choose(table, strategy, budget, constraints)` is the
    FLOPs-budget selection; it runs on the table priced in milliseconds."""
    if scores.cost is None:
        raise UsageError("a latency budget needs the cost table in the scores (rescore with this version)")
    lat = budget.table
    full, target = lat.full_ms(), budget.target_ms()
    if target > full * (1 + 1e-9):
        raise UsageError(f"--target-ms {target:g} is above the profiled latency of the whole model ({full:.4g} ms)")
    if target <= lat.outside_ms:
        raise UsageError(
            f"a latency target of {target:.4g} ms is below what the table can reach: the layers' rest "
            f"(embeddings, head) alone takes {lat.outside_ms:.4g} ms of the profiled {full:.4g} ms"
        )
    by_ms = replace(scores, cost=priced(lat, scores.cost))
    linear_full = predict(by_ms.cost, scores.kept())["flops_per_token"]
    tries = []

    def attempt(fraction: float):
        selection = _choose(choose, by_ms, strategy, fraction, constraints, target, full)
        ms = plan_ms(lat, scores, selection.remove_heads, selection.remove_layers, selection.remove_ffn)
        tries.append(ms)
        return selection, ms

    selection, ms = _search(attempt, min(1.0, target / linear_full), target)  # of the linear prices' total
    kept = scores.kept()
    selection.predicted = {
        "before": predict(scores.cost, kept),
        "after": predict(
            scores.cost, kept, selection.remove_heads, selection.remove_layers, selection.remove_ffn or None
        ),
    }
    record = {
        "phase": lat.phase,
        "device": lat.facts["device"]["name"],
        "target_ms": target,
        "target_fraction": target / full,
        "before_ms": full,
        "after_ms": ms,
        "after_fraction": ms / full,
        "selections": len(tries),
    }
    return selection, record


def _search(attempt, fraction: float, target: float):
    """The plan with the largest interpolated latency within `target`: the linear budget is
    tightened by the miss until a plan fits, then bisected between the tightest fitting
    budget and the loosest failing one (linear prices can err either way)."""
    fits, misses = None, 1.0 + 1e-9
    for tightening in range(MAX_TIGHTENINGS + 1):
        selection, ms = attempt(fraction)
        if ms <= target * (1 + 1e-9):
            fits = (fraction, selection, ms)
            break
        misses = min(misses, fraction)
        # Scaled by the miss, and by a margin that doubles each time: a plan a hair over the
        # target would otherwise be chosen again by a budget a hair tighter.
        fraction *= target / ms * (1 - 0.002 * 2**tightening)
    if fits is None:
        raise BudgetUnreachable(
            message=f"the latency target {target:.4g} ms cannot be met within the constraints (best plan: {ms:.4g} ms)"
        )
    low, high = fits[0], min(misses, 1.0)
    for _ in range(BISECTIONS):
        if high - low < 1e-4:
            break
        middle = (low + high) / 2
        selection, ms = attempt(middle)  # looser than a budget that was met: it is met too
        if ms <= target * (1 + 1e-9):
            low = middle
            if ms >= fits[2]:  # a looser budget: on a tie, the plan that cuts less
                fits = (middle, selection, ms)
        else:
            high = middle
    return fits[1], fits[2]


def _choose(choose, by_ms, strategy, fraction, constraints, target, full):
    try:
        return choose(by_ms, strategy, Budget("flops", fraction), constraints)
    except BudgetUnreachable:
        raise BudgetUnreachable(
            message=f"the latency target {target:.4g} ms ({target / full:.3f} of the profiled {full:.4g} ms) "
            "cannot be met within the constraints (--min-heads, --min-ffn, --multiple-of, --protect)"
        ) from None


def read_latency(path: str, scores, phase: str = "forward") -> tuple[LatencyTable, str]:
    """The latency table at `path`, checked to belong to the scored model; (table, sha256)."""

    if phase not in ("forward", "decode"):
        raise UsageError(f"--latency-phase {phase!r}: expected forward or decode")
    found, sha = read_artifact(path, ("latency",))
    artifact = cast("LatencyTableArtifact", found)  # what kind "latency" validates as (artifacts' KINDS table)
    check_belongs(artifact, model_ref(scores).sha256, _scored_shape(scores), str(path))
    if phase not in artifact.phases:
        raise UsageError(
            f"{path}: the table has no {phase} profile (it has {', '.join(artifact.phases)}); "
            "profile with --context for decode"
        )
    return LatencyTable.from_artifact(artifact, phase), sha


def _scored_shape(scores) -> dict:
    kept = {int(k): v for k, v in scores.kept.items()}
    shape = {
        "num_heads": list(scores.num_heads),
        "num_kv_heads": list(scores.num_kv_heads),
        "heads": {layer: len(heads) for layer, heads in kept.items()},
    }
    if getattr(scores, "ffn", None) is not None:
        shape["ffn"] = {layer: len(entry.kept_indices()) for layer, entry in scores.ffn.layers.items()}
    return shape


def check_belongs(artifact, sha256: str, shape: dict, name: str) -> None:
    """Refuse a table profiled on another model: another file, or another shape."""
    model = artifact.model
    if model.sha256 != sha256:
        raise UsageError(
            f"{name}: the latency table was profiled on another model (sha256 {model.sha256[:12]}, "
            f"this one is {sha256[:12]}); profile this model"
        )
    mine = {
        "num_heads": model.num_heads,
        "num_kv_heads": model.num_kv_heads,
        "heads": dict(model.heads),
        "ffn": dict(model.ffn),
    }
    for key, value in shape.items():
        if mine[key] != value:
            raise UsageError(
                f"{name}: the latency table's model has {key} {mine[key]}, this model {value}; profile this model"
            )
