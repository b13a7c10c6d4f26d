"""`profile`'s work: load, place, measure each phase, and assemble the latency artifact."""

from __future__ import annotations

import platform
from pathlib import Path

import torch
from torch import nn

from headprune_cli.artifacts.schema import envelope, input_ref
from headprune_cli.errors import UsageError
from headprune_cli.model.arch import adapter_for
from headprune_cli.model.layout import info_of
from headprune_cli.runtime.device import input_device, place, stored_dtype_name
from headprune_cli.stages.model_latency import synthetic_inputs
from headprune_cli.stages.profile import measure
from headprune_cli.stages.profile.decode import decode_inputs, frozen_call
from headprune_cli.stages.profile.latency_artifact import LatencyTableArtifact

DEFAULT_SEQ_LEN = 128
CONFIG_KEYS = (
    "device",
    "dtype",
    "batch_size",
    "seq_len",
    "threads",
    "points",
    "multiple_of",
    "ffn_multiple_of",
    "context",
    "rounds",
    "warmup",
    "min_time",
    "every_layer",
)


def profile_checkpoint(opts, advance=lambda total=None: None) -> tuple[dict, LatencyTableArtifact]:
    """(the latency artifact to write, the same read back as the schema reads it)."""
    from headprune_cli.model.checkpoint import load  # noqa: PLC0415 (keeps numpy out of this module's import)

    model = load(opts.model)
    placement = place(model, opts.device, opts.dtype)
    seq = opts.seq_len or min(DEFAULT_SEQ_LEN, adapter_for(model).max_positions(model) or DEFAULT_SEQ_LEN)
    settings = opts  # the timing reads the profile options themselves
    inputs, seq = synthetic_inputs(model, opts.batch_size, seq)
    inputs = {k: v.to(input_device(model)) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    grids = lambda pos: layer_grids(model, pos, opts.points, opts.multiple_of, opts.ffn_multiple_of)  # noqa: E731
    advance(total=ticks(model, settings, grids, 1 + (opts.context is not None)))
    phases = {"forward": measure.profile_phase(model, inputs, measure.plain_call, grids, settings, advance)}
    if opts.context is not None:
        phases["decode"] = decode_phase(model, opts, settings, grids, advance)
    config = {key: getattr(opts, key) for key in CONFIG_KEYS}
    artifact = {
        **envelope("latency", [input_ref("model", opts.model, info_of(model).source_sha)], config),
        "device": device_facts(placement.device),
        "torch_version": torch.__version__,
        "threads": opts.threads,
        "batch": opts.batch_size,
        "seq_len": seq,
        "dtype": stored_dtype_name(model),
        "model": model_shape(model),
        "grid": {"points": opts.points, "multiple_of": opts.multiple_of, "ffn_multiple_of": opts.ffn_multiple_of},
        "timing": {
            "harness": "torch.utils.benchmark.Timer.blocked_autorange",
            "rounds": opts.rounds,
            "warmup": opts.warmup,
            "min_time": opts.min_time,
            "order": "interleaved, alternating",
            "layers": "every layer" if opts.every_layer else "first layer of each shape",
        },
        "phases": phases,
    }
    return artifact, LatencyTableArtifact.model_validate(artifact)  # a table we cannot read back must never be written


def decode_phase(model: nn.Module, opts, settings, grids, advance) -> dict:

    limit = adapter_for(model).max_positions(model)
    if limit is not None and opts.context + 1 > limit:
        raise UsageError(
            f"--context {opts.context}: the model takes at most {limit} positions (context + the new token)"
        )
    step, rest = decode_inputs(model, opts.batch_size, opts.context, input_device(model))
    args, kwargs = measure.block_inputs(model, step)
    del step  # the prefill's cache: each variant reads its own frozen one
    phase = measure.profile_phase(
        model, rest, lambda a, k: frozen_call(model, opts.context)(args, kwargs), grids, settings, advance
    )
    return {"context": opts.context, **phase}


def layer_grids(
    model: nn.Module, pos: int, points: int, multiple_of: int, ffn_multiple_of: int
) -> tuple[list[int], list[int]]:
    adapter = adapter_for(model)
    block = adapter.layer_list(model)[pos]
    view = adapter.attention(block)
    units = view.num_kv_heads if view.group_size > 1 else view.num_heads
    return measure.grid(units, points, multiple_of), measure.grid(adapter.ffn(block).width, points, ffn_multiple_of)


def ticks(model: nn.Module, settings, grids, phases: int) -> int:
    """Timed measurements the profile takes: the progress bar's total."""
    shared = measure.measured_layers(model, settings.every_layer)
    per_layer = sum(len(u) + len(w) - 2 + measure.FULL_TIMINGS for u, w in (grids(pos) for pos in set(shared.values())))
    return phases * settings.rounds * (1 + per_layer)


def model_shape(model: nn.Module) -> dict:
    info = info_of(model)
    layout = info.layout
    heads, widths = layout_counts(model)
    return {
        "sha256": info.source_sha,
        "family": info.family,
        "num_heads": list(layout.num_heads),
        "num_kv_heads": list(layout.num_kv_heads),
        "num_ffn": [layout.num_ffn[i] if layout.num_ffn else 0 for i in range(layout.num_layers)],
        "layers": list(layout.layers),
        "heads": {str(l): n for l, n in heads.items()},
        "kv_heads": {str(l): len(h) for l, h in zip(layout.layers, layout.kv_heads)},
        "ffn": {str(l): w for l, w in widths.items()},
    }


def layout_counts(model: nn.Module) -> tuple[dict[int, int], dict[int, int]]:
    """(query heads, FFN width) per kept original layer."""
    layout = info_of(model).layout
    blocks = adapter_for(model).layer_list(model)
    widths = {layer: adapter_for(model).ffn(blocks[pos]).width for pos, layer in enumerate(layout.layers)}
    return {layer: len(h) for layer, h in zip(layout.layers, layout.heads)}, widths


def device_facts(device: torch.device) -> dict:
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return {"type": "cuda", "name": torch.cuda.get_device_name(index), "index": index}
    return {"type": device.type, "name": cpu_name(), "index": None}


def cpu_name() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"
