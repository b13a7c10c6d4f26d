"""`cut` and `prune_once`: the one way any stage cuts a model in memory.

`prune`, `sweep`, `iterate` and `finetune` all cut through `cut(model, selection,
compensation)`: optional closed-form compensation on the gated model first, then the
physical removal. `prune_once(model, budget, method, constraints, compensation)` is the
score -> select -> cut that `iterate` repeats every round and `sweep` at every budget: it
scores the model (or takes scores already made), selects under the budget and returns a
cut copy with its selection. `prune` without compensation never builds the model: it slices
the checkpoint tensor by tensor (model/streaming.py), which gives the same file.

Shared by several stages, so it is a module of its own beside prune's entry file, not in it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from torch import nn

from headprune_cli.model.checkpoint import read_layout_only
from headprune_cli.model.streaming import prune_layout
from headprune_cli.model.surgery import apply_plan
from headprune_cli.runtime.device import place, restore
from headprune_cli.stages.budget import Budget
from headprune_cli.stages.constraints import Constraints
from headprune_cli.stages.prune.compensation import DEFAULT_RIDGE, compensate
from headprune_cli.stages.score.importance.api import score_model
from headprune_cli.stages.score.table import ScoreTable
from headprune_cli.stages.select.chains import Selection
from headprune_cli.stages.select.strategies import select


@dataclass
class Compensation:
    """Closed-form compensation before the cut: `method` bias|lstsq on calibration `batches`."""

    method: str
    batches: list
    ridge: float = DEFAULT_RIDGE
    # The model is as loaded with load(per_tensor=True), untouched: each block's weights are
    # given back to their file once compensation has passed the block (model/filebacked.py).
    release: bool = False


@dataclass
class Pruned:
    """What `prune_once` made: the cut copy and what was removed from it (original indices)."""

    model: nn.Module
    selection: Selection
    compensation: Any = None  # the compensation's result, when one ran

    @property
    def heads_removed(self) -> int:
        return sum(len(h) for h in self.selection.remove_heads.values())


def cut(
    model,
    selection: Selection,
    compensation: Compensation | None = None,
    *,
    device: str | None = None,
    dtype: str = "auto",
):
    """Cut `model` in place by `selection`; returns the compensation's result (or None).

    With `device`, compensation computes there (in `dtype`) and the model comes back to
    the CPU in its stored dtype before the cut (what `save` writes)."""

    result = refit(model, selection, compensation, device=device, dtype=dtype)
    apply_plan(model, selection.remove_heads, selection.remove_layers, remove_ffn=selection.remove_ffn)
    return result


def refit(
    model,
    selection: Selection,
    compensation: Compensation | None = None,
    *,
    device: str | None = None,
    dtype: str = "auto",
):
    """`cut`'s first half: compensate `model` in place for `selection` (the plan's units
    still there, the kept columns refit); returns the compensation's result (or None).
    `prune --data` stops here and slices while it writes (model/streaming.py), so the cut
    copy of every sliced tensor is never held beside the model."""
    if compensation is None or compensation.method == "none":
        return None
    placement = None if device is None else place(model, device, dtype, keep_originals=True)
    result = compensate(
        model,
        selection.remove_heads,
        selection.remove_layers,
        compensation.batches,
        method=compensation.method,
        ridge=compensation.ridge,
        remove_ffn=selection.remove_ffn,
        release=compensation.release,
    )
    if placement is not None:
        restore(model, placement)
    return result


def write_refit_cut(model, source, output, selection: Selection, result, plan_sha: str | None = None) -> str:
    """`source` cut by `selection` into `output`, the bytes `cut` + `save` would write, with the
    projections `refit` rewrote (`result.rewritten`) taken from `model` (loaded from `source`)
    and every other tensor sliced from the file as it is written. Returns the output's sha256."""
    state = model.state_dict(keep_vars=True)
    return prune_layout(
        read_layout_only(source, hashed=True),
        source,
        output,
        selection.remove_heads,
        selection.remove_layers,
        plan_sha=plan_sha,
        remove_ffn=selection.remove_ffn,
        tensors={name: state[name] for name in result.rewritten},
    )


def prune_once(
    model: nn.Module,
    budget: Budget,
    method: str | ScoreTable,
    constraints: Constraints = Constraints(),
    compensation: Compensation | None = None,
    *,
    data=None,
    objective: str | None = None,
    strategy: str | None = None,
    **scoring,
) -> Pruned:
    """Score `model` by `method` on `data` (or take `method` as scores already made), select
    under `budget` and `constraints`, and cut a copy (compensated when asked); `model` is not
    modified. `strategy` defaults to `global` for a share of heads and `budget` for a cost;
    `scoring` goes to score_model (batch_size, seed, ffn, layers, seq_len, normalize)."""
    selection = choose(model, budget, method, constraints, data=data, objective=objective, strategy=strategy, **scoring)
    pruned = copy.deepcopy(model)
    result = cut(pruned, selection, compensation)
    return Pruned(pruned, selection, result)


def choose(
    model: nn.Module,
    budget: Budget,
    method: str | ScoreTable,
    constraints: Constraints = Constraints(),
    *,
    data=None,
    objective: str | None = None,
    strategy: str | None = None,
    **scoring,
) -> Selection:
    """prune_once's score -> select without the cut: what to remove (original indices)."""
    scores = score_model(model, data, method, objective, **scoring) if isinstance(method, str) else method
    chosen = strategy or ("global" if budget.kind == "heads" else "budget")
    return select(scores, chosen, budget=budget, constraints=constraints)
