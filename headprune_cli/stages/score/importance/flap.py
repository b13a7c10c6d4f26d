"""flap, wanda-sp and minitron: the published activation-based LLM pruning criteria.

All three read the per-channel statistics of channels.py (one forward pass, no labels):
- flap (An et al. 2024, FLAP): the fluctuation of every input channel j of the output and
  down projections, WIFV_j = Var_t(x_{t,j}) * ||W[:, j]||_2^2: how much the channel's
  output moves around its mean (the mean itself can be put back as a bias). As in the
  authors' code, the attention metric is squared, each layer's channels are standardised
  per module ((m - mean) / std over that layer's channels), a head scores the mean of its
  channels, a neuron its own, and units are removed in one global order of standardised
  scores until the parameter budget is met (the "adaptive structure", AL-AM). headprune's
  budget greedy removes the unit with the least score per unit of budget saved, so the
  score written is exp(z) * (the unit's parameters): that greedy then follows FLAP's
  global order of z exactly. FLAP's bias compensation is `prune --compensate bias`
  (projections that have a bias; LLaMA-family ones have none, see prune.compensation).
- wanda-sp (the structured Wanda of the FLAP paper): sum over the unit's weights of
  |W_ij| * ||x_j||_2, mean over output rows as in the authors' code; a head sums its
  channels. (The paper cuts every layer by the same ratio; here the budget greedy places
  the cut.)
- minitron (Muralidharan et al. 2024): activation-based width importance; a head scores
  its output norm ||o_{t,h}||_2, a neuron its |activation| at the down projection's input,
  each averaged over the sequence and then L2-aggregated over the batch (the paper's best
  aggregation). Embedding channels are not scored: headprune does not cut the hidden size.
Statistics come from the unpruned model in one pass (Wanda-sp's code prunes layer by layer
and recomputes the next layer's inputs after each cut; FLAP's does not).
"""

from __future__ import annotations

import torch

from headprune_cli.model.arch import adapter_for
from headprune_cli.stages.score.importance.channels import channel_stats, out_in, variance
from headprune_cli.stages.score.importance.context import ScoreContext
from headprune_cli.stages.score.importance.protocol import Importance


def _views(ctx: ScoreContext):
    adapter = adapter_for(ctx.model)
    blocks = adapter.layer_list(ctx.model)
    return [adapter.attention(b) for b in blocks], [adapter.ffn(b) for b in blocks]


def standardised(metric: torch.Tensor) -> torch.Tensor:
    """(m - mean) / std over one layer's channels (unbiased std, as torch.std in FLAP's code)."""
    std = metric.std()
    return (metric - metric.mean()) / std if std > 0 else torch.zeros_like(metric)


def head_params(view) -> float:
    """Parameters one query head stands for: its Q rows and O columns, and its share of its K/V head."""
    hidden = out_in(view.o).shape[0]
    return float(view.head_dim * hidden * (2 + 2 / view.group_size))


def neuron_params(ffn) -> float:
    return float(out_in(ffn.down).shape[0] * (len(ffn.ups) + 1))


class Flap(Importance):
    name = "flap"

    def heads(self, ctx: ScoreContext) -> list[torch.Tensor]:
        views, _ = _views(ctx)
        stats = channel_stats(ctx)
        out = []
        for view, var in zip(views, variance(stats, "o")):
            metric = (var * out_in(view.o).pow(2).sum(0).to(ctx.device)) ** 2
            z = standardised(metric).reshape(-1, view.head_dim).mean(1)
            out.append(torch.exp(z) * head_params(view))
        return out

    def neurons(self, ctx: ScoreContext) -> list[torch.Tensor]:
        _, ffns = _views(ctx)
        out = []
        for ffn, var in zip(ffns, variance(channel_stats(ctx), "down")):
            z = standardised(var * out_in(ffn.down).pow(2).sum(0).to(ctx.device))
            out.append(torch.exp(z) * neuron_params(ffn))
        return out


def _wanda_channels(module, sq: torch.Tensor) -> torch.Tensor:
    """mean over output rows of |W_ij| * ||x_j||_2, per input channel j."""
    return (out_in(module).abs().to(sq.device) * sq.sqrt()).mean(0)


class WandaSp(Importance):
    name = "wanda-sp"

    def heads(self, ctx: ScoreContext) -> list[torch.Tensor]:
        views, _ = _views(ctx)
        return [
            _wanda_channels(view.o, sq).reshape(-1, view.head_dim).sum(1)
            for view, sq in zip(views, channel_stats(ctx)["o_sq"])
        ]

    def neurons(self, ctx: ScoreContext) -> list[torch.Tensor]:
        _, ffns = _views(ctx)
        return [_wanda_channels(ffn.down, sq) for ffn, sq in zip(ffns, channel_stats(ctx)["down_sq"])]


class Minitron(Importance):
    name = "minitron"

    def heads(self, ctx: ScoreContext) -> list[torch.Tensor]:
        return [s.sqrt() for s in channel_stats(ctx)["head_norm"]]

    def neurons(self, ctx: ScoreContext) -> list[torch.Tensor]:
        return [s.sqrt() for s in channel_stats(ctx)["neuron_abs"]]
