"""Candidates judged after the compensation `prune --compensate` will apply, solved cheaply.

`prune --compensate bias|lstsq` refits the kept columns of every cut output projection
(heads) and down projection (FFN neurons) towards the unpruned model's output of that
projection plus the residual stream's drift there (prune/compensation.py). Re-running that
per candidate would cost a calibration pass each. Here the statistics are collected once,
with the unpruned model, over every input feature of every projection the search may cut:
G = [X 1]^T diag(w) [X 1], C = [X 1]^T diag(w) Y with Y the projection's own output and
w_t = 1 / |Y_t|^2 (the same per-token weights prune uses, its target being Y here). A
candidate's kept features K select a sub-block, G[K, K] and C[K], and the same closed forms
(refit/solve.py) give its weights: a small linear solve per cut projection, cached per
(projection, kept features) since a move changes one or two layers.

The one approximation: prune takes X from the pruned model, with every earlier layer already
cut and compensated, and adds to Y the residual stream's drift, so it also corrects error that
accumulates upstream; here X is the unpruned model's and there is no drift to correct (Kwon et
al. and ZipLM judge their candidates the same way). The shipped
cut is therefore at least as well compensated as the judged one, layer by layer.

Memory: one (d+1)^2 float64 Gram matrix per projection: 0.9 MB per attention projection and
19 MB per FFN of all-MiniLM-L6-v2; about 1.6 GB per layer of an 8 B model's FFN, which is why
FFN statistics are collected only when the search cuts FFN neurons.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from headprune_cli.errors import NumericalError, UsageError
from headprune_cli.model.arch import adapter_for
from headprune_cli.model.arch.base import HFModule, out_rows
from headprune_cli.model.ffn import current_positions, ffn_cuts
from headprune_cli.model.layout import info_of
from headprune_cli.runtime.device import input_device
from headprune_cli.stages.refit.solve import Stats, kept_weights, linear_weights, solve_bias, solve_lstsq, write_solved
from headprune_cli.stages.refit.streams import token_weights

CACHE_SIZE = 64  # solved projections kept (a MiniLM FFN's is 2.4 MB in float32)


@dataclass
class _Projection:
    """One projection the search may cut, with its statistics over all of its input features."""

    module: HFModule
    gram: torch.Tensor  # [d+1, d+1] float64, the last row/column the constant 1
    cross: torch.Tensor  # [d+1, out]
    yy: float
    tokens: int
    weight: torch.Tensor  # the original weight and bias, to put back after each candidate
    bias: torch.Tensor | None

    def stats(self, cols: torch.Tensor) -> Stats:
        has_bias = self.module.bias is not None
        d = len(self.gram) - 1
        index = torch.cat([cols, torch.tensor([d])]) if has_bias else cols
        return Stats(self.gram[index][:, index], self.cross[index], self.yy, self.tokens, has_bias)

    def restore(self) -> None:
        with torch.no_grad():
            self.module.weight.copy_(self.weight)
            if self.bias is not None:
                self.module.bias.copy_(self.bias)


class Refit:
    """`applied(plan)`: the model's cut projections hold the plan's compensated weights for a while."""

    def __init__(self, model: nn.Module, batches: list[dict], method: str, ridge: float, ffn: bool):
        if method not in ("bias", "lstsq"):
            raise UsageError(f"search judges after bias or lstsq compensation, not {method!r}")
        if not batches:
            raise UsageError(f"--compensate {method} needs calibration rows to collect statistics from")
        self.model, self.method, self.ridge = model, method, ridge
        self.layout = info_of(model).layout
        adapter = adapter_for(model)
        blocks = adapter.layer_list(model)
        self.head_dims = [adapter.attention(b).head_dim for b in blocks]
        modules = {(layer, "attention"): adapter.attention(b).o for layer, b in zip(self.layout.layers, blocks)}
        if ffn:
            modules |= {(layer, "ffn"): adapter.ffn(b).down for layer, b in zip(self.layout.layers, blocks)}
        if method == "bias":  # prune leaves a projection without a bias alone (no architecture change)
            modules = {k: m for k, m in modules.items() if m.bias is not None}
        self.projections = _collect(model, modules, batches)
        self._solved: OrderedDict = OrderedDict()

    @contextmanager
    def applied(
        self, remove_heads: Mapping[int, list[int]], remove_layers: list[int], remove_ffn: Mapping[int, list[int]]
    ) -> Iterator[None]:
        written = []
        try:
            for key, cols in self._cut_columns(remove_heads, remove_layers, remove_ffn):
                projection = self.projections[key]
                written.append(projection)
                weight, bias = self._solution(key, cols)
                write_solved(projection.module, cols, (weight, bias), bias is not None)
            yield
        finally:
            for projection in written:
                projection.restore()

    def _cut_columns(self, remove_heads, remove_layers, remove_ffn) -> Iterator[tuple[tuple[int, str], torch.Tensor]]:
        """(projection key, its kept input features) of every projection the plan cuts."""
        drop = set(remove_layers)
        for pos, layer in enumerate(self.layout.layers):
            removed = set(remove_heads.get(layer, []))
            if removed and layer not in drop and (layer, "attention") in self.projections:
                kept = [j for j, h in enumerate(self.layout.heads[pos]) if h not in removed]
                yield (layer, "attention"), out_rows(kept, self.head_dims[pos])
        for layer, keep in ffn_cuts(self.model, remove_ffn, remove_layers).items():
            if (layer, "ffn") in self.projections:
                yield (layer, "ffn"), torch.tensor(current_positions(self.layout, layer, keep), dtype=torch.long)

    def _solution(self, key: tuple[int, str], cols: torch.Tensor):
        """The kept columns' solved (weight [d, out], bias), from the cache when this cut was solved before."""
        cache_key = (key, tuple(cols.tolist()))
        if cache_key in self._solved:
            self._solved.move_to_end(cache_key)
            return self._solved[cache_key]
        projection = self.projections[key]
        stats = projection.stats(cols)
        w0 = kept_weights(projection.module, cols)
        weight, bias = (
            solve_bias(stats, w0) if self.method == "bias" else solve_lstsq(stats, w0, self.ridge, stats.has_bias)
        )
        dtype = projection.module.weight.dtype
        solved = (weight.to(dtype), bias.to(dtype) if bias is not None else None)
        self._solved[cache_key] = solved
        if len(self._solved) > CACHE_SIZE:
            self._solved.popitem(last=False)
        return solved


