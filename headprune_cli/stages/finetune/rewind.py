"""Lottery tickets for heads: reset a (pruned) model's kept weights before it trains.

`rewind` gives every kept head, FFN neuron and layer the values it had in another
checkpoint of the same architecture (typically the pre-trained base the task model was
fine-tuned from), sliced by the original indices the pruned model's layout records: the
source is cut to the pruned layout with the same surgery pruning uses, so head 5 of layer
2 gets head 5 of layer 2's Q/K/V rows and O columns, whatever position it has now.
Tensors the source lacks (a classifier head when the source is the bare encoder) keep the
pruned model's values, and the summary names them.

`reinit` re-initialises the same kept structure with the model's own initialisation
(transformers' `_init_weights`; torch's `reset_parameters` for the reference encoder)
under a seed, without touching the global random state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from headprune_cli.errors import CheckpointError, UsageError, shorten
from headprune_cli.files.io import sha256_bytes, sha256_file
from headprune_cli.model.arch import adapter_for, adapter_for_model_type
from headprune_cli.model.arch.base import HFModule
from headprune_cli.model.checkpoint import is_export_folder, load, read_info, weights_sha
from headprune_cli.model.importer import import_folder, read_config
from headprune_cli.model.layout import Layout, info_of
from headprune_cli.model.surgery import apply_plan

# Config keys that fix a tensor's shape, across the families' spellings. A source whose
# value differs from the pruned model's on any of them is another architecture or shape.
SHAPE_KEYS = (
    "hidden_size",
    "n_embd",
    "dim",
    "d_model",
    "embedding_size",
    "num_hidden_layers",
    "n_layer",
    "n_layers",
    "num_attention_heads",
    "n_head",
    "n_heads",
    "num_key_value_heads",
    "head_dim",
    "heads_per_layer",
    "intermediate_size",
    "n_inner",
    "hidden_dim",
    "vocab_size",
    "max_position_embeddings",
    "n_positions",
    "max_position",
    "type_vocab_size",
)


@dataclass
class Rewound:
    """What `rewind` did: the source, its weights' sha256, the tensors copied and those kept."""

    source: str
    sha256: str
    copied: int
    kept: list[str] = field(default_factory=list)

    def summary(self, root: str | None) -> str:
        kept = f"; kept from the pruned model (absent in the source): {', '.join(self.kept)}" if self.kept else ""
        base = f"its root model is {root[:12]}" if root else "it is a root model"
        return (
            f"rewound {self.copied} tensors (the kept heads, FFN neurons and layers, by original index) to "
            f"{self.source} (weights sha256 {self.sha256[:12]}; {base}){kept}"
        )


def rewind(model: nn.Module, source_path: str | Path) -> Rewound:
    """Give `model`'s kept weights the values of the same units in `source_path` (a
    headprune checkpoint or export folder, or a Hugging Face model folder), in place."""
    path = Path(source_path)
    family, config = _source_family_and_config(path)
    check_same_shape(model, family, config, str(path))
    source = _load_source(path)
    check_same_shape(model, info_of(source).family, info_of(source).config, str(path))
    _cut_like(source, info_of(model).layout, str(path))
    copied, kept = _copy_weights(source, model, str(path))
    return Rewound(str(path), _source_sha(path), copied, kept)


def reinit(model: HFModule, seed: int) -> None:
    """Re-initialise every weight of `model` (its kept structure) with the model's own
    initialisation under `seed`; the global random state is left as it was."""
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        if hasattr(model, "init_weights") and hasattr(model, "_init_weights"):  # a transformers model
            _clear_initialized_flags(model)
            model.init_weights()
            _clear_initialized_flags(model)
        else:
            for module in model.modules():
                reset = getattr(module, "reset_parameters", None)
                if callable(reset):
                    reset()


def _clear_initialized_flags(model: nn.Module) -> None:
    """transformers v5 skips modules and tensors it marked initialised (loading marks them)."""
    for item in [*model.modules(), *model.parameters(), *model.buffers()]:
        if hasattr(item, "_is_hf_initialized"):
            delattr(item, "_is_hf_initialized")


# --- reading the source -------------------------------------------------------------
def _is_hf_folder(path: Path) -> bool:
    return path.is_dir() and not is_export_folder(path)


def _source_family_and_config(path: Path) -> tuple[str, dict]:
    """The source's family and (unpruned) config, read before any weight is."""
    if not _is_hf_folder(path):
        info = read_info(path)  # refuses a missing file, a plain safetensors file, a FIFO
        return info.family, info.config
    try:
        config = read_config(path)
    except CheckpointError as exc:
        raise CheckpointError(f"--rewind-to {exc}") from None
    return adapter_for_model_type(str(config.get("model_type"))).family, config


def _load_source(path: Path) -> nn.Module:
    if not _is_hf_folder(path):
        return load(path)
    return import_folder(path)


def _source_sha(path: Path) -> str:
    """sha256 of the source's weights: the file, or (a HF folder) its safetensors files'."""
    if not _is_hf_folder(path):
        return weights_sha(path)
    files = sorted(path.glob("*.safetensors"))
    if len(files) == 1:
        return sha256_file(files[0])
    return sha256_bytes("\n".join(f"{f.name} {sha256_file(f)}" for f in files).encode())


