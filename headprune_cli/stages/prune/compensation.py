"""Retraining-free compensation: win back quality in seconds, closed form, layer by layer.

Runs on the model *before* the cut, with the plan's heads and FFN neurons gated to 0
(gating equals removal exactly), and rewrites only the kept columns and bias
of each pruned layer's output projection (heads cut) and down projection (FFN neurons
cut); `surgery.apply_plan` then cuts the removed columns away.

For pruned layer l, in order, on calibration tokens (padding left out):
  X  = the pruned model's input to the projection: kept head outputs for the output
       projection, kept neurons' activations (after the activation and gating) for the
       down projection; computed with every earlier layer already compensated, dropped
       layers skipped, and (for the down projection) the block's own attention cut and
       compensated, so that error accumulated upstream is corrected too;
  Y  = the unpruned model's output of that projection at layer l (original weights everywhere),
       plus the residual stream it is added to in the unpruned model, less the residual
       stream in the pruned one (R_unpruned - R_pruned; the adapter's `residual_input` says
       where the stream is, None for Gemma 3, whose norms sit between). So the refit puts the
       residual stream after the addition back on the unpruned model's, cancelling what the
       cuts upstream (and dropped layers) left there as far as the kept columns can, not only
       this projection's own loss. On SmolLM2-135M at 0.8 of the FLOPs (the same plan, 256
       rows): perplexity 1.232x of the unpruned model against 1.332x fitting Y alone
       (BENCHMARKS.md, "Residual targets");
Statistics are accumulated in float64 with one weight per token, w_t = 1 / |Y_t|^2:
G = [X 1]^T diag(w) [X 1], C = [X 1]^T diag(w) Y. So every fit minimises each token's
error relative to its own target (what the next LayerNorm or RMSNorm sees), not the total
squared error, which a few tokens with massive activations own: in all-MiniLM-L6-v2's
layer 0, 98.8% of the FFN output's energy is one dimension of the [CLS] token. A plan
that removes the neurons behind it (fisher scores them unimportant, and the cut alone
keeps fidelity) left an unweighted refit chasing that spike with the kept neurons, and
the bias refit spreading its mean over every token: fisher heads+FFN at 0.6 of the FLOPs,
held-out fidelity 86.6 uncompensated, 68.6 unweighted lstsq, 88.9 weighted (BENCHMARKS.md
section 14).

Both models are run block by block, as two streams of hidden states (one per calibration
batch, streams.py) that advance one layer at a time: the unpruned stream
(which gives Y) and the pruned stream (which gives X). Per batch, the recording pass
computes block 0 alone; then every block runs to completion twice (the unpruned stream,
and the pruned stream through the refit weights), and the runs that collect statistics
stop at the refit projection's input: O(L) block forwards, not a whole-model forward per
pruned layer, and only the current layer's hidden states are held, never all layers'.

- `bias` (FLAP-style): add to the bias the (token-weighted) mean of what is now missing,
  b' = sum_t w_t (y_t - x_t W^T) / sum_t w_t, i.e. the removed heads' (or neurons') mean
  contribution plus the mean upstream drift. Projections without a bias (LLaMA-family o_proj and
  down_proj) are left alone with a note (`skipped`, `ffn_skipped`): adding a bias would
  change the architecture the checkpoint rebuilds. transformers' `LlamaConfig(mlp_bias=True)`
  could carry a down-projection bias into a plain LLaMA export, but only for every layer
  and with gate_proj/up_proj biases too (zeros would do); Mistral/Qwen2/Qwen3 configs have
  no such flag, so it is not done.
- `lstsq`: ridge least squares of the kept columns (and bias, when there is one) towards
  Y, shrunk towards the current weights:
  W' = argmin sum_t w_t |[x_t 1] W - y_t|^2 + lam |W - W0|^2, lam = ridge * mean(diag(X^T diag(w) X)).
  Kwon et al.'s mask tuning, one scale per kept column (W' = diag(s) W0), is the special
  case `ffn_fit="diag"`. Measured on all-MiniLM-L6-v2, 50% of every FFN cut by |column| x
  activation RMS, 158 calibration / 159 held-out texts of examples/minilm_text.txt
  (round-four lab notes, section 8), held-out fidelity: none 0.829, bias 0.890,
  diagonal 0.889, lstsq 0.934; on fisher heads+FFN plans the full refit beat the diagonal
  one in 4 of 6 (the same notes, section 14); so `lstsq` refits every kept
  column. A random 50% cut, which removes MiniLM's massive-activation neurons: none 0.727,
  lstsq 0.886, diagonal 0.784, bias 0.768 (unweighted: 0.610, 0.174, 0.102).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch import nn

from headprune_cli.errors import PlanError, UsageError
from headprune_cli.model import filebacked
from headprune_cli.model.arch import adapter_for
from headprune_cli.model.arch.base import HFModule, out_rows
from headprune_cli.model.ffn import current_positions, ffn_cuts, removal_ffn_gates
from headprune_cli.model.layout import info_of
from headprune_cli.model.surgery import HeadGates, NeuronGates, removal_gates
from headprune_cli.names import did_you_mean
from headprune_cli.runtime.device import input_device
from headprune_cli.stages.refit.solve import (  # noqa: F401  (the solvers' home; re-exported for tests)
    Stats,
    kept_weights,
    linear_weights,
    solve_bias,
    solve_diag,
    solve_lstsq,
    write_solved,
)
from headprune_cli.stages.refit.streams import Original, Streams

METHODS = ("none", "bias", "lstsq")
FFN_FITS = ("full", "diag")  # lstsq on the down projection: every kept column, or one scale each
# Measured on all-MiniLM-L6-v2 (taylor, 30%/50% of heads, 64 or 200 calibration texts):
# 1e-3 overfits 64 texts and lowers held-out fidelity; 0.1 improved all four settings. With
# the per-token weights, deep heads+FFN cuts from 158 texts prefer 1 (fisher at 0.6 of the
# FLOPs: 88.9 at 0.1, 92.2 at 1) and 50% FFN cuts 0.1 (0.934 vs 0.933): 0.1 stays.
DEFAULT_RIDGE = 0.1
# The full refit beat the diagonal one on MiniLM's FFN (held-out fidelity 0.934 vs 0.889; the
# module docstring has the setting), at ridge 0.1 as well (1: 0.933).
MEASURED_FFN_FIT = "full"


@dataclass
class CompensationResult:
    method: str
    tokens: int = 0
    layers: list[int] = field(default_factory=list)  # original indices whose output projection was compensated
    skipped: dict[int, str] = field(default_factory=dict)  # original layer -> why its heads were not
    error_before: dict[int, float] = field(default_factory=dict)  # |XW - Y|^2 / |Y|^2 per layer (Y: the target)
    error_after: dict[int, float] = field(default_factory=dict)
    # The same for the FFN down projections of layers whose neurons the plan cuts.
    ffn_layers: list[int] = field(default_factory=list)
    ffn_skipped: dict[int, str] = field(default_factory=dict)
    ffn_error_before: dict[int, float] = field(default_factory=dict)
    ffn_error_after: dict[int, float] = field(default_factory=dict)
    rewritten: list[str] = field(default_factory=list)  # state-dict names of the tensors written in place


@dataclass
class _Fit:
    """One projection to refit: its kept input features and where to record the outcome."""

    layer: int
    part: str  # "attention" | "ffn"
    kept: torch.Tensor  # kept input-feature positions of the projection, as it is now


def compensate(
    model: nn.Module,
    remove_heads: Mapping[int, list[int]],
    remove_layers: list[int],
    batches: Iterable[dict],
    method: str = "lstsq",
    ridge: float = DEFAULT_RIDGE,
    progress: Callable[[int, int], None] | None = None,
    remove_ffn: Mapping[int, list[int]] | None = None,
    ffn_fit: str = MEASURED_FFN_FIT,
    release: bool = False,
) -> CompensationResult:
    """Adjust output and down projections of `model` in place for the plan; returns what it did.

    `remove_ffn`: original layer -> original FFN neurons removed. `ffn_fit` (lstsq only):
    "full" refits every kept down-projection column, "diag" one scale per kept neuron.
    `release`: `model` was loaded with load(per_tensor=True) and not changed since; each
    block's weights go back to the file once both streams have passed it, the refit
    projections excepted (model/filebacked.py), so about one block is resident at a time."""
    if method not in METHODS:
        raise UsageError(f"unknown compensation {method!r}{did_you_mean(method, METHODS)}")
    if ffn_fit not in FFN_FITS:
        raise UsageError(f"unknown FFN fit {ffn_fit!r}{did_you_mean(ffn_fit, FFN_FITS)}")
    result = CompensationResult(method)
    device = input_device(model)
    batches = [{k: v.to(device) for k, v in b.items() if k != "labels"} for b in batches]
    if method == "none":
        return result
    if not batches:
        raise UsageError("compensation needs calibration data (--data), and none was read")
    layout = info_of(model).layout
    adapter = adapter_for(model)
    blocks = adapter.layer_list(model)
    fits = _planned_fits(model, remove_heads, remove_layers, remove_ffn)
    if method == "bias":
        fits = [
            f
            for f in fits
            if not _skipped_for_bias(f, _projection(adapter, blocks[layout.position(f.layer)], f), result)
        ]
    if not fits:
        return result
    streams = _streams_for(model, fits, remove_heads, remove_ffn)
    neuron_gates = NeuronGates(model, streams.ffn_gates) if streams.ffn_gates else nullcontext()
    with torch.no_grad(), HeadGates(model, streams.head_gates), neuron_gates:
        streams.record(batches)
        _fit_in_order(streams, fits, set(remove_layers), method, ridge, ffn_fit, result, progress, release)
    return result


def _streams_for(model: nn.Module, fits: list[_Fit], remove_heads, remove_ffn) -> Streams:
    """The two streams, with the plan's gates in each projection's device and dtype; they run
    as far as the last block with a fit."""
    layout = info_of(model).layout
    adapter = adapter_for(model)
    blocks = adapter.layer_list(model)
    head_removal = [_like(g, adapter.attention(b).o) for g, b in zip(removal_gates(model, remove_heads), blocks)]
    ffn_removal = None
    if any(f.part == "ffn" for f in fits):  # remove_ffn is valid here: ffn_cuts checked it
        removed = {int(k): [int(n) for n in v] for k, v in remove_ffn.items()}
        ffn_removal = [_like(g, adapter.ffn(b).down) for g, b in zip(removal_ffn_gates(model, removed), blocks)]
    return Streams(model, blocks, layout.position(fits[-1].layer), head_removal, ffn_removal)


def _fit_in_order(
    streams: Streams,
    fits: list[_Fit],
    drop: set[int],
    method: str,
    ridge: float,
    ffn_fit: str,
    result: CompensationResult,
    progress,
    release: bool = False,
) -> None:
    """One pass over the depth: each block's fits (heads, then FFN), then both streams move on
    (and, with `release`, the block's weights that were not refit go back to the file)."""
    layout = info_of(streams.model).layout
    names = {id(m): n for n, m in streams.model.named_modules()}
    done = 0
    for pos in range(streams.last + 1):
        layer = layout.layers[pos]
        here = [f for f in fits if f.layer == layer]
        rewritten: list[Original] = []
        for k, fit in enumerate(here):
            _fit_projection(
                streams, pos, fit, method, ridge, ffn_fit, result, rewritten, advance_full=k == len(here) - 1
            )
            done += 1
            if progress:
                progress(done, len(fits))
        if here:
            streams.advance(pos, full=False)  # the pruned stream, through the new weights
        else:
            streams.advance(pos, pruned=layer not in drop)
        written = [_projection(adapter_for(streams.model), streams.blocks[pos], f) for f in here]
        result.rewritten += [f"{names[id(o)]}.{n}" for o in written for n, _ in o.named_parameters()]
        if release:  # no stream runs this block again
            filebacked.release(streams.blocks[pos], keep=[p for o in written for p in o.parameters()])


def _planned_fits(model: nn.Module, remove_heads, remove_layers: list[int], remove_ffn) -> list[_Fit]:
    """Every projection the plan asks to refit, in block order (attention before FFN
    within a block); refuses unknown heads and a bad `remove_ffn` before any compute."""
    layout = info_of(model).layout
    adapter = adapter_for(model)
    blocks = adapter.layer_list(model)
    drop = set(remove_layers)
    neurons = ffn_cuts(model, remove_ffn, remove_layers)  # validates the whole remove_ffn
    fits = []
    for pos, layer in enumerate(layout.layers):
        if remove_heads.get(layer) and layer not in drop:
            removed = set(remove_heads[layer])
            unknown = removed - set(layout.heads[pos])
            if unknown:
                raise PlanError(f"layer {layer}: heads {sorted(unknown)} are not in the model")
            kept = [j for j, h in enumerate(layout.heads[pos]) if h not in removed]
            fits.append(_Fit(layer, "attention", out_rows(kept, adapter.attention(blocks[pos]).head_dim)))
        if layer in neurons:
            fits.append(
                _Fit(layer, "ffn", torch.tensor(current_positions(layout, layer, neurons[layer]), dtype=torch.long))
            )
    return fits


def _fit_projection(
    streams: Streams,
    pos: int,
    fit: _Fit,
    method: str,
    ridge: float,
    ffn_fit: str,
    result: CompensationResult,
    rewritten: list[Original],
    advance_full: bool,
) -> None:
    """Solve for the kept columns of one projection of block `pos` and write them in place
    (its original weights join `rewritten`, for the unpruned run of the block's next fit)."""
    ffn = fit.part == "ffn"
    adapter = adapter_for(streams.model)
    o = _projection(adapter, streams.blocks[pos], fit)
    has_bias = o.bias is not None
    residual = adapter.residual_input(streams.blocks[pos], fit.part)
    stats = streams.statistics(
        pos, o, fit.kept, has_bias, advance_full=advance_full, rewritten=rewritten, residual=residual
    )
    result.tokens = int(stats.n)
    w0 = kept_weights(o, fit.kept)
    if method == "bias":
        solved = solve_bias(stats, w0)
    elif ffn and ffn_fit == "diag":
        solved = solve_diag(stats, w0, ridge, has_bias)
    else:
        solved = solve_lstsq(stats, w0, ridge, has_bias)
    (result.ffn_error_before if ffn else result.error_before)[fit.layer] = stats.error(w0)
    (result.ffn_error_after if ffn else result.error_after)[fit.layer] = stats.error(solved)
    if not advance_full:
        rewritten.append(Original.of(o))
    write_solved(o, fit.kept, solved, has_bias)
    (result.ffn_layers if ffn else result.layers).append(fit.layer)


def _projection(adapter, block: nn.Module, fit: _Fit) -> nn.Module:
    return adapter.ffn(block).down if fit.part == "ffn" else adapter.attention(block).o


def _skipped_for_bias(fit: _Fit, o: nn.Module, result: CompensationResult) -> bool:
    """`bias` on a projection without one: noted and left alone, the architecture unchanged."""
    if o.bias is not None:
        return False
    what = "its FFN down projection" if fit.part == "ffn" else "its output projection"
    (result.ffn_skipped if fit.part == "ffn" else result.skipped)[fit.layer] = (
        f"{what} has no bias (use --compensate lstsq)"
    )
    return True


def _like(gate: torch.Tensor, module: HFModule) -> torch.Tensor:
    """A gate in the projection's device and dtype (a float32 gate would upcast bf16 inputs)."""
    return gate.to(device=module.weight.device, dtype=module.weight.dtype)
