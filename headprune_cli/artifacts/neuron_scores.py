"""FFN neuron scores inside a scores artifact, kept compact.

A large model has millions of neurons (LLaMA-70B: 80 x 28,672), so the artifact does not
spell them out as JSON numbers: per layer it stores the kept neurons as [start, stop)
runs of original indices and their scores as one base64 string of little-endian float32
(4 bytes a neuron, about 12 MB of text for LLaMA-70B, decoded with one numpy call). The
artifact stays one JSON file, so `score --ffn | select` still works as a pipe, and its
sha256 (which plans record) covers the neuron scores too. float32 keeps 7 significant
digits, more than any ranking of calibration-set scores can use; the encoding is exact
and deterministic, so the same scores give the same bytes.
"""

from __future__ import annotations

import base64
import binascii
import math

from pydantic import BaseModel, ConfigDict, PrivateAttr, field_validator, model_validator

from headprune_cli.ranges import MAX_FFN_NEURONS, MAX_FFN_WIDTH, from_ranges, to_ranges

ENCODING = "float32-le-base64"


def encode(values) -> str:
    import numpy as np  # noqa: PLC0415 (keeps numpy out of this module's import)

    return base64.b64encode(np.asarray(values, dtype="<f4").tobytes()).decode("ascii")


def decode(text: str, count: int) -> list[float]:
    """`count` float32 values from their base64 text; refuses any other length or non-finite values."""
    if len(text) != 4 * math.ceil(4 * count / 3):
        raise ValueError(f"holds {len(text)} characters, not the {count} scores the layer keeps")
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise ValueError("is not base64") from None
    import numpy as np  # noqa: PLC0415 (keeps numpy out of this module's import)

    values = np.frombuffer(raw, dtype="<f4")
    if len(values) != count or not np.isfinite(values).all():
        raise ValueError("scores are not finite float32 values, one per kept neuron")
    return values.astype(np.float64).tolist()


class FFNLayer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kept: list[list[int]]  # original neuron indices the scored model keeps, as [start, stop) runs
    scores: str  # ENCODING of one score per kept neuron, in the order of `kept`
    _kept: list[int] = PrivateAttr(default_factory=list)  # `kept` expanded, set when validated
    _values: list[float] = PrivateAttr(default_factory=list)  # `scores` decoded, set when validated

    def kept_indices(self) -> list[int]:
        return self._kept

    def values(self) -> list[float]:
        return self._values


class FFNScores(BaseModel):
    """`ffn` of a scores artifact: per original layer, kept neurons and their scores."""

    model_config = ConfigDict(extra="forbid")

    encoding: str
    width: list[int]  # original FFN width of every original layer
    layers: dict[int, FFNLayer]
    loss: dict[int, float] | None = None  # loss change of removing a layer's whole FFN (loo/refit layers)

    @field_validator("encoding")
    @classmethod
    def _known(cls, value: str) -> str:
        if value != ENCODING:
            raise ValueError(f"unknown neuron-score encoding {value!r} (known: {ENCODING})")
        return value

    @model_validator(mode="after")
    def _in_range(self) -> FFNScores:
        if (
            not all(isinstance(w, int) and 1 <= w <= MAX_FFN_WIDTH for w in self.width)
            or sum(self.width) > MAX_FFN_NEURONS
        ):
            raise ValueError("ffn.width: one positive FFN width per layer, within bounds")
        for layer, entry in self.layers.items():
            if not 0 <= layer < len(self.width):
                raise ValueError(f"ffn.layers.{layer}: layer out of range")
            kept = from_ranges(entry.kept, self.width[layer])
            if not kept:
                raise ValueError(
                    f"ffn.layers.{layer}.kept: [start, stop) runs of neuron indices, increasing, within the width"
                )
            entry._kept = kept
            try:
                entry._values = decode(entry.scores, len(kept))  # decoded once, here: readers take it from values()
            except ValueError as exc:
                raise ValueError(f"ffn.layers.{layer}.scores {exc}") from None
        return self


def ffn_block(
    width: list[int], kept: dict[int, list[int]], scores: dict[int, list[float]], loss: dict[int, float] | None
) -> dict:
    """The artifact's `ffn` object."""
    block = {
        "encoding": ENCODING,
        "width": list(width),
        "layers": {str(l): {"kept": to_ranges(kept[l]), "scores": encode(scores[l])} for l in sorted(scores)},
    }
    if loss is not None:
        block["loss"] = {str(l): float(v) for l, v in sorted(loss.items())}
    return block
