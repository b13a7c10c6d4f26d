"""Measured latency of one model's parts: every layer at a grid of kept heads and FFN
widths, and the fixed rest.

A layer is timed as its whole block (norms, residuals and all) called on the inputs the
real model gives its first block (captured by a pre-hook, then the forward is cut short).
Each grid point is a *variant* of the block: a copy whose untouched parameters are the
original tensors (no memory) and whose attention (or FFN) is sliced by the family
adapter, exactly as pruning slices it. Attention points keep the full FFN, FFN points the
full attention, so a layer's latency at (k units, w neurons) is A(k) + F(w) - A(all).
Only one layer's variants exist at a time, so profiling costs little more memory than
the loaded model.

Layers with the same shape (block class, query heads, KV heads, FFN width) do the same
work, so by default the first layer of each shape is measured and the others record it as
`measured_as` (a uniform model is measured once); `every_layer` times each on its own.
The rest (embeddings, final norm, task head) is the model's forward with its block list
emptied for the call.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from torch import nn

from headprune_cli.errors import NumericalError
from headprune_cli.model.arch import adapter_for
from headprune_cli.model.arch.base import HFModule, is_conv1d, keep_inputs, keep_outputs
from headprune_cli.model.layout import info_of
from headprune_cli.stages.profile.latency_artifact import LayerPoints
from headprune_cli.stages.timing import Latency, interleaved_samples, measure_interleaved, summarize

if TYPE_CHECKING:
    from headprune_cli.stages.profile.stage import ProfileOptions

RETRIES = 2  # remeasurements of a layer whose points are not monotone beyond their spread
# The whole block anchors both of a layer's curves: every cut is priced as a saving from it,
# so its noise moves every prediction (BENCHMARKS section 16: one noisy full point put a
# table 35% off). It is timed this many times per round, spread from the round's start to
# its end, and the samples are pooled.
FULL_TIMINGS = 3


def grid(total: int, points: int, multiple_of: int = 1) -> list[int]:
    """`points` counts from the smallest allowed to `total`, evenly spaced and rounded to
    multiples of `multiple_of` (the full count is always a point, aligned or not)."""
    low = min(multiple_of, total)
    if points <= 1:
        return [total]
    out = {total, low}
    for i in range(1, points - 1):
        count = round(total * i / (points - 1) / multiple_of) * multiple_of
        out.add(min(max(count, low), total))
    return sorted(out)


class _Captured(Exception):
    """Raised by the capture hook: the rest of the forward is not needed."""


def block_inputs(model: nn.Module, inputs: dict) -> tuple[tuple, dict]:
    """The positional and keyword arguments the model passes to its first block."""
    block = adapter_for(model).layer_list(model)[0]
    seen: dict = {}

    def hook(module, args, kwargs):
        seen.update(args=args, kwargs=kwargs)
        raise _Captured

    handle = block.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.inference_mode():
            model(**inputs)
    except _Captured:
        pass
    finally:
        handle.remove()
    return seen["args"], seen["kwargs"]


def variant(model: nn.Module, block: nn.Module, units: int | None = None, width: int | None = None) -> nn.Module:
    """The block with its first `units` attention units (KV groups, or heads without GQA)
    or its first `width` FFN neurons, cut where the adapter says heads and neurons live.
    Every tensor it does not cut is shared, and a Linear's first output rows are a view of
    the original (as contiguous as the pruned weight): only cut input columns are copies."""
    adapter = adapter_for(model)
    if units is None and width is None:
        return block
    shared = {id(t): t for t in [*block.parameters(), *block.buffers()]}
    copied = copy.deepcopy(block, memo=shared)
    if units is not None:
        view = adapter.attention(copied)
        group = view.group_size
        keep_q, keep_kv = list(range(units * group)), list(range(units))
        for module, side, index in adapter.head_slices(view, keep_q, keep_kv):
            _keep(module, side, index)
        adapter.set_head_counts(view, len(keep_q), len(keep_kv))
    if width is not None:
        for module, side, index in adapter.ffn_slices(adapter.ffn(copied), list(range(width))):
            _keep(module, side, index)
    return copied


def _keep(module: HFModule, side: str, index: torch.Tensor) -> None:
    n = len(index)
    if side == "out" and not is_conv1d(module) and torch.equal(index, torch.arange(n)):
        module.weight = nn.Parameter(module.weight[:n], requires_grad=False)
        if module.bias is not None:
            module.bias = nn.Parameter(module.bias[:n], requires_grad=False)
        module.out_features = n
    else:
        (keep_outputs if side == "out" else keep_inputs)(module, index)


@contextmanager
def without_blocks(model: nn.Module):
    """The model with an empty block list, for as long as the context lasts."""
    adapter = adapter_for(model)
    blocks = adapter.layer_list(model)
    adapter.set_layer_list(model, nn.ModuleList())
    try:
        yield
    finally:
        adapter.set_layer_list(model, blocks)


def outside_call(model: nn.Module, inputs: dict) -> Callable[[], object]:
    def call():
        with without_blocks(model):
            return model(**inputs)

    return call


def shape_of(model: nn.Module, pos: int) -> tuple:
    adapter = adapter_for(model)
    block = adapter.layer_list(model)[pos]
    view = adapter.attention(block)
    return type(block).__name__, view.num_heads, view.num_kv_heads, adapter.ffn(block).width


def measured_layers(model: nn.Module, every_layer: bool) -> dict[int, int]:
    """Block position -> the position whose measurement it uses."""
    first: dict[tuple, int] = {}
    out = {}
    for pos in range(len(adapter_for(model).layer_list(model))):
        key = (pos,) if every_layer else shape_of(model, pos)
        out[pos] = first.setdefault(key, pos)
    return out


def layer_points(
    model: nn.Module,
    pos: int,
    unit_grid: list[int],
    width_grid: list[int],
    call_args,
    settings: ProfileOptions,
    advance,
) -> dict:
    """Attention and FFN points of the block at `pos`; `call_args(block)` gives its call."""
    block = adapter_for(model).layer_list(model)[pos]
    view = adapter_for(model).attention(block)
    cut_units = [("attention", k) for k in unit_grid[:-1]]
    cut_widths = [("ffn", w) for w in width_grid[:-1]]
    whole = [("whole", i) for i in range(FULL_TIMINGS)]
    keys = _spread_among(whole, cut_units + cut_widths)
    # variant() with nothing to cut is the block itself: the "whole" keys time the original
    variants = {
        (kind, n): variant(model, block, units=n if kind == "attention" else None, width=n if kind == "ffn" else None)
        for kind, n in keys
    }
    calls = {key: call_args(v) for key, v in variants.items()}
    samples = interleaved_samples(calls, settings.rounds, settings.warmup, settings.threads, settings.min_time, advance)
    del variants, calls
    timed = {key: summarize(samples[key]) for key in cut_units + cut_widths}
    full = summarize([ms for key in whole for ms in samples[key]])
    timed[("attention", unit_grid[-1])] = timed[("ffn", width_grid[-1])] = (
        full  # the whole block is both curves' last point
    )
    return _points(timed, view.group_size)


def _spread_among(extra: list, keys: list) -> list:
    """`keys` with `extra` placed evenly among them, first and last included."""
    out, last = list(keys), max(len(extra) - 1, 1)
    for i, key in enumerate(extra):
        out.insert(round(i * len(keys) / last) + i, key)
    return out


def steady_points(
    model: nn.Module, pos: int, unit_grid, width_grid, call_args, settings: ProfileOptions, advance
) -> dict:
    """layer_points, measured again (with twice the rounds) while more units take less time
    than fewer beyond the spread: a busy machine's drift. Refuses after RETRIES."""

    for attempt in range(RETRIES + 1):
        points = layer_points(
            model,
            pos,
            unit_grid,
            width_grid,
            call_args,
            settings.model_copy(update={"rounds": settings.rounds * 2**attempt}),
            advance,
        )
        problem = LayerPoints.problem(points)
        if problem is None:
            return points
    raise NumericalError(
        f"layer {info_of(model).layout.layers[pos]}: {problem} after {RETRIES + 1} tries; the machine is too busy "
        f"to measure: profile on a quiet machine, or with more --rounds and --min-time"
    )


