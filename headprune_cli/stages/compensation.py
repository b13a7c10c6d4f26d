"""Retraining-free compensation: win back quality in seconds, closed form, layer by layer.

Runs on the model *before* the cut, with the plan's heads gated to 0 (gating equals
removal exactly), and rewrites only the kept columns and bias of each pruned
layer's output projection; `surgery.apply_plan` then cuts the removed columns away.

For pruned layer l, in order, on calibration tokens (padding left out):
  X  = the pruned model's input to the output projection (kept head outputs), computed
       with every earlier layer already compensated and dropped layers skipped, so that
       error accumulated upstream is corrected too;
  Y  = the unpruned model's output projection at layer l (original weights everywhere).
Statistics are accumulated in float64: G = [X 1]^T [X 1], C = [X 1]^T Y.

Both models are run block by block, as two streams of hidden states (one per calibration
batch) that advance one layer at a time: the unpruned stream (which gives Y) and the
pruned stream (gated, dropped layers skipped, earlier layers compensated, which gives X).
One forward per batch, stopped after the last pruned layer, first records how the model
calls each block (masks, rotary embeddings: everything but the hidden states). So every
block runs at most four times per batch (O(L) forwards, not a whole-model forward per
pruned layer), and only the current layer's hidden states are held, never all layers'.

- `bias` (FLAP-style): add to the bias the mean of what is now missing,
  b' = (sum Y - sum X W^T) / n, i.e. the removed heads' mean contribution (plus the mean
  upstream drift). Output projections without a bias (LLaMA-family o_proj) are left
  alone with a note: adding a bias would change the architecture the checkpoint rebuilds.
- `lstsq` (Kwon-style mask tuning, in closed form): ridge least squares of the kept
  columns (and bias, when there is one) towards Y, shrunk towards the current weights:
  W' = argmin |[X 1] W - Y|^2 + lam |W - W0|^2, lam = ridge * mean(diag(X^T X)).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from headprune_cli.device import input_device
from headprune_cli.model.arch import adapter_for
from headprune_cli.model.arch.base import is_conv1d, out_rows
from headprune_cli.errors import NumericalError, PlanError, UsageError
from headprune_cli.model.layout import info_of
from headprune_cli.names import did_you_mean
from headprune_cli.model.surgery import HeadGates, removal_gates

METHODS = ("none", "bias", "lstsq")
# Measured on all-MiniLM-L6-v2 (taylor, 30%/50% of heads, 64 or 200 calibration texts):
# 1e-3 overfits 64 texts and lowers held-out fidelity; 0.1 improved all four settings.
DEFAULT_RIDGE = 0.1


@dataclass
class CompensationResult:
    method: str
    tokens: int = 0
    layers: list[int] = field(default_factory=list)  # original indices compensated
    skipped: dict[int, str] = field(default_factory=dict)  # original layer -> why not
    error_before: dict[int, float] = field(default_factory=dict)  # |XW - Y|^2 / |Y|^2 per layer
    error_after: dict[int, float] = field(default_factory=dict)


class _Stop(Exception):
    """Raised from a hook: nothing after the last block we need computing."""


def compensate(
    model: nn.Module,
    remove_heads: Mapping[int, list[int]],
    remove_layers: list[int],
    batches: Iterable[dict],
    method: str = "lstsq",
    ridge: float = DEFAULT_RIDGE,
    progress: Callable[[int, int], None] | None = None,
) -> CompensationResult:
    """Adjust output projections of `model` in place for the plan; returns what it did."""
    if method not in METHODS:
        raise UsageError(f"unknown compensation {method!r}{did_you_mean(method, METHODS)}")
    result = CompensationResult(method)
    device = input_device(model)
    batches = [{k: v.to(device) for k, v in b.items() if k != "labels"} for b in batches]
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
    if not targets:
        return result
    adapter = adapter_for(model)
    blocks = adapter.layer_list(model)
    last = layout.position(targets[-1])
    streams = _Streams(model, blocks, last, removal_gates(model, remove_heads))
    with torch.no_grad(), HeadGates(model, streams.gates):
        streams.record(batches)
        for pos in range(last + 1):
            layer = layout.layers[pos]
            if layer in targets:
                removed = set(remove_heads[layer])
                kept = [j for j, h in enumerate(layout.heads[pos]) if h not in removed]
                _fit_layer(streams, pos, layer, kept, method, ridge, result)
                if progress:
                    progress(len(result.layers) + len(result.skipped), len(targets))
                streams.advance(pos, full=False)  # the pruned stream, through the new weights
            else:
                streams.advance(pos, pruned=layer not in drop)
    return result


def _fit_layer(streams: "_Streams", pos: int, layer: int, kept: list[int], method: str, ridge: float, result) -> None:
    """Solve for the kept columns of layer `pos`'s output projection and write them in place."""
    view = adapter_for(streams.model).attention(streams.blocks[pos])
    cols = out_rows(kept, view.head_dim)
    has_bias = view.o.bias is not None
    if method == "bias" and not has_bias:
        result.skipped[layer] = "its output projection has no bias (use --compensate lstsq)"
        return
    stats = streams.statistics(pos, view.o, cols, has_bias)
    result.tokens = int(stats.n)
    w0 = _kept_weights(view.o, cols)
    solved = _solve_bias(stats, w0) if method == "bias" else _solve_lstsq(stats, w0, ridge, has_bias)
    result.error_before[layer] = stats.error(w0)
    result.error_after[layer] = stats.error(solved)
    _write(view.o, cols, solved, has_bias)
    result.layers.append(layer)


