"""config.json for an exported folder: a plain transformers config when the layout allows
one, and otherwise a folder that transformers refuses instead of loading wrong shapes.

transformers configs hold one head count for all layers. LLaMA-family configs
(LLaMA, Mistral, Qwen2, Qwen3) also take an explicit `head_dim`, so a layout whose kept
layers all keep the same number of query heads and KV heads is expressible: the config
gets those counts, the original `head_dim` and the kept layer count. BERT, GPT-2,
DistilBERT and ViT derive the head size from hidden_size / heads, so any head removal
there (like any uneven layout) has no config that builds the pruned shapes.

FFN widths: every transformers config states one FFN width (`intermediate_size`; GPT-2's
`n_inner`, DistilBERT's `hidden_dim`), so a layout whose kept layers all keep the same
number of FFN neurons is plain (config gets that width) and uneven widths are not.

For those, the folder still carries config.json (tokenizers, sentence-transformers and
ONNX runtimes read it for the model type and sizes) with the unpruned head counts, but
the weights are written as `headprune.safetensors`, a name transformers never looks
for: `from_pretrained` stops with "no file named model.safetensors" instead of loading
random attention weights under `ignore_mismatched_sizes=True`. `headprune_cli.load`
and `headprune import` find the weights through headprune.json, and onnx/model.onnx
serves the model without headprune.

Everything here works from ModelInfo (metadata) alone, so a streamed export that never
builds the model can use it.
"""

from __future__ import annotations

from dataclasses import dataclass

import transformers

from headprune_cli.model.arch import adapter_for_family
from headprune_cli.model.layout import ModelInfo

PLAIN_WEIGHTS = "model.safetensors"  # what from_pretrained loads
HIDDEN_WEIGHTS = "headprune.safetensors"  # what from_pretrained never finds
_FAMILY_NAMES = {"bert": "BERT", "distilbert": "DistilBERT", "gpt2": "GPT-2", "vit": "ViT"}
FFN_WIDTH_KEY = {"distilbert": "hidden_dim", "gpt2": "n_inner"}  # the rest: intermediate_size


@dataclass
class FolderConfig:
    config: dict  # config.json
    weights: str  # file name of the weights in the folder
    plain: bool  # True when transformers' own class loads the folder at the pruned shapes
    reason: str = ""  # when not plain: why (a clause)
    uniform_helps: bool = False  # `select --uniform` would make the layout plain


def folder_config(info: ModelInfo) -> FolderConfig:
    """config.json and the weights' file name for a model with this info."""
    config = _config_with_layers(info)
    reason = _not_expressible(info)
    uniform_helps = _states_head_dim(info)
    if not reason:
        reason = _ffn_not_expressible(info)
        uniform_helps = bool(reason)  # one FFN width for all layers is what every config states
    if reason:
        return FolderConfig(config, HIDDEN_WEIGHTS, False, reason, uniform_helps=uniform_helps)
    layout = info.layout
    if layout.ffn:  # one FFN width in every kept layer
        config[FFN_WIDTH_KEY.get(info.family, "intermediate_size")] = layout.ffn_width(layout.layers[0])
    if _heads_removed(info):  # uniform LLaMA-family layout: state the new counts
        original = info.config
        config["num_attention_heads"] = len(layout.heads[0])
        config["num_key_value_heads"] = len(layout.kv_heads[0])
        config["head_dim"] = original.get("head_dim") or original["hidden_size"] // original["num_attention_heads"]
    refusal = _refused_by_transformers(config)
    if refusal:
        return FolderConfig(_config_with_layers(info), HIDDEN_WEIGHTS, False, refusal)
    return FolderConfig(config, PLAIN_WEIGHTS, True)


def _refused_by_transformers(config: dict) -> str:
    """Why transformers' own config class would refuse `config`, or "" (LlamaConfig, unlike
    Mistral's and Qwen's, insists on hidden_size % num_attention_heads == 0 even with an
    explicit head_dim, so 12 of 16 heads at hidden 2048 cannot be stated)."""

    fields = {k: v for k, v in config.items() if k not in ("transformers_version", "architectures", "model_type")}
    try:
        # str(): a missing model_type is refused as "None", exactly as for_model(None) refuses it
        transformers.AutoConfig.for_model(str(config.get("model_type")), **fields)
    except Exception as exc:  # the config classes raise ValueError or their own validation errors
        return f"transformers' {config.get('model_type')} config refuses the pruned counts ({_last_line(exc)})"
    return ""


def _last_line(exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def _states_head_dim(info: ModelInfo) -> bool:
    """Whether the family's transformers config takes head_dim, so it can state pruned head counts."""
    return adapter_for_family(info.family).explicit_head_dim


def _not_expressible(info: ModelInfo) -> str:
    layout = info.layout
    if info.family == "reference":
        return "the reference encoder is headprune's own class, which transformers does not know"
    if not _heads_removed(info):
        return ""
    if not _states_head_dim(info):
        name = _FAMILY_NAMES.get(info.family, info.family)
        return (
            f"{name} derives its head size from hidden_size / heads, so no transformers config can state pruned heads"
        )
    shapes = {(len(q), len(kv)) for q, kv in zip(layout.heads, layout.kv_heads)}
    if len(shapes) > 1:
        counts = ", ".join(f"layer {layer}: {len(q)}" for layer, q in zip(layout.layers, layout.heads))
        return f"layers keep different head counts ({counts}), which a transformers config cannot state"
    return ""


def _ffn_not_expressible(info: ModelInfo) -> str:
    layout = info.layout
    widths = [layout.ffn_width(layer) for layer in layout.layers]
    if len(set(widths)) <= 1:
        return ""
    counts = ", ".join(f"layer {layer}: {w}" for layer, w in zip(layout.layers, widths))
    return f"layers keep different FFN widths ({counts}), which a transformers config cannot state"


def remedy(layout: FolderConfig, onnx_written: bool) -> str:
    """What serves (or would let transformers load) a folder that is not plain."""
    ways = ["`select --uniform` makes a plain transformers folder"] if layout.uniform_helps else []
    ways.append(
        "onnx/model.onnx (written) serves it"
        if onnx_written
        else "--with-onnx (or --onnx FILE) writes an ONNX model that serves it"
    )
    ways.append("headprune_cli.load(DIR) loads it")
    return "; ".join(ways)


def _heads_removed(info: ModelInfo) -> bool:
    layout = info.layout
    return any(len(heads) != layout.num_heads[layer] for layer, heads in zip(layout.layers, layout.heads))


def _config_with_layers(info: ModelInfo) -> dict:
    """The original config with the kept layer count (and per-layer types) applied."""

    fields = {k: v for k, v in info.config.items() if k not in ("transformers_version", "architectures")}
    model_type = fields.pop("model_type", None)
    if info.family == "reference":
        config = dict(info.config)
        config["architectures"] = [info.architecture]
        return config
    built = transformers.AutoConfig.for_model(model_type, **fields)
    kept = info.layout.layers
    built.num_hidden_layers = len(kept)  # attribute_map: n_layer (GPT-2), n_layers (DistilBERT)
    if getattr(built, "layer_types", None) is not None and len(built.layer_types) == info.layout.num_layers:
        built.layer_types = [built.layer_types[i] for i in kept]
    out = built.to_dict()
    out["architectures"] = [info.architecture]
    return out