# --- checks -------------------------------------------------------------------------
def check_same_shape(model: nn.Module, family: str, config: dict, where: str) -> None:
    """Refuse a source of another family, or whose config gives any tensor another shape."""
    info = info_of(model)
    if family != info.family:
        raise UsageError(f"--rewind-to {where} is a {family} model; the model to rewind is {info.family}")
    theirs, ours = config.get("model_type"), info.config.get("model_type")
    if theirs != ours:  # one family holds several architectures (LLaMA, Qwen3: the q/k norms)
        raise UsageError(
            f"--rewind-to {where} is a {shorten(theirs)} model; the model to rewind is {shorten(ours)} "
            "(rewind needs the same architecture)"
        )
    differ = [
        f"{key} {config[key]} vs {info.config[key]}"
        for key in SHAPE_KEYS
        if key in config and key in info.config and config[key] != info.config[key]
    ]
    if differ:
        raise UsageError(
            f"--rewind-to {where} has another architecture or shape than the model to rewind ({'; '.join(differ)})"
        )


def _cut_like(source: nn.Module, target: Layout, where: str) -> None:
    """Cut `source` (in place) to `target`'s layout, in original indices; refuse a source
    that lacks a layer, head or FFN neuron the target keeps."""
    have = info_of(source).layout
    if (have.num_heads, have.num_kv_heads) != (target.num_heads, target.num_kv_heads) or (
        target.num_ffn and have.num_ffn != target.num_ffn
    ):
        raise UsageError(
            f"--rewind-to {where}: its unpruned shape (heads {have.num_heads}, FFN {have.num_ffn}) differs "
            f"from the model's (heads {target.num_heads}, FFN {target.num_ffn})"
        )
    missing = _missing_units(have, target)
    if missing:
        raise UsageError(f"--rewind-to {where} lacks what the model keeps ({missing}); rewind to a less pruned model")
    remove_heads = {
        layer: [h for h in have.heads[have.position(layer)] if h not in target.heads[pos]]
        for pos, layer in enumerate(target.layers)
    }
    remove_ffn = {
        layer: [n for n in have.kept_neurons(layer) if n not in set(target.kept_neurons(layer))]
        for layer in target.layers
    }
    drop = [layer for layer in have.layers if layer not in target.layers]
    apply_plan(source, remove_heads, drop, {k: v for k, v in remove_ffn.items() if v})
    cut = info_of(source).layout
    if (cut.layers, cut.heads, cut.kv_heads, cut.ffn) != (target.layers, target.heads, target.kv_heads, target.ffn):
        raise UsageError(f"--rewind-to {where}: cut to the model's layout, its key/value heads still differ")


def _missing_units(have: Layout, target: Layout) -> str:
    for pos, layer in enumerate(target.layers):
        if layer not in have.layers:
            return f"layer {layer}"
        heads = set(have.heads[have.position(layer)])
        lost = [h for h in target.heads[pos] if h not in heads]
        if lost:
            return f"layer {layer} heads {lost}"
        neurons = set(have.kept_neurons(layer))
        gone = [n for n in target.kept_neurons(layer) if n not in neurons]
        if gone:
            return f"layer {layer}: {len(gone)} FFN neurons"
    return ""


# --- copying ------------------------------------------------------------------------
def _copy_weights(source: nn.Module, model: nn.Module, where: str) -> tuple[int, list[str]]:
    """Copy the base model's tensors by name, and the task head's when the source has the
    same class; returns how many were copied and the names kept (the source lacks them)."""
    adapter = adapter_for(model)
    if type(source) is type(model):  # the whole model shares names: the task head too
        pairs = [(source.state_dict(), model.state_dict(keep_vars=True))]
    else:  # the base models share names; the model's own head has no counterpart
        base = adapter.base_model(model)
        prefix = _prefix_of(model, base)
        head = {n: t for n, t in model.state_dict(keep_vars=True).items() if not n.startswith(prefix)}
        pairs = [(adapter.base_model(source).state_dict(), base.state_dict(keep_vars=True)), ({}, head)]
    for src, dst in pairs:
        _check_roles(src, dst, where)
    copied, kept = 0, []
    with torch.no_grad():
        for src, dst in pairs:
            for name, tensor in dst.items():
                value = src.get(name)
                if value is None:
                    kept.append(name)
                    continue
                if value.shape != tensor.shape:
                    raise UsageError(
                        f"--rewind-to {where}: {name} has shape {list(value.shape)}, "
                        f"the model's is {list(tensor.shape)}"
                    )
                tensor.copy_(value.to(tensor.dtype))
                copied += 1
    return copied, sorted(kept)


def _check_roles(source: dict, target: dict, where: str) -> None:
    """Every tensor of the source has a place in the model: one it has not (Qwen3's q_norm in
    a LLaMA model) means another architecture, whose weights would be dropped unseen."""
    extra = sorted(name for name in source if name not in target)
    if extra:
        more = f" and {len(extra) - 1} more" if len(extra) > 1 else ""
        raise UsageError(
            f"--rewind-to {where} has tensors the model to rewind has no place for ({extra[0]}{more}); "
            "rewind needs the same architecture"
        )


def _prefix_of(model: nn.Module, base: nn.Module) -> str:
    """The state-dict prefix under which `model` holds its base model ('bert.')."""
    for name, module in model.named_modules():
        if module is base:
            return f"{name}." if name else ""
    return ""
