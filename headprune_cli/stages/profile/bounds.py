"""How large a latency table can honestly be, checked on the raw JSON before the schema
builds a single object from it.

`profile` writes at most MAX_POINTS points per curve (its --points bound), one entry per
layer of a model of at most MAX_LAYERS layers (config_check's bound), and two phases; its
largest table is about 57 MB of indented JSON. A table beyond these bounds was made
elsewhere: refused on its file size (MAX_TABLE_BYTES, before it is read) or on the length
of a list (here, before pydantic turns a million points into a million objects). Every
time is a positive number of milliseconds no larger than MAX_MS, so that no sum or ratio
of them overflows (a 1e308 table) and no prediction reaches zero.
"""

from __future__ import annotations

from typing import Any

from headprune_cli.artifacts.schema import MAX_BYTES

MAX_POINTS = 64  # profile --points allows at most 64
MAX_LAYERS = 1024  # model/config_check.py: a model has 1 to 1024 layers
MAX_TABLE_BYTES = MAX_BYTES["latency"]  # the artifact reader's size check
MIN_MS = 1e-6  # a nanosecond: nothing a device times is faster
MAX_MS = 1e9  # about 11 days for one block: beyond any measurement, far from overflow
WHOLE_BLOCK_TOLERANCE = 1e-6  # relative: profile writes the two curves' last point as one value


def check_raw(data: Any) -> None:
    """Refuse a latency table's raw JSON whose lists or maps exceed what profile writes
    (ValueError naming the field); anything else malformed is left to the schema."""
    if not isinstance(data, dict):
        return
    model = data.get("model")
    if isinstance(model, dict):
        for key in ("num_heads", "num_kv_heads", "num_ffn", "layers", "heads", "kv_heads", "ffn"):
            _at_most(model.get(key), MAX_LAYERS, f"model.{key}", "layers")
    phases = data.get("phases")
    if not isinstance(phases, dict):
        return
    _at_most(phases, 2, "phases", "phases (forward and decode)")
    for name, phase in phases.items():
        layers = phase.get("layers") if isinstance(phase, dict) else None
        _at_most(layers, MAX_LAYERS, f"phases.{name}.layers", "layers")
        for layer, points in layers.items() if isinstance(layers, dict) else ():
            for curve in ("attention", "ffn"):
                found = points.get(curve) if isinstance(points, dict) else None
                _at_most(found, MAX_POINTS, f"phases.{name}.layers.{layer}.{curve}", "points per curve")


def _at_most(value: Any, limit: int, where: str, what: str) -> None:
    if isinstance(value, (list, dict)) and len(value) > limit:
        raise ValueError(f"{where}: {len(value)} entries, more than any table profile writes (at most {limit} {what})")
