"""The compensation algorithm as it was before streaming (frozen reference for tests).

Kept verbatim (apart from imports, and the per-token weights and residual targets of the
statistics, which the algorithm gained later; the statistics record and the solvers are the
module's own) so
that tests can prove that the streaming version in
headprune_cli.stages.prune.compensation gives the same weights: for every pruned layer it ran the
whole model twice per batch up to that layer, O(L^2) block forwards.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

from headprune_cli.errors import NumericalError, PlanError, UsageError
from headprune_cli.model.arch import adapter_for
from headprune_cli.model.arch.base import hidden_states_in, is_conv1d, out_rows
from headprune_cli.model.layout import info_of
from headprune_cli.model.surgery import HeadGates, removal_gates, skip_layers
from headprune_cli.names import did_you_mean
from headprune_cli.stages.prune.compensation import (
    DEFAULT_RIDGE,
    METHODS,
    CompensationResult,
    Stats,
    kept_weights,
    linear_weights,
    solve_bias,
    solve_lstsq,
    write_solved,
)
from headprune_cli.stages.refit.streams import token_weights


class _Stop(Exception):
    pass


def _dtype(model):
    return next(model.parameters()).dtype


def compensate_old(
    model: nn.Module,
    remove_heads,
    remove_layers: list[int],
    batches,
    method: str = "lstsq",
    ridge: float = DEFAULT_RIDGE,
    progress=None,
) -> CompensationResult:
    """Adjust output projections of `model` in place for the plan; returns what it did."""
    if method not in METHODS:
        raise UsageError(f"unknown compensation {method!r}{did_you_mean(method, METHODS)}")
    result = CompensationResult(method)
    batches = [{k: v for k, v in b.items() if k != "labels"} for b in batches]
    if method == "none":
        return result
    if not batches:
        raise UsageError("compensation needs calibration data (--data), and none was read")
    layout = info_of(model).layout
    drop = set(remove_layers)
    targets = [l for l in layout.layers if remove_heads.get(l) and l not in drop]
    for layer in targets:  # fail before any compute; apply_plan checks the rest
        unknown = set(remove_heads[layer]) - set(layout.heads[layout.position(layer)])
        if unknown:
            raise PlanError(f"layer {layer}: heads {sorted(unknown)} are not in the model")
    adapter = adapter_for(model)
    blocks = adapter.layer_list(model)
    originals = {layout.position(l): linear_weights(adapter.attention(blocks[layout.position(l)]).o) for l in targets}
    gates = [g.to(_dtype(model)) for g in removal_gates(model, remove_heads)]
    for i, layer in enumerate(targets):
        pos = layout.position(layer)
        view = adapter.attention(blocks[pos])
        kept = [j for j, h in enumerate(layout.heads[pos]) if h not in set(remove_heads[layer])]
        cols = out_rows(kept, view.head_dim)
        has_bias = view.o.bias is not None
        if method == "bias" and not has_bias:
            result.skipped[layer] = "its output projection has no bias (use --compensate lstsq)"
            continue
        stats = _statistics(model, pos, cols, originals, gates, remove_layers, batches, has_bias)
        result.tokens = int(stats.n)
        w0 = kept_weights(view.o, cols)
        solved = solve_bias(stats, w0) if method == "bias" else solve_lstsq(stats, w0, ridge, has_bias)
        result.error_before[layer] = stats.error(w0)
        result.error_after[layer] = stats.error(solved)
        write_solved(view.o, cols, solved, has_bias)
        result.layers.append(layer)
        if progress:
            progress(i + 1, len(targets))
    return result


def _statistics(model, pos, cols, originals, gates, remove_layers, batches, has_bias) -> Stats:
    stats = None
    w_full, b_full = (t.double() if t is not None else None for t in originals[pos])
    for batch in batches:
        with _original_weights(model, originals):
            x_full, h_full = _o_input(model, pos, batch)
        with HeadGates(model, gates), skip_layers(model, remove_layers):
            x_kept, h_pruned = _o_input(model, pos, batch)
        x_kept = x_kept[:, cols]
        # The target: the unpruned residual stream after the addition, less the pruned one before it.
        y = x_full @ w_full.T + (b_full if b_full is not None else 0) + (h_full - h_pruned)
        xa = torch.cat([x_kept, torch.ones(len(x_kept), 1, dtype=x_kept.dtype)], 1) if has_bias else x_kept
        norms = (y * y).sum(1)
        weights = token_weights(norms)  # each token's error relative to its own target
        part = ((xa * weights[:, None]).T @ xa, (xa * weights[:, None]).T @ y, float((weights * norms).sum()), len(xa))
        stats = part if stats is None else tuple(a + b for a, b in zip(stats, part))
    if not torch.isfinite(stats[0]).all() or not torch.isfinite(stats[1]).all():
        raise NumericalError("calibration activations contain NaN or inf")
    return Stats(*stats, has_bias=has_bias)


def _o_input(model: nn.Module, pos: int, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer `pos`'s output-projection input and the block's own input (the residual stream
    the projection adds to) on the batch's real tokens, [tokens, d] float64 each."""
    adapter = adapter_for(model)
    block = adapter.layer_list(model)[pos]
    o = adapter.attention(block).o
    captured = {}

    def block_hook(module, args, kwargs):
        captured["h"] = hidden_states_in(args, kwargs).detach()

    def hook(module, args):
        captured["x"] = args[0].detach()
        raise _Stop

    handles = [block.register_forward_pre_hook(block_hook, with_kwargs=True), o.register_forward_pre_hook(hook)]
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            model(**{k: v.to(device) for k, v in batch.items()})
    except _Stop:
        pass
    finally:
        for handle in handles:
            handle.remove()
    return _tokens(captured["x"], batch), _tokens(captured["h"], batch)


def _tokens(x: torch.Tensor, batch: dict) -> torch.Tensor:
    mask = batch.get("attention_mask")
    if mask is not None and x.dim() == 3 and mask.shape == x.shape[:2]:
        x = x[mask.to(x.device).bool()]
    return x.reshape(-1, x.shape[-1]).double().cpu()


@contextmanager
def _original_weights(model: nn.Module, originals: dict):
    """Temporarily put the unpruned output-projection weights back (for Y)."""
    adapter = adapter_for(model)
    blocks = adapter.layer_list(model)
    current = {}
    for pos, (w, b) in originals.items():
        o = adapter.attention(blocks[pos]).o
        current[pos] = linear_weights(o)
        _assign(o, w, b)
    try:
        yield
    finally:
        for pos, (w, b) in current.items():
            _assign(adapter.attention(blocks[pos]).o, w, b)


def _assign(o: nn.Module, w: torch.Tensor, b: torch.Tensor | None) -> None:
    with torch.no_grad():
        o.weight.copy_(w.T if is_conv1d(o) else w)
        if b is not None:
            o.bias.copy_(b)


def count_computed(counts: dict, block) -> None:
    """A forward hook's count of block forwards that computed: the recording forward's
    stand-ins (an instance `forward` that hands the hidden states on) are not counted."""
    if "forward" not in block.__dict__:
        counts["block"] += 1
