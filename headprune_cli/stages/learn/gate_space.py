"""The units learned gates train, and the budget they are priced on.

One hard-concrete gate per unit, all in one vector, in this order:
- heads: a query head, or for grouped-query layers a whole KV group with its query heads
  (what `select` removes as one unit);
- FFN neurons (`--gate-ffn`): every kept neuron of every layer;
- layers (`--gate-layers`): a whole block; closed, the block is an identity, as a dropped layer is.

The expected share of the budget removed, from the open probabilities p = P(z != 0) of
independent gates:
- a head ratio (heads only): the sum over head units of (1 - p) times the unit's share of the heads;
- a params/FLOPs target: 1 - E[cost] / cost now, where
      E[cost] = outside + sum over layers of P(layer open) * (fixed + sum over its head units
                of price * p + sum over its neurons of price * p).
  The cost table prices query heads, KV heads and neurons linearly (model/cost_table.py), a
  head unit costs its query heads and its KV head, and the gates are independent, so this is
  the exact expectation of the cost the sampled model has. Heads only, it is the sum over
  head units of (1 - p) times the unit's share of the cost.

`split` turns one draw of every gate into the per-layer tensors the hooks take
(gates.applied); `table` turns the open probabilities into the ScoreTable `select` closes
the gates with; `closed` turns that Selection back into 0/1 gates.
"""

from __future__ import annotations

import torch

from headprune_cli.model.cost import cost_table
from headprune_cli.model.cost_table import predict
from headprune_cli.model.layout import info_of
from headprune_cli.stages.budget import Budget
from headprune_cli.stages.score.table import ScoreTable
from headprune_cli.stages.select.chains import Selection