def _points(timed: dict[tuple, Latency], group: int) -> dict:
    attention = [
        {"units": k, "heads": k * group, **timed[("attention", k)].spread()}
        for kind, k in sorted(timed)
        if kind == "attention"
    ]
    ffn = [{"width": w, **timed[("ffn", w)].spread()} for kind, w in sorted(timed) if kind == "ffn"]
    return {"attention": attention, "ffn": ffn}


def profile_phase(
    model: nn.Module,
    inputs: dict,
    call_args_for,
    grids: Callable[[int], tuple[list[int], list[int]]],
    settings: ProfileOptions,
    advance=lambda: None,
) -> dict:
    """The outside and every layer of one phase. `call_args_for(args, kwargs)` turns the
    captured block inputs into `call(block) -> callable`; `grids(pos)` gives (units, widths)."""
    args, kwargs = block_inputs(model, inputs)
    call_args = call_args_for(args, kwargs)
    layout = info_of(model).layout
    outside = measure_interleaved(
        {"outside": outside_call(model, inputs)},
        settings.rounds,
        settings.warmup,
        settings.threads,
        settings.min_time,
        advance,
    )["outside"]
    layers: dict[str, dict] = {}
    shared = measured_layers(model, settings.every_layer)
    for pos, source in shared.items():
        layer = layout.layers[pos]
        if source == pos:
            units, widths = grids(pos)
            layers[str(layer)] = {
                "measured_as": layer,
                **steady_points(model, pos, units, widths, call_args, settings, advance),
            }
        else:
            layers[str(layer)] = {**layers[str(layout.layers[source])], "measured_as": layout.layers[source]}
    return {"outside": outside.spread(), "layers": layers}


def plain_call(args: tuple, kwargs: dict):
    """A prefill/encoder block call: the captured inputs as they were."""
    return lambda block: lambda: block(*args, **kwargs)
