"""A measured latency table as prices: what `select` and `report` read from `profile`.

Per layer the table holds the block's latency at a few kept-unit counts (KV groups, or
heads without GQA) and FFN widths. Two readings of it:
- `LatencyTable.predict_ms`: a plan's latency by piecewise-linear interpolation between
  the measured points (linear extrapolation below the smallest), a layer at (k units,
  w neurons) costing B - (A(all) - A(k)) - (F(all) - F(w)) (at least 0), plus the measured
  rest (positive: the reader refuses times outside 1e-6..1e9 ms), so a prediction is never
  zero or less; B, the whole block, is both curves' last point (the reader refuses a table
  whose two curves end apart);
- `priced`: the same table as linear prices (ms per query head, per KV head and per FFN
  neuron, fixed ms per layer, ms outside the layers), fitted by least squares over the
  points, in a CostTable's FLOPs fields, so the one-scale selection machinery that spends
  a FLOPs budget spends milliseconds unchanged.
Medians are made monotone first (pool-adjacent-violators): the reader already refused
tables that fall by more than their spread, so what is left is noise. No torch here.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass, replace

from headprune_cli.model.cost_table import CostTable


@dataclass(frozen=True)
class Curve:
    """A non-decreasing piecewise-linear function through measured (x, ms) points."""

    xs: tuple[float, ...]
    ms: tuple[float, ...]

    @classmethod
    def of(cls, xs, ms) -> Curve:
        return cls(tuple(float(x) for x in xs), tuple(_monotone([float(m) for m in ms])))

    def __call__(self, x: float) -> float:
        if len(self.xs) == 1:
            return self.ms[0] * x / self.xs[0]
        i = min(max(bisect_left(self.xs, x), 1), len(self.xs) - 1)
        x0, x1, y0, y1 = self.xs[i - 1], self.xs[i], self.ms[i - 1], self.ms[i]
        return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))

    def slope(self) -> float:
        """Least-squares ms per unit over the points (0 when the points are flat)."""
        if len(self.xs) == 1:
            return self.ms[0] / self.xs[0]
        mx, my = sum(self.xs) / len(self.xs), sum(self.ms) / len(self.ms)
        var = sum((x - mx) ** 2 for x in self.xs)
        return max(0.0, sum((x - mx) * (y - my) for x, y in zip(self.xs, self.ms)) / var)

    @property
    def full(self) -> float:
        return self.ms[-1]


def _monotone(values: list[float]) -> list[float]:
    """The closest non-decreasing sequence (pool adjacent violators, equal weights)."""
    blocks: list[list[float]] = []  # [sum, count]
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, n = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += n
    return [s / n for s, n in blocks for _ in range(int(n))]


@dataclass(frozen=True)
class LayerCurves:
    layer: int
    group: int  # query heads per unit in the profiled layer
    attention: Curve  # over units kept
    ffn: Curve  # over FFN width kept

    def at(self, units: float, width: float) -> float:
        """The block with `units` attention units and `width` neurons: the whole block, less
        what each curve says its cut saves; never below zero (two deep cuts, each read off
        its own curve, can claim to save more than the block costs)."""
        return max(
            0.0, self.full_ms - (self.attention.full - self.attention(units)) - (self.ffn.full - self.ffn(width))
        )

    @property
    def full_ms(self) -> float:
        """The whole block, timed once by each curve (at all units, and at the full width):
        one estimate, their mean, so the unpruned model's prediction is the table's total."""
        return (self.attention.full + self.ffn.full) / 2


@dataclass(frozen=True)
class LatencyTable:
    outside_ms: float
    layers: dict[int, LayerCurves]
    phase: str
    facts: dict  # device, torch version, threads, batch, seq_len, dtype, context

    @classmethod
    def from_artifact(cls, artifact, phase: str = "forward") -> LatencyTable:
        data = artifact.phases[phase]
        layers = {}
        for layer, points in sorted(data.layers.items()):
            group = artifact.model.heads[layer] // artifact.model.kv_heads[layer]
            attention = Curve.of([p.units for p in points.attention], [p.median_ms for p in points.attention])
            ffn = Curve.of([p.width for p in points.ffn], [p.median_ms for p in points.ffn])
            layers[layer] = LayerCurves(layer, group, attention, ffn)
        facts = {
            "device": artifact.device.model_dump(),
            "torch_version": artifact.torch_version,
            "threads": artifact.threads,
            "batch": artifact.batch,
            "seq_len": artifact.seq_len,
            "dtype": artifact.dtype,
            "context": data.context,
        }
        return cls(data.outside.median_ms, layers, phase, facts)

    def full_ms(self) -> float:
        return self.outside_ms + sum(c.full_ms for c in self.layers.values())

    def predict_ms(self, heads: Mapping[int, int], widths: Mapping[int, float]) -> float:
        """Latency of a model keeping `heads[layer]` query heads and `widths[layer]` FFN
        neurons in each layer it keeps (original indices; layers left out are dropped)."""
        return self.outside_ms + sum(self.layers[l].at(heads[l] / self.layers[l].group, widths[l]) for l in heads)


def priced(table: LatencyTable, cost: CostTable) -> CostTable:
    """`cost` with its FLOPs fields in milliseconds from `table` (params untouched).

    A unit's ms (an attention unit's slope) is split between its query heads and its KV
    head as their FLOPs are; a cost table without FFN prices keeps the FFN's ms in the
    layer's fixed part."""
    layers = []
    for lc in cost.layers:
        curves = table.layers[lc.layer]
        unit_ms, neuron_ms = curves.attention.slope(), curves.ffn.slope()
        group = curves.group
        unit_flops = lc.q_head_flops * group + lc.kv_head_flops
        q_share = lc.q_head_flops * group / unit_flops if unit_flops > 0 else 1.0
        units, width = curves.attention.xs[-1], curves.ffn.xs[-1]
        fixed = curves.full_ms - unit_ms * units - (neuron_ms * width if lc.ffn_width else 0.0)
        layers.append(
            replace(
                lc,
                fixed_flops=fixed,
                q_head_flops=unit_ms * q_share / group,
                kv_head_flops=unit_ms * (1 - q_share),
                ffn_neuron_flops=neuron_ms if lc.ffn_width else 0.0,
            )
        )
    return CostTable(cost.seq_len, cost.outside_params, table.outside_ms, layers)
