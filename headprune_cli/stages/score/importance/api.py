"""The library entry points of scoring: build a scorer from the registry, score a model, write the artifact."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from headprune_cli.artifacts.neuron_scores import ffn_block
from headprune_cli.artifacts.schema import envelope, input_ref
from headprune_cli.data.readers import Dataset, used_width
from headprune_cli.errors import DataError, UsageError
from headprune_cli.model import cost
from headprune_cli.model.layout import info_of
from headprune_cli.runtime.recompute import tokens_per_pass, wants_recompute
from headprune_cli.stages.objectives import check_objective, needs_labels
from headprune_cli.stages.score.importance.context import ProgressFactory, ScoreContext, no_progress
from headprune_cli.stages.score.importance.layers import attention_loss, ffn_loss
from headprune_cli.stages.score.importance.protocol import Importance
from headprune_cli.stages.score.importance.registry import check_ffn, head_method, layer_method
from headprune_cli.stages.score.table import ScoreTable


def make_scorer(method: str, **settings) -> Importance:
    """The scorer for `method`, given those of `settings` its registry entry declares it takes."""
    entry = head_method(method)
    return entry.make(**{key: value for key, value in settings.items() if key in entry.options})


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
    seq_len: int | None = None,
    ffn: bool = False,
    recompute: bool | None = None,
    method_options: Mapping[str, object] | None = None,
) -> ScoreTable:
    """Score every kept head (original indices); `layers` = 'refit', 'loo' or 'cosine' adds layer scores.

    `attention` (loss change of removing each layer's heads together) comes with loo/refit
    layers; `seq_len` adds the cost table at that sequence length (what budgets price).
    `ffn` scores every FFN neuron too, in the same passes (and, with loo/refit layers, the
    loss of removing each layer's whole FFN). `recompute` runs gradient passes with each block
    recomputed in the backward (less memory, the same scores; None: on for models of 400 M
    parameters or more and for causal LMs whose batch would outgrow their activation budget,
    see runtime.recompute; such a batch is also run a few rows at a time). `method_options`:
    a method's own options (obs: obs_norm, obs_score, obs_damp); the method takes those its
    registry entry names. Under torchrun
    every process must call this with the same arguments.
    """
    objective = check_objective(objective, model)
    if needs_labels(objective) and dataset.labels is None:
        raise DataError("the classification objective needs a `label` for every example")
    if batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1 (got {batch_size})")
    scorer = make_scorer(method, normalize=normalize, weights=weights, **dict(method_options or {}))
    if ffn:
        check_ffn(method)
    scorer.check(ffn)
    layer_entry = layer_method(layers) if layers else None
    torch.manual_seed(seed)
    batch_tokens = min(batch_size, len(dataset)) * used_width(dataset.attention_mask)
    recompute = wants_recompute(model, recompute, batch_tokens)
    ctx = ScoreContext(
        model,
        dataset,
        objective,
        batch_size,
        seed,
        progress,
        ffn=ffn,
        recompute=recompute,
        tokens_per_pass=tokens_per_pass(model, recompute),
    )
    was_training = model.training
    model.eval()  # dropout off: scores must be deterministic
    try:
        per_layer = scorer.heads(ctx)
        neurons = scorer.neurons(ctx) if ffn else None
        layer_scores = layer_entry.make().layers(ctx) if layer_entry else None
        measured = layer_entry is not None and layer_entry.measures_attention
        attention = attention_loss(ctx) if measured else None
        whole_ffn = ffn_loss(ctx) if measured and ffn else None
    finally:
        model.train(was_training)
    layout = info_of(model).layout
    heads = {
        layer: {head: float(value) for head, value in zip(kept, scores.tolist())}
        for layer, kept, scores in zip(layout.layers, layout.heads, per_layer)
    }
    config = {"method": method, "objective": objective, "batch_size": batch_size, "seed": seed, **scorer.settings()}
    if layers:
        config["layers"] = layers
    if ffn:
        config["ffn"] = True
    return ScoreTable(
        heads=heads,
        num_heads=list(layout.num_heads),
        num_kv_heads=list(layout.num_kv_heads),
        layers=None if layer_scores is None else dict(zip(layout.layers, map(float, layer_scores.tolist()))),
        cost=None if seq_len is None else cost.cost_table(model, seq_len, ffn=ffn),
        method=method,
        layer_method=layers,
        attention=None if attention is None else dict(zip(layout.layers, map(float, attention.tolist()))),
        objective=objective,
        samples=len(dataset),
        config=config,
        **({} if neurons is None else _ffn_fields(layout, neurons, whole_ffn)),
    )


def _ffn_fields(layout, neurons: list[torch.Tensor], whole: torch.Tensor | None) -> dict:
    return {
        "ffn": {layer: [float(v) for v in s.tolist()] for layer, s in zip(layout.layers, neurons)},
        "ffn_kept": {layer: layout.kept_neurons(layer) for layer in layout.layers},
        "ffn_loss": None if whole is None else dict(zip(layout.layers, map(float, whole.tolist()))),
        "num_ffn": list(layout.num_ffn),
    }


def scores_artifact(
    model: nn.Module,
    result: ScoreTable,
    *,
    model_path: str | Path,
    data_path: str | Path,
    max_length: int,
    model_sha: str | None = None,
    extra_config: Mapping | None = None,
) -> dict:
    """The scores JSON: an envelope naming model and data with their sha256, then the payload."""
    info = info_of(model)
    layout = info.layout
    if model_sha is None and info.loaded_from and Path(info.loaded_from[0]).resolve() == Path(model_path).resolve():
        model_sha = info.loaded_from[1]
    inputs = [input_ref("model", model_path, model_sha), input_ref("data", data_path)]
    config = {**result.config, "max_length": max_length, **dict(extra_config or {})}
    artifact = envelope("scores", inputs, dict(sorted(config.items())))
    artifact.update(
        method=result.method,
        objective=result.objective,
        shape=[layout.num_layers, max(layout.num_heads)],
        num_heads=list(layout.num_heads),
        num_kv_heads=list(layout.num_kv_heads),
        kept={str(layer): list(heads) for layer, heads in zip(layout.layers, layout.heads)},
        heads={str(layer): {str(h): v for h, v in scores.items()} for layer, scores in result.heads.items()},
        layers=None if result.layers is None else {str(k): v for k, v in result.layers.items()},
        **({} if result.attention is None else {"attention": {str(k): v for k, v in result.attention.items()}}),
        samples=result.samples,
        cost=cost.cost_table(model, max_length, ffn=result.ffn is not None).to_dict(),
    )
    if result.ffn is not None:
        assert result.num_ffn is not None and result.ffn_kept is not None  # scored together with ffn (_ffn_fields)
        artifact["ffn"] = ffn_block(result.num_ffn, result.ffn_kept, result.ffn, result.ffn_loss)
    return artifact
