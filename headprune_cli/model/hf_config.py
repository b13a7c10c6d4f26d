"""config.json for an exported folder: a plain transformers config when the layout allows
one, and otherwise a folder that transformers refuses instead of loading wrong shapes.

transformers configs hold one head count for all layers. LLaMA-family configs
(LLaMA, Mistral, Qwen2, Qwen3) also take an explicit `head_dim`, so a layout whose kept
layers all keep the same number of query heads and KV heads is expressible: the config
gets those counts, the original `head_dim` and the kept layer count. BERT, GPT-2,
DistilBERT and ViT derive the head size from hidden_size / heads, so any head removal
there (like any uneven layout) has no config that builds the pruned shapes.

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

from headprune_cli.model.arch import adapter_for_family
from headprune_cli.model.layout import ModelInfo

PLAIN_WEIGHTS = "model.safetensors"  # what from_pretrained loads
HIDDEN_WEIGHTS = "headprune.safetensors"  # what from_pretrained never finds
_FAMILY_NAMES = {"bert": "BERT", "distilbert": "DistilBERT", "gpt2": "GPT-2", "vit": "ViT"}


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
    if reason:
        return FolderConfig(config, HIDDEN_WEIGHTS, False, reason, uniform_helps=_states_head_dim(info))
    layout = info.layout
    if _heads_removed(info):  # uniform LLaMA-family layout: state the new counts
        original = info.config
        config["num_attention_heads"] = len(layout.heads[0])
        config["num_key_value_heads"] = len(layout.kv_heads[0])
        config["head_dim"] = original.get("head_dim") or original["hidden_size"] // original["num_attention_heads"]
    return FolderConfig(config, PLAIN_WEIGHTS, True)


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
        return f"{name} derives its head size from hidden_size / heads, so no transformers config can state pruned heads"
    shapes = {(len(q), len(kv)) for q, kv in zip(layout.heads, layout.kv_heads)}
    if len(shapes) > 1:
        counts = ", ".join(f"layer {layer}: {len(q)}" for layer, q in zip(layout.layers, layout.heads))
        return f"layers keep different head counts ({counts}), which a transformers config cannot state"
    return ""


def remedy(layout: FolderConfig, onnx_written: bool) -> str:
    """What serves (or would let transformers load) a folder that is not plain."""
    ways = ["`select --uniform` makes a plain transformers folder"] if layout.uniform_helps else []
    ways.append("onnx/model.onnx (written) serves it" if onnx_written else "--with-onnx (or --onnx FILE) writes an ONNX model that serves it")
    ways.append("headprune_cli.load(DIR) loads it")
    return "; ".join(ways)


def _heads_removed(info: ModelInfo) -> bool:
    layout = info.layout
    return any(len(heads) != layout.num_heads[layer] for layer, heads in zip(layout.layers, layout.heads))


def _config_with_layers(info: ModelInfo) -> dict:
    """The original config with the kept layer count (and per-layer types) applied."""
    import transformers  # deferred: `select` and `schema` import nothing heavy

    fields = {k: v for k, v in info.config.items() if k not in ("transformers_version", "architectures")}
    model_type = fields.pop("model_type", None)
    if info.family == "reference":
        config = dict(info.config)
        config["architectures"] = [info.architecture]
        return config
    config = transformers.AutoConfig.for_model(model_type, **fields)
    kept = info.layout.layers
    config.num_hidden_layers = len(kept)  # attribute_map: n_layer (GPT-2), n_layers (DistilBERT)
    if getattr(config, "layer_types", None) is not None and len(config.layer_types) == info.layout.num_layers:
        config.layer_types = [config.layer_types[i] for i in kept]
    out = config.to_dict()
    out["architectures"] = [info.architecture]
    return out
