"""obs: structured Optimal Brain Surgeon scores, the units that `prune --data`'s refit repairs best.

`prune --data` refits the kept columns of every cut output projection and down projection
by least squares. Scores that assume no refit (fisher, taylor) can remove a unit whose work
the kept ones could have taken over, and keep one they could not. obs scores with the
refit in mind (ZipLM, Kurtic et al. 2023; SlimGPT, Ling et al. 2024): per layer and
projection, obs_greedy.py removes one group at a time, the one whose removal the optimal
refit of the rest repairs best, and records the layer's error after each step. Groups are
the units `select` removes by default: one FFN neuron (a down-projection column), one KV
group of query heads for grouped-query attention (its heads' columns of the output
projection; select's default `--gqa-unit group`), one head otherwise.

Statistics are those of the refit itself, from prune's streams (stages/refit/streams.py) on
a plan that removes nothing: X = the projection's input, with every token weighted by
1 / |Y_t|^2 as the refit weighs it, so the error is the mean over tokens of each token's
squared error relative to its own output (`relative`). How errors compare across layers
(`obs_norm`): `relative` as is; `output` times the layer's mean |Y_t|^2 (the squared error
added to the residual stream); `residual` times mean |Y_t|^2 / mean |h_t|^2, h the residual
stream entering the block (the error as the next RMSNorm/LayerNorm sees it).

Scores (`obs_score`): `cumulative` gives a unit the layer's error after its removal (so a
threshold keeps a prefix of every layer's order); `marginal` the error its step added,
raised where needed to just above the previous step's, so that select's budget
greedy, which sums a layer's removed scores, pays about the layer's refit error and takes
the steps with the least error per FLOP saved across layers. Higher = more important. A
head's score is its group's divided by the heads in the group (a group sums to its score).
Either way the scores rise strictly along the order in float32, the precision the artifact
keeps, so sorting them gives the order back.
With `--gqa-unit head` the heads of one group tie. Projection biases (BERT, GPT-2), which
the refit also fits, are not modelled: the errors are upper bounds there.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from headprune_cli.errors import UsageError
from headprune_cli.model.arch import adapter_for
from headprune_cli.model.arch.base import hidden_states_in, is_conv1d
from headprune_cli.model.surgery import removal_gates
from headprune_cli.names import did_you_mean
from headprune_cli.stages.refit.solve import Stats, kept_weights
from headprune_cli.stages.refit.streams import Streams
from headprune_cli.stages.score.importance.context import ScoreContext
from headprune_cli.stages.score.importance.obs_greedy import greedy_order
from headprune_cli.stages.score.importance.protocol import Importance

NORMS = ("relative", "output", "residual")
SCORES = ("cumulative", "marginal")
DEFAULT_NORM = "relative"
DEFAULT_SCORE = "cumulative"
DEFAULT_DAMP = 0.1  # prune's default ridge (prune.compensation.DEFAULT_RIDGE), the refit's own


class Obs(Importance):
    name = "obs"

    def __init__(self, obs_norm: str = DEFAULT_NORM, obs_score: str = DEFAULT_SCORE, obs_damp: float = DEFAULT_DAMP):
        for value, choices, flag in ((obs_norm, NORMS, "--obs-norm"), (obs_score, SCORES, "--obs-score")):
            if value not in choices:
                raise UsageError(f"{flag}: unknown {value!r}{did_you_mean(value, choices)}")
        if not obs_damp >= 0:
            raise UsageError(f"--obs-damp must be at least 0 (got {obs_damp})")
        self.norm, self.score, self.damp = obs_norm, obs_score, obs_damp

    def settings(self) -> dict[str, Any]:
        return {"obs_norm": self.norm, "obs_score": self.score, "obs_damp": self.damp}

    def heads(self, ctx: ScoreContext) -> list[torch.Tensor]:
        return _scores(ctx, self)["heads"]

    def neurons(self, ctx: ScoreContext) -> list[torch.Tensor]:
        return _scores(ctx, self)["neurons"]


def _scores(ctx: ScoreContext, obs: Obs) -> dict[str, list[torch.Tensor]]:
    """Head and neuron scores of every kept layer, from one pass of the streams (cached on ctx)."""
    key = ("obs", obs.norm, obs.score, obs.damp)
    if key in ctx.cache:
        return ctx.cache[key]
    adapter = adapter_for(ctx.model)
    blocks = adapter.layer_list(ctx.model)
    scale = _scales(ctx, obs.norm)
    out: dict[str, list[torch.Tensor]] = {"heads": [], "neurons": []}
    for pos, attention, ffn in _projection_stats(ctx):
        view = adapter.attention(blocks[pos])
        per_unit = view.group_size if view.group_size > 1 else 1
        unit = _unit_scores(attention, view.o, per_unit * view.head_dim, obs, scale["o"][pos])
        out["heads"].append((unit / per_unit).repeat_interleave(per_unit))
        if ffn is not None:
            out["neurons"].append(_unit_scores(ffn, adapter.ffn(blocks[pos]).down, 1, obs, scale["down"][pos]))
    ctx.cache[key] = out
    return out


def _unit_scores(stats: Stats, module, group: int, obs: Obs, scale: float) -> torch.Tensor:
    """One score per group of `group` consecutive input features of `module`, in feature order."""
    weight = kept_weights(module, torch.arange(_width(module)))[0]  # [in, out], float64 on the CPU
    greedy = greedy_order(stats.gram, weight, group, obs.damp)
    errors = torch.tensor(greedy.errors, dtype=torch.float64) * (scale / max(stats.yy, 1e-300))
    if obs.score == "marginal":
        errors = torch.diff(errors, prepend=errors.new_zeros(1))
    scores = torch.empty(len(greedy.order), dtype=torch.float64)
    scores[torch.tensor(greedy.order)] = _rising(errors)
    return scores


def _rising(steps: torch.Tensor) -> torch.Tensor:
    """Each value strictly above the one before, in float32 (what the artifact stores neuron
    scores in): select sorts a layer's units by score, so the greedy order must survive the
    sort, and ties would go by index."""
    out = steps.float()
    up = out.new_tensor(float("inf"))
    for k in range(1, len(out)):
        if out[k] <= out[k - 1]:
            out[k] = torch.nextafter(out[k - 1], up)
    return out.double()


def _width(module) -> int:
    """Input features of a Linear ([out, in]) or a GPT-2 Conv1D ([in, out])."""
    return module.weight.shape[0 if is_conv1d(module) else 1]


def _projection_stats(ctx: ScoreContext) -> Iterator[tuple[int, Stats, Stats | None]]:
    """Per block: the refit's statistics of its output projection and (with --ffn) its down
    projection, every input feature kept, summed over the calibration batches of every process."""
    adapter = adapter_for(ctx.model)
    blocks = adapter.layer_list(ctx.model)
    batches = [{k: v for k, v in b.items() if k != "labels"} for _, _, b in ctx.my_batches("scoring (OBS statistics)")]
    streams = Streams(ctx.model, blocks, len(blocks) - 1, removal_gates(ctx.model, {}), None)
    with torch.no_grad():
        streams.record(batches)
        for pos, block in enumerate(blocks):
            o = adapter.attention(block).o
            attention = streams.statistics(pos, o, torch.arange(_width(o)), False, advance_full=not ctx.ffn)
            ffn = None
            if ctx.ffn:
                down = adapter.ffn(block).down
                ffn = streams.statistics(pos, down, torch.arange(_width(down)), False, advance_full=True)
            streams.advance(pos, full=False)
            yield pos, _reduced(ctx, attention), (_reduced(ctx, ffn) if ffn is not None else None)


def _reduced(ctx: ScoreContext, stats: Stats) -> Stats:
    """The Gram and output energy summed over torchrun processes (identity for one)."""
    gram, yy = ctx.reduce([stats.gram, torch.tensor([stats.yy], dtype=torch.float64)])
    return Stats(gram, stats.cross, float(yy[0]), stats.n, stats.has_bias)


def _scales(ctx: ScoreContext, norm: str) -> dict[str, list[float]]:
    """Per layer and projection, the factor that puts its relative error on the `norm` scale."""
    layers = len(ctx.layout.layers)
    if norm == "relative":
        return {"o": [1.0] * layers, "down": [1.0] * layers}
    energy = _energies(ctx)
    out: dict[str, list[float]] = {}
    for side in ("o", "down"):
        output = energy[side]
        out[side] = output if norm == "output" else [y / max(h, 1e-300) for y, h in zip(output, energy["residual"])]
    return out


def _energies(ctx: ScoreContext) -> dict[str, list[float]]:
    """Mean over real tokens of |Y_t|^2 for every output and down projection's output, and of
    |h_t|^2 for the residual stream entering every block: one forward pass."""
    adapter = adapter_for(ctx.model)
    blocks = adapter.layer_list(ctx.model)
    sums = {key: torch.zeros(len(blocks), dtype=torch.float64) for key in ("o", "down", "residual")}
    mask: dict[str, torch.Tensor] = {}

    def add(key: str, pos: int, x: torch.Tensor) -> None:
        x = x.detach().double()
        real = mask["m"].to(x.device) if x.dim() == 3 and mask["m"].shape == x.shape[:2] else torch.ones(x.shape[:-1])
        sums[key][pos] += float(((x * x).sum(-1) * real.to(x.device)).sum())

    def block_hook(pos: int):
        return lambda module, args, kwargs: add("residual", pos, hidden_states_in(args, kwargs))

    def out_hook(key: str, pos: int):
        return lambda module, args, output: add(key, pos, output)

    handles = [b.register_forward_pre_hook(block_hook(p), with_kwargs=True) for p, b in enumerate(blocks)]
    handles += [adapter.attention(b).o.register_forward_hook(out_hook("o", p)) for p, b in enumerate(blocks)]
    if ctx.ffn:
        handles += [adapter.ffn(b).down.register_forward_hook(out_hook("down", p)) for p, b in enumerate(blocks)]
    tokens = torch.zeros(1, dtype=torch.float64)
    try:
        with torch.no_grad():
            for _, _, batch in ctx.my_batches("scoring (OBS output energies)"):
                mask["m"] = batch["attention_mask"].double()
                tokens += float(mask["m"].sum())
                ctx.model(**{k: v for k, v in batch.items() if k != "labels"})
    finally:
        for handle in handles:
            handle.remove()
    flat = ctx.reduce([tokens, sums["o"], sums["down"], sums["residual"]])
    n = max(float(flat[0][0]), 1.0)
    return {key: (t / n).tolist() for key, t in zip(("o", "down", "residual"), flat[1:])}
