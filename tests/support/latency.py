"""Latency tables written by hand (prices chosen so the right selection is known), and a
stand-in for torch.utils.benchmark's Timer that answers without a clock."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from headprune_cli.artifacts.schema import dumps, envelope, input_ref
from headprune_cli.files.io import sha256_file

CPU = {"type": "cpu", "name": "Test CPU", "index": None}


def _point(ms: float, spread: float = 0.0) -> dict:
    return {"median_ms": ms, "q1_ms": ms * (1 - spread), "q3_ms": ms * (1 + spread)}


def latency_table(
    model_path: Path,
    shape: dict,
    attention,
    ffn=lambda layer, width: 0.0,
    outside: float = 1.0,
    unit_grid=None,
    width_grid=None,
    device: dict = CPU,
    batch: int = 8,
    seq_len: int = 128,
    threads: int = 2,
    dtype: str = "float32",
    sha256: str | None = None,
) -> dict:
    """A latency artifact for the model at `model_path` whose `shape` is model_shape's dict.

    `attention(layer, units)` is the block's ms at that many units with the full FFN;
    `ffn(layer, width)` what the FFN at `width` costs less than the full one (ms saved,
    0 by default: an FFN that costs nothing to cut is free)."""
    layers = {}
    for layer in shape["layers"]:
        q, kv = shape["heads"][str(layer)], shape["kv_heads"][str(layer)]
        group = q // kv
        units = kv if group > 1 else q
        width = shape["ffn"][str(layer)]
        ugrid = unit_grid(units) if unit_grid else sorted({1, max(1, units // 2), units})
        wgrid = width_grid(width) if width_grid else sorted({max(1, width // 4), max(1, width // 2), width})
        full = attention(layer, units)
        layers[str(layer)] = {
            "measured_as": layer,
            "attention": [{"units": k, "heads": k * group, **_point(attention(layer, k))} for k in ugrid],
            "ffn": [{"width": w, **_point(full - (ffn(layer, w) if w != width else 0.0))} for w in wgrid],
        }
    artifact = envelope("latency", [input_ref("model", model_path)], {"hand": True})
    artifact.update(
        device=device,
        torch_version=torch.__version__,
        threads=threads,
        batch=batch,
        seq_len=seq_len,
        dtype=dtype,
        model={**shape, "sha256": sha256 or sha256_file(model_path)},
        grid={"points": 3},
        timing={"hand": True},
        phases={"forward": {"context": None, "outside": _point(outside), "layers": layers}},
    )
    return artifact


def shape_of(model, model_path: Path) -> dict:
    """The model's shape as a latency table records it (`model_path`: where it was saved)."""
    from headprune_cli.model.layout import info_of
    from headprune_cli.stages.profile.build import model_shape

    if info_of(model).loaded_from is None:  # a model built in the test
        info_of(model).loaded_from = (str(model_path), sha256_file(model_path))
    return model_shape(model)


def write_latency(path: Path, model, model_path: Path, **kwargs) -> Path:
    """A table pricing every attention unit 1 ms and every FFN neuron 0.01 ms, plus 1 ms fixed per layer."""
    defaults = {
        "attention": lambda layer, units: 1.0 + units + 0.01 * shape["ffn"][str(layer)],
        "ffn": lambda layer, width: 0.01 * (shape["ffn"][str(layer)] - width),
    }
    shape = shape_of(model, model_path)
    path.write_text(dumps(latency_table(model_path, shape, **{**defaults, **kwargs})))
    return path


class MacTimer:
    """Stands in for torch.utils.benchmark.Timer: runs the statement (so every real code path
    runs) and answers with a time made of the multiply-accumulates of the nn.Linear layers it
    ran (1 us per 1000), plus 10 us: deterministic, and monotone in heads and widths.
    `noise` scales each answer by a random factor in [1, 1 + noise)."""

    noise = 0.0

    def __init__(self, fn, threads=None):
        self.fn = fn

    def _seconds(self) -> float:
        macs = 0

        def count(module, args, output):
            nonlocal macs
            if isinstance(module, nn.Linear):
                macs += module.in_features * module.out_features * (args[0].numel() // module.in_features)

        handle = nn.modules.module.register_module_forward_hook(count)
        try:
            self.fn()
        finally:
            handle.remove()
        return (10.0 + macs / 1000.0) * 1e-6 * (1 + MacTimer.noise * random.random())

    def timeit(self, number: int):
        return SimpleNamespace(median=self._seconds())

    def blocked_autorange(self, min_run_time: float = 0.2):
        return SimpleNamespace(median=self._seconds())
