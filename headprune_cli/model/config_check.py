"""A checkpoint's declared config, checked before anything is built from it.

A model is built from the config in the file's header, so a 2 MB file that declares
30,000 layers or a hidden size of a million would claim gigabytes before its weights
are ever looked at. Two checks run first, both in milliseconds:
- `check_declared` (read_info): every size the config declares is an integer within
  sane bounds, and agrees with the stored layout (layers, heads per layer);
- `check_against_header` (load): the sizes appear in the stored tensors' shapes, and the
  model the config describes is not vastly bigger than the file that claims to hold it.
"""

from __future__ import annotations

from headprune_cli.errors import CheckpointError, shorten

# Generous bounds: the largest public models have ~126 layers, 128 heads, hidden 16384,
# vocabularies of 256k and 1M-token position tables.
LIMITS = {
    "layers": 1024,
    "heads": 1024,
    "hidden": 1 << 16,
    "intermediate": 1 << 19,
    "vocab": 1 << 21,
    "positions": 1 << 24,
    "head_dim": 4096,
    "image": 1 << 14,
}
# Config keys per meaning, across the families headprune supports.
KEYS = {
    "layers": ("num_hidden_layers", "n_layer", "n_layers"),
    "heads": ("num_attention_heads", "n_head", "n_heads", "num_key_value_heads"),
    "hidden": ("hidden_size", "n_embd", "dim", "embedding_size"),
    "intermediate": ("intermediate_size", "n_inner", "hidden_dim"),
    "vocab": ("vocab_size",),
    "positions": ("max_position_embeddings", "n_positions", "max_position"),
    "head_dim": ("head_dim",),
    "image": ("image_size", "patch_size", "num_channels"),
}
# How many times bigger than its file the built (unpruned, fp32) model may be: pruning
# removes a share of a model, it does not shrink it a hundredfold. Small models always pass.
MAX_GROWTH = 64
MIN_ALLOWANCE = 512 * 1024 * 1024


def check_declared(config: dict, num_heads: list[int], num_kv_heads: list[int], where) -> None:
    """Bounds on every declared size, and the config agreeing with the layout."""
    for meaning, keys in KEYS.items():
        for key in keys:
            value = config.get(key)
            if value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= LIMITS[meaning]:
                raise CheckpointError(
                    f"{where}: config {key}={shorten(value)} is not a size between 1 and {LIMITS[meaning]}"
                )
    per_layer = config.get("heads_per_layer")
    if per_layer is not None:
        if not isinstance(per_layer, list) or not 1 <= len(per_layer) <= LIMITS["layers"]:
            raise CheckpointError(f"{where}: config heads_per_layer must list 1 to {LIMITS['layers']} layers")
        if any(not isinstance(h, int) or isinstance(h, bool) or not 1 <= h <= LIMITS["heads"] for h in per_layer):
            raise CheckpointError(f"{where}: config heads_per_layer holds a head count outside 1..{LIMITS['heads']}")
    layers, heads, kv = _declared_heads(config)
    if len(num_heads) > LIMITS["layers"]:
        raise CheckpointError(f"{where}: the layout lists {len(num_heads)} layers (at most {LIMITS['layers']})")
    if layers is not None and layers != len(num_heads):
        raise CheckpointError(f"{where}: the config declares {layers} layers, the layout {len(num_heads)}")
    if heads is not None and (list(num_heads) != heads or list(num_kv_heads) != kv):
        raise CheckpointError(f"{where}: the config's head counts differ from the layout's")


def _declared_heads(config: dict) -> tuple[int | None, list[int] | None, list[int] | None]:
    """(layers, query heads per layer, key/value heads per layer) as the config declares them."""
    if isinstance(config.get("heads_per_layer"), list):
        heads = list(config["heads_per_layer"])
        return len(heads), heads, heads
    layers = _first(config, KEYS["layers"])
    query = _first(config, ("num_attention_heads", "n_head", "n_heads"))
    if layers is None or query is None:
        return layers, None, None
    kv = config.get("num_key_value_heads") or query
    return layers, [query] * layers, [kv] * layers


def _first(config: dict, keys: tuple[str, ...]) -> int | None:
    return next((config[k] for k in keys if isinstance(config.get(k), int)), None)


def check_against_header(
    config: dict, shapes: dict[str, tuple[int, ...]], stored_bytes: int, where, every_ffn_cut: bool = False
) -> None:
    """The declared sizes must be the stored tensors' sizes (name -> shape, from the
    header), and the model to build must be within MAX_GROWTH of the stored bytes.
    `every_ffn_cut`: the layout cuts every kept layer's FFN, so the (unpruned) config's
    intermediate size is in no stored shape; the layout's widths are checked on build."""
    dims = {d for shape in shapes.values() for d in shape}
    for meaning in ("vocab", "hidden") if every_ffn_cut else ("vocab", "hidden", "intermediate"):
        for key in KEYS[meaning]:
            value = config.get(key)
            if isinstance(value, int) and value not in dims:
                raise CheckpointError(f"{where}: config {key}={value} matches no stored tensor's shape")
    position_dims = {d for name, shape in shapes.items() if "position" in name for d in shape}
    for key in KEYS["positions"]:
        value = config.get(key)
        if position_dims and isinstance(value, int) and value not in position_dims:
            raise CheckpointError(f"{where}: config {key}={value} differs from the stored position table")
    budget = max(MAX_GROWTH * stored_bytes, MIN_ALLOWANCE)
    if 4 * estimated_params(config) > budget:
        raise CheckpointError(
            f"{where}: the config describes a model of ~{estimated_params(config):.3g} parameters, "
            f"far more than its {stored_bytes} stored bytes can hold"
        )


def estimated_params(config: dict) -> float:
    """Parameters of the unpruned model the config describes (attention, MLP, embeddings)."""
    layers, heads, _ = _declared_heads(config)
    hidden = _first(config, KEYS["hidden"]) or 1
    head_dim = config.get("head_dim") if isinstance(config.get("head_dim"), int) else None
    width = sum(heads) * (head_dim or hidden // max(heads[0], 1)) if heads else (layers or 1) * hidden
    inner = _first(config, KEYS["intermediate"]) or 4 * hidden
    vocab = _first(config, KEYS["vocab"]) or 0
    positions = _first(config, KEYS["positions"]) or 0
    image, patch = config.get("image_size"), config.get("patch_size")
    if isinstance(image, int) and isinstance(patch, int):
        positions = (image // patch) ** 2 + 1
    return float(4 * hidden * width + 3 * hidden * inner * (layers or 1) + (vocab + positions) * hidden)