def _on_o(gate: torch.Tensor, o: nn.Module) -> torch.Tensor:
    return gate.to(device=o.weight.device, dtype=o.weight.dtype)


# --- the two streams of hidden states -------------------------------------------------
@dataclass
class _Call:
    """How the model called one block on one batch: everything except the hidden states."""

    args: tuple
    kwargs: dict
    keyword: bool  # the hidden states were passed as hidden_states=...

    def run(self, block: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        if self.keyword:
            out = block(*self.args, hidden_states=hidden, **self.kwargs)
        else:
            out = block(hidden, *self.args, **self.kwargs)
        return out[0] if isinstance(out, (tuple, list)) else out


class _Streams:
    """Per calibration batch: the unpruned and the pruned hidden states entering the current block.

    `gates` is the list HeadGates reads: all ones (x * 1 is exact: the unpruned model), and
    only while the pruned stream runs a block does that block's entry hold the plan's gates."""

    def __init__(self, model: nn.Module, blocks, last: int, removal: list[torch.Tensor]):
        adapter = adapter_for(model)
        self.model, self.blocks, self.last = model, blocks, last
        self.removal = [_on_o(g, adapter.attention(b).o) for g, b in zip(removal, blocks)]
        self.gates = [torch.ones_like(g) for g in self.removal]
        self.calls: list[list[_Call]] = []  # [batch][block position]
        self.masks: list[torch.Tensor | None] = []  # real-token masks, [batch, seq]
        self.full: list[torch.Tensor] = []
        self.pruned: list[torch.Tensor] = []

    def record(self, batches: list[dict]) -> None:
        for batch in batches:
            first, calls = _record_calls(self.model, self.blocks, batch, self.last)
            self.calls.append(calls)
            self.masks.append(batch.get("attention_mask"))
            self.full.append(first)
            self.pruned.append(first)

    def _run_pruned(self, pos: int, i: int) -> torch.Tensor:
        self.gates[pos] = self.removal[pos]
        try:
            return self.calls[i][pos].run(self.blocks[pos], self.pruned[i])
        finally:
            self.gates[pos] = torch.ones_like(self.removal[pos])

    def advance(self, pos: int, full: bool = True, pruned: bool = True) -> None:
        for i, calls in enumerate(self.calls):
            if full:
                self.full[i] = calls[pos].run(self.blocks[pos], self.full[i])
            if pruned:
                self.pruned[i] = self._run_pruned(pos, i)

    def statistics(self, pos: int, o: nn.Module, cols: torch.Tensor, has_bias: bool) -> "_Stats":
        """Advance the unpruned stream through block `pos`, and sum [X 1]^T [X 1], [X 1]^T Y, |Y|^2."""
        stats = None
        w_full, b_full = (t.double() if t is not None else None for t in _weights(o))
        for i, calls in enumerate(self.calls):
            with _captured(o) as seen:
                self.full[i] = calls[pos].run(self.blocks[pos], self.full[i])
                x_full = _real_tokens(seen["x"], self.masks[i])
                self._run_pruned(pos, i)  # only its output-projection input is needed here
                x_kept = _real_tokens(seen["x"], self.masks[i])[:, cols.to(seen["x"].device)]
            y = x_full @ w_full.to(x_full.device).T + (b_full.to(x_full.device) if b_full is not None else 0)
            ones = torch.ones(len(x_kept), 1, dtype=x_kept.dtype, device=x_kept.device)
            xa = torch.cat([x_kept, ones], 1) if has_bias else x_kept
            part = ((xa.T @ xa).cpu(), (xa.T @ y).cpu(), float((y * y).sum()), len(xa))
            stats = part if stats is None else tuple(a + b for a, b in zip(stats, part))
        if not torch.isfinite(stats[0]).all() or not torch.isfinite(stats[1]).all():
            raise NumericalError("calibration activations contain NaN or inf")
        return _Stats(*stats, has_bias=has_bias)


def _record_calls(model: nn.Module, blocks, batch: dict, last: int) -> tuple[torch.Tensor, list[_Call]]:
    """Block 0's hidden-state input and the other arguments of blocks 0..last, from one forward.

    Only arguments are kept (masks, rotary embeddings: shared by most blocks); the hidden
    states each block sees here are dropped, so no layer's activations are held."""
    calls: list[_Call] = []
    first = {}

    def record(module, args, kwargs):
        keyword = not args
        hidden = kwargs["hidden_states"] if keyword else args[0]
        if not calls:
            first["hidden"] = hidden.detach()
        rest = {k: v for k, v in kwargs.items() if k != "hidden_states"}
        calls.append(_Call(tuple(args[1:]), rest, keyword))
        if len(calls) > last:
            raise _Stop

    handles = [blocks[pos].register_forward_pre_hook(record, with_kwargs=True) for pos in range(last + 1)]
    try:
        model(**batch, **_no_cache(model))
    except _Stop:
        pass
    finally:
        for handle in handles:
            handle.remove()
    return first["hidden"], calls


def _no_cache(model: nn.Module) -> dict:
    """A KV cache would grow each time a block is re-run with the recorded arguments."""
    return {"use_cache": False} if getattr(getattr(model, "config", None), "use_cache", None) is not None else {}


@contextmanager
def _captured(o: nn.Module):
    """The input of `o` (after any gate hook), each time it runs inside the block."""
    seen: dict = {}

    def hook(module, args):
        seen["x"] = args[0].detach()

    handle = o.register_forward_pre_hook(hook)
    try:
        yield seen
    finally:
        handle.remove()


def _real_tokens(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """[tokens, d] float64 rows of the tokens the mask marks as real (all when no mask fits)."""
    if mask is not None and x.dim() == 3 and mask.shape == x.shape[:2]:
        x = x[mask.to(x.device).bool()]
    return x.reshape(-1, x.shape[-1]).double()


# --- statistics ---------------------------------------------------------------------
@dataclass
class _Stats:
    gram: torch.Tensor  # [d+1, d+1] (or [d, d] without bias): [X 1]^T [X 1]
    cross: torch.Tensor  # [d(+1), out]: [X 1]^T Y
    yy: float  # sum |Y|^2
    n: int
    has_bias: bool

    def error(self, w: torch.Tensor) -> float:
        """Relative squared error |[X 1] w - Y|^2 / |Y|^2 of stacked weights w [d(+1), out]."""
        w = _stack(w, self.has_bias)
        err = (w * (self.gram @ w)).sum() - 2 * (w * self.cross).sum() + self.yy
        return float(max(err, 0.0) / max(self.yy, 1e-300))


# --- weights: Linear [out, in] or GPT-2 Conv1D [in, out] ----------------------------
def _weights(o: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight as [out, in], bias) copies."""
    w = o.weight.detach().T if is_conv1d(o) else o.weight.detach()
    return w.clone(), (o.bias.detach().clone() if o.bias is not None else None)


def _kept_weights(o: nn.Module, cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    w, b = _weights(o)
    w, b = w.cpu(), (b.cpu() if b is not None else None)  # solved on the CPU, like the statistics
    return w[:, cols].double().T, (b.double() if b is not None else None)  # [d, out], [out]


def _stack(w, has_bias: bool) -> torch.Tensor:
    weight, bias = w
    return torch.cat([weight, bias[None]], 0) if has_bias else weight


def _write(o: nn.Module, cols: torch.Tensor, solved, has_bias: bool) -> None:
    weight, bias = solved
    with torch.no_grad():
        cols = cols.to(o.weight.device)
        if is_conv1d(o):
            o.weight[cols, :] = weight.to(o.weight.device, o.weight.dtype)
        else:
            o.weight[:, cols] = weight.T.to(o.weight.device, o.weight.dtype)
        if has_bias:
            o.bias.copy_(bias.to(o.bias.device, o.bias.dtype))


# --- closed forms ---------------------------------------------------------------------
def _solve_bias(stats: _Stats, w0) -> tuple[torch.Tensor, torch.Tensor]:
    weight, _ = w0
    sum_x, n = stats.gram[-1, :-1], stats.gram[-1, -1]
    return weight, (stats.cross[-1] - sum_x @ weight) / n


def _solve_lstsq(stats: _Stats, w0, ridge: float, has_bias: bool):
    d = w0[0].shape[0]
    lam = ridge * float(torch.diagonal(stats.gram)[:d].mean())
    penalty = torch.zeros(len(stats.gram), dtype=torch.float64)
    penalty[:d] = lam + 1e-12  # the bias row is not shrunk; the tiny floor keeps A invertible
    a = stats.gram + torch.diag(penalty)
    rhs = stats.cross + penalty[:, None] * _stack(w0, has_bias)
    try:
        solved = torch.linalg.solve(a, rhs)
    except torch.linalg.LinAlgError:  # singular (e.g. a constant feature): least-norm answer
        solved = torch.linalg.lstsq(a, rhs, driver="gelsd").solution
    return (solved[:d], solved[d]) if has_bias else (solved, None)
