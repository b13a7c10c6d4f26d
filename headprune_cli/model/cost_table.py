"""A model's cost as a table: fixed parts plus a price per query head and per key/value
head of each layer. Cost is linear in heads, so the table predicts params and FLOPs of
any plan exactly. Plain numbers only (no torch): `select` works from it alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass


@dataclass
class LayerCost:
    layer: int  # original index
    fixed_params: int
    fixed_flops: float
    q_head_params: float
    q_head_flops: float
    kv_head_params: float
    kv_head_flops: float
    group_size: int  # original query heads per key/value head


@dataclass
class CostTable:
    seq_len: int
    outside_params: int  # embeddings, final norms, task heads
    outside_flops: float
    layers: list[LayerCost]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "CostTable":
        return cls(
            seq_len=int(data["seq_len"]),
            outside_params=int(data["outside_params"]),
            outside_flops=float(data["outside_flops"]),
            layers=[LayerCost(**layer) for layer in data["layers"]],
        )


def predict(
    table: CostTable,
    kept_heads: Mapping[int, list[int]],
    remove_heads: Mapping[int, list[int]] | None = None,
    remove_layers: list[int] | None = None,
) -> dict[str, float]:
    """Params and FLOPs per token after a plan, from the current kept heads per layer."""
    remove_heads = remove_heads or {}
    dropped = set(remove_layers or [])
    params, flops = float(table.outside_params), table.outside_flops
    for layer in table.layers:
        if layer.layer in dropped:
            continue
        removed = set(remove_heads.get(layer.layer, []))
        heads = [h for h in kept_heads[layer.layer] if h not in removed]
        kv = {h // layer.group_size for h in heads}
        params += layer.fixed_params + layer.q_head_params * len(heads) + layer.kv_head_params * len(kv)
        flops += layer.fixed_flops + layer.q_head_flops * len(heads) + layer.kv_head_flops * len(kv)
    return {"params": int(round(params)), "flops_per_token": flops}
