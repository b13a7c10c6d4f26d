"""The `latency` artifact: what `profile` measured, validated on read (no torch here).

Payload after the envelope: the device (type, name), torch version, threads, batch,
sequence length and dtype it was measured at; the model it belongs to (sha256 and shape:
kept layers, heads, KV heads and FFN width per layer); the grid and timing settings; and
per phase ("forward": one pass over batch x seq; "decode": one token per sequence against
a KV cache of `context` tokens) the fixed rest and, per layer, the block's latency at each
grid point with its interquartile range. A reader refuses points that are not finite and
positive, grids that do not end at the layer's full size, and latencies that fall as
units are added by more than the measurements' own spread (a table made elsewhere, or
edited).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ValidationError, field_validator, model_validator

from headprune_cli.artifacts.schema import Envelope, Strict, index_map
from headprune_cli.stages.profile.bounds import MAX_MS, MIN_MS, WHOLE_BLOCK_TOLERANCE, check_raw

# A point may sit below a smaller one by its spread (IQR) or this share of its median:
# timing noise, not a table that says fewer units cost more.
MONOTONE_SLACK = 0.10


class Point(Strict):
    median_ms: float
    q1_ms: float
    q3_ms: float

    @model_validator(mode="after")
    def _ordered(self) -> Point:
        if not (0 < self.q1_ms <= self.median_ms <= self.q3_ms):
            raise ValueError(
                f"a point needs 0 < q1 <= median <= q3 (got {self.q1_ms}, {self.median_ms}, {self.q3_ms} ms)"
            )
        if self.q1_ms < MIN_MS or self.q3_ms > MAX_MS:
            raise ValueError(
                f"times of {self.q1_ms:.4g} to {self.q3_ms:.4g} ms are beyond any measurement "
                f"({MIN_MS:g} to {MAX_MS:g} ms); profile the model again"
            )
        return self


class AttentionPoint(Point):
    units: int  # KV groups kept (GQA), else heads
    heads: int  # query heads kept


class FFNPoint(Point):
    width: int


class LayerPoints(Strict):
    measured_as: int  # the original layer whose block was timed (a layer of the same shape)
    attention: list[AttentionPoint]
    ffn: list[FFNPoint]

    @classmethod
    def problem(cls, points: dict) -> str | None:
        """What makes measured points unfit for a table (None: fit)."""

        try:
            cls.model_validate(points | {"measured_as": 0})
        except ValidationError as exc:
            return str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
        return None

    @model_validator(mode="after")
    def _grids(self) -> LayerPoints:
        for name, points, size in (("attention", self.attention, "units"), ("ffn", self.ffn, "width")):
            counts = [getattr(p, size) for p in points]
            if not counts or counts[0] < 1 or any(b <= a for a, b in zip(counts, counts[1:])):
                raise ValueError(f"{name}: grid points must be positive and strictly increasing (got {counts})")
            problem = not_monotone(name, size, points)
            if problem:
                raise ValueError(problem)
        return self._one_whole_block()

    def _one_whole_block(self) -> LayerPoints:
        """Both curves end at the whole block (all units, full width): one time, which profile
        writes as both last points. Two different ends would let a plan's prediction fall
        below zero (a cut saving more than the block costs)."""
        a, f = self.attention[-1].median_ms, self.ffn[-1].median_ms
        if abs(a - f) > WHOLE_BLOCK_TOLERANCE * max(a, f):
            raise ValueError(
                f"the attention curve ends at {a:.6g} ms and the FFN curve at {f:.6g} ms; both end at the "
                "whole block, which profile times once (an edited or inconsistent table: profile the model again)"
            )
        return self


def not_monotone(name: str, size: str, points: list) -> str | None:
    """What is wrong when more units take less time than fewer, beyond the spread; else None."""
    for small, big in zip(points, points[1:]):
        slack = max(small.q3_ms - small.q1_ms, big.q3_ms - big.q1_ms, MONOTONE_SLACK * big.median_ms)
        if big.median_ms < small.median_ms - slack:
            return (
                f"{name} is not monotone: {getattr(big, size)} {size} take {big.median_ms:.4g} ms, fewer "
                f"({getattr(small, size)}) take {small.median_ms:.4g} ms, beyond the measured spread"
            )
    return None


class Phase(Strict):
    context: int | None = None  # decode: KV-cache tokens each step attends to
    outside: Point
    layers: dict[int, LayerPoints]

    @field_validator("layers", mode="before")
    @classmethod
    def _maps(cls, value):
        return index_map(value) if isinstance(value, dict) else value


class Device(Strict):
    type: str  # cpu | cuda
    name: str
    index: int | None = None


class ModelShape(Strict):
    sha256: str
    family: str
    num_heads: list[int]  # original query heads per original layer
    num_kv_heads: list[int]
    num_ffn: list[int]  # original FFN widths
    layers: list[int]  # original indices of the kept layers
    heads: dict[int, int]  # kept layer -> query heads it keeps
    kv_heads: dict[int, int]
    ffn: dict[int, int]  # kept layer -> FFN width it keeps

    @field_validator("heads", "kv_heads", "ffn", mode="before")
    @classmethod
    def _maps(cls, value):
        return index_map(value) if isinstance(value, dict) else value


class LatencyTableArtifact(Envelope):
    kind: Literal["latency"]
    device: Device
    torch_version: str
    threads: int | None
    batch: int
    seq_len: int
    dtype: str
    model: ModelShape
    grid: dict
    timing: dict
    phases: dict[Literal["forward", "decode"], Phase]

    @model_validator(mode="before")
    @classmethod
    def _bounded(cls, data):
        check_raw(data)  # list lengths, before any point becomes an object
        return data

    @model_validator(mode="after")
    def _consistent(self) -> LatencyTableArtifact:
        shape = self.model
        for name in ("heads", "kv_heads", "ffn"):
            if sorted(getattr(shape, name)) != sorted(shape.layers):
                raise ValueError(
                    f"model.{name}: layers {sorted(getattr(shape, name))} are not the kept layers {shape.layers}"
                )
        if any(q < 1 or kv < 1 or q % kv for q, kv in zip(shape.heads.values(), shape.kv_heads.values())):
            raise ValueError("model: every layer needs at least one head, and query heads a multiple of KV heads")
        if "forward" not in self.phases:
            raise ValueError("a latency table needs the forward phase")
        for name, phase in self.phases.items():
            if sorted(phase.layers) != sorted(shape.layers):
                raise ValueError(f"phases.{name}: layers {sorted(phase.layers)} are not the model's {shape.layers}")
            for layer, points in phase.layers.items():
                group = shape.heads[layer] // shape.kv_heads[layer]
                full = shape.kv_heads[layer] if group > 1 else shape.heads[layer]
                if points.attention[-1].units != full or points.ffn[-1].width != shape.ffn[layer]:
                    raise ValueError(
                        f"phases.{name}.layers.{layer}: the grid must end at the layer's {full} units and "
                        f"{shape.ffn[layer]} FFN neurons"
                    )
                if points.measured_as not in phase.layers:
                    raise ValueError(f"phases.{name}.layers.{layer}: measured_as names no layer of the table")
        return self
