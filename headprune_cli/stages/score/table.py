"""The one in-memory scores type, from `score` to `select`.

`score_model` returns a ScoreTable; `scores_artifact` writes it as the versioned JSON;
`ScoreTable.from_scores` reads that JSON back. Selection, sweeps and iterative pruning
all take a ScoreTable. Original head and layer indices throughout.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from headprune_cli.model.cost_table import CostTable


@dataclass
class ScoreTable:
    """Importance of every kept head (and layer): higher = keep."""

    heads: dict[int, dict[int, float]]  # kept layer -> kept head -> score
    num_heads: list[int]
    num_kv_heads: list[int]
    layers: dict[int, float] | None = None
    cost: CostTable | None = None
    method: str | None = None  # the head method, and the layer method: joint.on_loss_scale reads them
    layer_method: str | None = None
    attention: dict[int, float] | None = None  # loss change of removing a layer's heads together
    objective: str | None = None
    samples: int = 0
    config: dict = field(default_factory=dict)  # the scorer's settings, as the artifact records them
    # FFN neurons (`score --ffn`): per kept layer, the original indices of its kept neurons
    # and their scores in the same order; the loss change of removing the whole FFN (with
    # loo/refit layers, as `attention` for heads); the original FFN width of every layer.
    ffn: dict[int, list[float]] | None = None
    ffn_kept: dict[int, list[int]] | None = None
    ffn_loss: dict[int, float] | None = None
    num_ffn: list[int] | None = None

    @classmethod
    def from_scores(cls, scores) -> ScoreTable:
        """From a schema.Scores artifact."""
        return cls(
            heads={int(k): {int(h): float(s) for h, s in v.items()} for k, v in scores.heads.items()},
            num_heads=list(scores.num_heads),
            num_kv_heads=list(scores.num_kv_heads),
            layers={int(k): float(v) for k, v in scores.layers.items()} if scores.layers else None,
            cost=CostTable.from_dict(scores.cost) if scores.cost else None,
            method=scores.method,
            layer_method=scores.config.get("layers") if scores.layers else None,
            attention={int(k): float(v) for k, v in scores.attention.items()} if scores.attention else None,
            objective=scores.objective,
            samples=scores.samples,
            config=dict(scores.config),
            **_ffn_of(scores),
        )

    def kept(self) -> dict[int, list[int]]:
        return {layer: sorted(heads) for layer, heads in sorted(self.heads.items())}


def _ffn_of(scores) -> dict:
    """The neuron scores of an artifact (decoded from its compact arrays), if it has any."""
    if getattr(scores, "ffn", None) is None:
        return {}
    block = scores.ffn
    return {
        "ffn": {layer: entry.values() for layer, entry in block.layers.items()},
        "ffn_kept": {layer: entry.kept_indices() for layer, entry in block.layers.items()},
        "ffn_loss": dict(block.loss) if block.loss else None,
        "num_ffn": list(block.width),
    }