class GateSpace:
    """The gated units of a model and the expected share of the budget their gates remove."""

    def __init__(
        self,
        model,
        budget: Budget,
        seq_len: int,
        *,
        ffn: bool = False,
        layers: bool = False,
        protect: tuple[tuple[int, int], ...] = (),
    ):
        layout = info_of(model).layout
        self.budget, self.gates_ffn, self.gates_layers = budget, ffn, layers
        self.layers, self.heads = list(layout.layers), [list(h) for h in layout.heads]
        self.num_heads, self.num_kv_heads = list(layout.num_heads), list(layout.num_kv_heads)
        self.neurons = [layout.kept_neurons(layer) for layer in self.layers] if ffn else []
        self.num_ffn = list(layout.num_ffn)
        self.cost = cost_table(model, seq_len, ffn=ffn)  # FLOPs priced at this sequence length
        self.budget = budget.priced(self.cost)  # a block-params budget: shares of the blocks' params alone
        self.head_units, self.unit_of = _head_units(layout)
        self.sizes = {
            "heads": len(self.head_units),
            "neurons": sum(len(n) for n in self.neurons),
            "layers": len(self.layers) if layers else 0,
        }
        self.protected = self._protected(set(protect))
        self._prices()

    @property
    def size(self) -> int:
        return sum(self.sizes.values())

    def _widths(self) -> list[int]:
        """The gated FFN neurons per layer, in block order."""
        return [len(kept) for kept in self.neurons]

    def per_kind(self, closed: torch.Tensor) -> dict[str, float]:
        """How many query heads, FFN neurons and layers a per-unit share closed adds up to (a head
        unit counts its query heads); kinds without gates left out."""
        heads = torch.tensor([len(hs) for _, hs in self.head_units], dtype=torch.float64)
        counts = torch.cat([heads, torch.ones(self.size - len(heads), dtype=torch.float64)])
        parts = self.parts(closed.double() * counts)
        return {kind: float(part.sum()) for (kind, size), part in zip(self.sizes.items(), parts) if size}

    def parts(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(head units, neurons, layers) slices of a vector (or of the last dimension) over all units."""
        heads, neurons, layers = values.split(list(self.sizes.values()), dim=-1)
        return heads, neurons, layers

    def _protected(self, protect: set[tuple[int, int]]) -> torch.Tensor:
        """Units never gated: head units holding a protected head, and their layers (select keeps them too)."""
        heads = [any((layer, h) in protect for h in hs) for layer, hs in self.head_units]
        layers = {layer for layer, _ in protect}
        whole = [layer in layers for layer in self.layers] if self.gates_layers else []
        return torch.tensor(heads + [False] * self.sizes["neurons"] + whole, dtype=torch.bool)

    # --- the budget ------------------------------------------------------------------------
    def _prices(self) -> None:
        """Per-unit prices as shares of the cost now, and the per-layer index of each unit."""
        position = {layer: pos for pos, layer in enumerate(self.layers)}
        self.head_layer = torch.tensor([position[layer] for layer, _ in self.head_units], dtype=torch.long)
        self.neuron_layer = torch.tensor([pos for pos, kept in enumerate(self.neurons) for _ in kept], dtype=torch.long)
        if self.budget.kind == "heads":
            total = sum(len(hs) for _, hs in self.head_units)
            self.head_price = torch.tensor([len(hs) / total for _, hs in self.head_units], dtype=torch.float64)
            return
        key = self.budget.cost_key
        part = "params" if key == "params" else "flops"
        self.now = self.budget.cost(predict(self.cost, dict(zip(self.layers, self.heads))))
        price = {c.layer: c for c in self.cost.layers}
        q_head, kv_head = f"q_head_{part}", f"kv_head_{part}"
        self.head_price = torch.tensor(
            [
                (getattr(price[layer], q_head) * len(hs) + getattr(price[layer], kv_head)) / self.now
                for layer, hs in self.head_units
            ],
            dtype=torch.float64,
        )
        self.neuron_price = torch.tensor(
            [getattr(price[self.layers[pos]], f"ffn_neuron_{part}") / self.now for pos in self.neuron_layer.tolist()],
            dtype=torch.float64,
        )
        self.fixed = torch.tensor(
            [getattr(price[layer], f"fixed_{part}") / self.now for layer in self.layers], dtype=torch.float64
        )
        # Each layer's share of the cost now, all its units open (the FFN is in `fixed` without neuron gates).
        full = self.fixed.index_add(0, self.head_layer, self.head_price)
        self.full = full.index_add(0, self.neuron_layer, self.neuron_price)

    def expected_removed(self, p: torch.Tensor) -> torch.Tensor:
        """The expected share of the budget removed, from every unit's open probability (see the module docstring)."""
        heads, neurons, layers = self.parts(p.double())
        if self.budget.kind == "heads":
            return ((1.0 - heads) * self.head_price).sum()
        if not self.gates_layers:  # cost linear in the gates: only the removed part needs pricing
            return ((1.0 - heads) * self.head_price).sum() + ((1.0 - neurons) * self.neuron_price).sum()
        # With layer gates: 1 - E[cost]/now = sum over layers of (its full share - P(open) * its expected share).
        inside = self.fixed.index_add(0, self.head_layer, heads * self.head_price)
        inside = inside.index_add(0, self.neuron_layer, neurons * self.neuron_price)  # no neuron gates: adds nothing
        return (self.full - layers * inside).sum()

    # --- draws and closings --------------------------------------------------------------
    def split(self, z: torch.Tensor) -> dict[str, torch.Tensor]:
        """Gate tensors by hook: `head.POS` [..., heads of the layer], `ffn.POS` [..., its neurons],
        `layer` [..., layers]; `z` is [..., units] (a row of gates per example, or one set)."""
        heads, neurons, layers = self.parts(z)
        out = {f"head.{pos}": heads[..., index] for pos, index in enumerate(self.unit_of)}
        if self.gates_ffn:
            out.update({f"ffn.{pos}": part for pos, part in enumerate(neurons.split(self._widths(), dim=-1))})
        if self.gates_layers:
            out["layer"] = layers
        return out

    def closed(self, selection: Selection) -> torch.Tensor:
        """1 for every unit `selection` keeps, 0 for the others (a head unit goes when all its heads go)."""
        gone = {(layer, h) for layer, heads in selection.remove_heads.items() for h in heads}
        dropped = set(selection.remove_layers)
        heads = [
            0.0 if layer in dropped or all((layer, h) in gone for h in hs) else 1.0 for layer, hs in self.head_units
        ]
        neurons = []
        for layer, kept in zip(self.layers, self.neurons):
            cut = set(selection.remove_ffn.get(layer, ()))
            neurons += [0.0 if layer in dropped or n in cut else 1.0 for n in kept]
        layers = [0.0 if layer in dropped else 1.0 for layer in self.layers] if self.gates_layers else []
        return torch.tensor(heads + neurons + layers)

    def removed_share(self, selection: Selection) -> float:
        """The share of the budget `selection` removes (of the heads by whole units, or of the
        cost), rounded to 6 places."""
        if self.budget.kind == "heads":
            heads, _, _ = self.parts(self.closed(selection))
            return round(float(((1.0 - heads.double()) * self.head_price).sum()), 6)
        kept = dict(zip(self.layers, self.heads))
        after = predict(self.cost, kept, selection.remove_heads, selection.remove_layers, selection.remove_ffn)
        return round(1.0 - self.budget.cost(after) / self.now, 6)

    def table(self, p: torch.Tensor, objective: str | None, samples: int, config: dict) -> ScoreTable:
        """The open probabilities as scores: every query head gets its unit's, every neuron and layer its own.

        With neuron gates, head and neuron scores are P times the unit's price (a head's share
        of its unit's): `select` spends a cost budget on the units with the least score per unit
        of cost saved, so it then closes the least open units first, whatever their kind. On the
        bare probabilities it took every head (0.87 open) before any neuron (0.18 open) on a
        tiny encoder, a head saving 48 times a neuron's FLOPs."""
        head_scores, neuron_scores, layer_scores = (part.double() for part in self.parts(p))
        if self.gates_ffn:
            sizes = torch.tensor([len(hs) for _, hs in self.head_units], dtype=torch.float64)
            head_scores, neuron_scores = head_scores * self.head_price / sizes, neuron_scores * self.neuron_price
        heads_p, layers_p = head_scores.tolist(), layer_scores.tolist()
        heads = {
            layer: {h: heads_p[u] for h, u in zip(kept, index.tolist())}
            for layer, kept, index in zip(self.layers, self.heads, self.unit_of)
        }
        ffn: dict = {}
        if self.gates_ffn:
            ffn = {
                "ffn": {layer: part.tolist() for layer, part in zip(self.layers, neuron_scores.split(self._widths()))},
                "ffn_kept": dict(zip(self.layers, self.neurons)),
                "num_ffn": self.num_ffn,
            }
        return ScoreTable(
            heads=heads,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            layers=dict(zip(self.layers, layers_p)) if self.gates_layers else None,
            cost=self.cost,
            method="learned",
            layer_method="learned" if self.gates_layers else None,
            objective=objective,
            samples=samples,
            config={**config, **({"layers": "learned"} if self.gates_layers else {})},
            **ffn,
        )


def _head_units(layout) -> tuple[list[tuple[int, list[int]]], list[torch.Tensor]]:
    """Head units (layer, [original heads]): single heads, or whole KV groups for GQA layers;
    and per layer, the unit index of each kept head position."""
    units: list[tuple[int, list[int]]] = []
    unit_of: list[torch.Tensor] = []
    for layer, kept in zip(layout.layers, layout.heads):
        group = layout.num_heads[layer] // layout.num_kv_heads[layer]
        first = len(units)
        groups = sorted({h // group for h in kept})
        units += [(layer, [h for h in kept if h // group == g]) for g in groups]
        unit_of.append(torch.tensor([first + groups.index(h // group) for h in kept], dtype=torch.long))
    return units, unit_of
