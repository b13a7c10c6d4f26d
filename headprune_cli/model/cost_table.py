"""A model's cost as a table: fixed parts plus a price per query head and per key/value
head of each layer, and (for a table made with FFN prices) per FFN neuron. Cost is linear
in heads and neurons, so the table predicts params and FLOPs of any plan exactly. Plain
numbers only (no torch): `select` works from it alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

from headprune_cli.errors import PlanError


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
    # With FFN prices: the layer's current FFN width and the price of one neuron (up and
    # gate rows with their bias, down column); the FFN is then outside fixed_*. Without
    # them (width 0) the FFN is part of fixed_* and the table's dict omits these keys.
    ffn_width: int = 0
    ffn_neuron_params: float = 0.0
    ffn_neuron_flops: float = 0.0

    def to_dict(self) -> dict:
        data = asdict(self)
        if not self.ffn_width:  # a table without FFN prices keeps the bytes it always had
            for key in FFN_KEYS:
                del data[key]
        return data


FFN_KEYS = ("ffn_width", "ffn_neuron_params", "ffn_neuron_flops")


@dataclass
class CostTable:
    seq_len: int
    outside_params: int  # embeddings, final norms, task heads
    outside_flops: float
    layers: list[LayerCost]

    def to_dict(self) -> dict:
        return {
            "seq_len": self.seq_len,
            "outside_params": self.outside_params,
            "outside_flops": self.outside_flops,
            "layers": [layer.to_dict() for layer in self.layers],
        }

    @property
    def prices_ffn(self) -> bool:
        return any(layer.ffn_width for layer in self.layers)

    @classmethod
    def from_dict(cls, data: dict) -> CostTable:
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
    remove_ffn: Mapping[int, list[int]] | None = None,
) -> dict[str, float]:
    """Params and FLOPs per token after a plan, from the current kept heads per layer
    (`remove_ffn`: neurons the layer currently keeps, which needs a table with FFN prices)."""
    remove_heads = remove_heads or {}
    remove_ffn = {int(k): v for k, v in (remove_ffn or {}).items() if v}
    if remove_ffn and not table.prices_ffn:
        raise PlanError("the plan removes FFN neurons but the cost table has no FFN prices (make it with ffn=True)")
    dropped = set(remove_layers or [])
    params, flops = float(table.outside_params), table.outside_flops
    for layer in table.layers:
        if layer.layer in dropped:
            continue
        removed = set(remove_heads.get(layer.layer, []))
        heads = [h for h in kept_heads[layer.layer] if h not in removed]
        kv = {h // layer.group_size for h in heads}
        neurons = layer.ffn_width - len(set(remove_ffn.get(layer.layer, [])))
        params += layer.fixed_params + layer.q_head_params * len(heads) + layer.kv_head_params * len(kv)
        flops += layer.fixed_flops + layer.q_head_flops * len(heads) + layer.kv_head_flops * len(kv)
        params += layer.ffn_neuron_params * neurons
        flops += layer.ffn_neuron_flops * neurons
    return {"params": int(round(params)), "flops_per_token": flops}