def _collect(model: nn.Module, modules: dict, batches: list[dict]) -> dict[tuple[int, str], _Projection]:
    """One forward of the unpruned model per batch; every projection's statistics on its real tokens."""
    sums: dict = {}
    mask: dict = {}

    def hook(key, module):
        weight, raw_bias = linear_weights(module)
        weight = weight.double()
        bias = raw_bias.double() if raw_bias is not None else None

        def record(_, args):
            x = args[0].detach()
            m = mask.get("now")
            if m is not None and x.dim() == 3 and m.shape == x.shape[:2]:
                x = x[m.to(x.device).bool()]
            x = x.reshape(-1, x.shape[-1]).double()
            y = x @ weight.to(x.device).T + (bias.to(x.device) if bias is not None else 0)
            norms = (y * y).sum(1)
            w = token_weights(norms)
            xa = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype, device=x.device)], 1)
            xw = xa * w[:, None]
            part = ((xw.T @ xa).cpu(), (xw.T @ y).cpu(), float((w * norms).sum()), len(xa))
            sums[key] = part if key not in sums else tuple(a + b for a, b in zip(sums[key], part))

        return record

    handles = [m.register_forward_pre_hook(hook(key, m)) for key, m in modules.items()]
    device = input_device(model)
    try:
        with torch.no_grad():
            for batch in batches:
                mask["now"] = batch.get("attention_mask")
                model(**{k: v.to(device) for k, v in batch.items() if k != "labels"})
    finally:
        for handle in handles:
            handle.remove()
    out = {}
    for key, module in modules.items():
        gram, cross, yy, tokens = sums[key]
        if not torch.isfinite(gram).all() or not torch.isfinite(cross).all():
            raise NumericalError("calibration activations contain NaN or inf")
        bias = module.bias.detach().clone() if module.bias is not None else None
        out[key] = _Projection(module, gram, cross, yy, tokens, module.weight.detach().clone(), bias)
    return out
