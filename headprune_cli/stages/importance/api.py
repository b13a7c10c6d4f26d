"""The registry and the library entry points the CLI, sweeps and iterative pruning call."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from headprune_cli.model import cost
from headprune_cli.data import Dataset
from headprune_cli.errors import DataError, UsageError
from headprune_cli.model.layout import info_of
from headprune_cli.names import did_you_mean
from headprune_cli.stages.objectives import check_objective, needs_labels
from headprune_cli.schema import envelope, input_ref
from headprune_cli.stages.importance.baselines import Combined, Random
from headprune_cli.stages.importance.context import ProgressFactory, ScoreContext, no_progress
from headprune_cli.stages.importance.gradients import Fisher, Gradient, Taylor, TaylorWeight
from headprune_cli.stages.importance.l0 import L0
from headprune_cli.stages.importance.layers import BlockInfluence, LayerLeaveOneOut, LayerRefit, attention_loss
from headprune_cli.stages.importance.masked import Entropy, LeaveOneOut
from headprune_cli.stages.joint import LOSS_LAYER_METHODS  # layer scores that are loss changes: they also measure attention

HEAD_METHODS = {
    "gradient": Gradient, "taylor": Taylor, "taylor-weight": TaylorWeight, "fisher": Fisher,
    "loo": LeaveOneOut, "entropy": Entropy, "combined": Combined, "random": Random, "l0": L0,
}
LAYER_METHODS = {"cosine": BlockInfluence, "loo": LayerLeaveOneOut, "refit": LayerRefit}


def make_scorer(method: str, *, normalize: bool = True, weights: Mapping[str, float] | None = None):
    if method not in HEAD_METHODS:
        raise UsageError(f"unknown method {method!r}" + did_you_mean(method, HEAD_METHODS))
    if method == "gradient":
        return Gradient(normalize=normalize)
    if method == "combined":
        return Combined(weights, lambda m: make_scorer(m, normalize=normalize))
    return HEAD_METHODS[method]()


def _layer_scorer(layer_method: str):
    if layer_method not in LAYER_METHODS:
        raise UsageError(f"unknown layer method {layer_method!r}" + did_you_mean(layer_method, LAYER_METHODS))
    return LAYER_METHODS[layer_method]()


def score_model(
    model: nn.Module,
    dataset: Dataset,
    method: str,
    objective: str | None = None,
    *,
    batch_size: int = 32,
    seed: int = 0,
    normalize: bool = True,
    weights: Mapping[str, float] | None = None,
    layers: str | None = None,
    progress: ProgressFactory = no_progress,
) -> dict:
    """Score every kept head (original indices); `layers` = 'refit', 'loo' or 'cosine' adds layer scores.

    Returns {method, objective, heads: {layer: {head: score}}, layers, attention, samples, config};
    `attention` (loss change of removing each layer's heads together) comes with loo/refit layers.
    Under torchrun every process must call this with the same arguments.
    """
    objective = check_objective(objective, model)
    if needs_labels(objective) and dataset.labels is None:
        raise DataError("the classification objective needs a `label` for every example")
    if batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1 (got {batch_size})")
    scorer = make_scorer(method, normalize=normalize, weights=weights)
    layer_scorer = _layer_scorer(layers) if layers else None
    torch.manual_seed(seed)
    ctx = ScoreContext(model, dataset, objective, batch_size, seed, progress)
    was_training = model.training
    model.eval()  # dropout off: scores must be deterministic
    try:
        per_layer = scorer(ctx)
        layer_scores = layer_scorer(ctx) if layer_scorer else None
        attention = attention_loss(ctx) if layers in LOSS_LAYER_METHODS else None
    finally:
        model.train(was_training)
    layout = info_of(model).layout
    heads = {
        layer: {head: float(value) for head, value in zip(kept, scores.tolist())}
        for layer, kept, scores in zip(layout.layers, layout.heads, per_layer)
    }
    config = {"method": method, "objective": objective, "batch_size": batch_size, "seed": seed}
    if method == "gradient":
        config["normalize"] = normalize
    if method == "combined":
        config["weights"] = dict(sorted(scorer.weights.items()))
    if layers:
        config["layers"] = layers
    return {
        "method": method,
        "objective": objective,
        "heads": heads,
        "layers": None if layer_scores is None else dict(zip(layout.layers, map(float, layer_scores.tolist()))),
        "attention": None if attention is None else dict(zip(layout.layers, map(float, attention.tolist()))),
        "samples": len(dataset),
        "config": config,
    }


def scores_artifact(
    model: nn.Module,
    result: dict,
    *,
    model_path: str | Path,
    data_path: str | Path,
    max_length: int,
    model_sha: str | None = None,
    extra_config: Mapping | None = None,
) -> dict:
    """The scores JSON (DESIGN.md): envelope naming model and data with sha256, then the payload."""
    info = info_of(model)
    layout = info.layout
    if model_sha is None and info.loaded_from and Path(info.loaded_from[0]).resolve() == Path(model_path).resolve():
        model_sha = info.loaded_from[1]
    inputs = [input_ref("model", model_path, model_sha), input_ref("data", data_path)]
    config = {**result["config"], "max_length": max_length, **dict(extra_config or {})}
    artifact = envelope("scores", inputs, dict(sorted(config.items())))
    artifact.update(
        method=result["method"],
        objective=result["objective"],
        shape=[layout.num_layers, max(layout.num_heads)],
        num_heads=list(layout.num_heads),
        num_kv_heads=list(layout.num_kv_heads),
        kept={str(layer): list(heads) for layer, heads in zip(layout.layers, layout.heads)},
        heads={str(layer): {str(h): v for h, v in scores.items()} for layer, scores in result["heads"].items()},
        layers=None if result["layers"] is None else {str(k): v for k, v in result["layers"].items()},
        **({} if result.get("attention") is None else {"attention": {str(k): v for k, v in result["attention"].items()}}),
        samples=result["samples"],
        cost=cost.cost_table(model, max_length).to_dict(),
    )
    return artifact
