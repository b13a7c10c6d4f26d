"""Hostile inputs that claim memory or time: made here, used by the tests and by
scripts/benchmarks/hostile.py (which measures what each one costs).

Each maker writes into a folder and returns the command line that feeds the file to
headprune; the workspace must hold the demo `model.safetensors`.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path


def _rewrite_metadata(source: Path, target: Path, change) -> None:
    """Copy a checkpoint with its header's headprune metadata edited (tensor bytes kept)."""
    raw = source.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    meta = header["__metadata__"]
    config, layout = json.loads(meta["headprune.config"]), json.loads(meta["headprune.layout"])
    change(config, layout)
    meta["headprune.config"], meta["headprune.layout"] = json.dumps(config), json.dumps(layout)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    target.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + length :])


def many_layers(folder: Path, layers: int = 30000) -> list:
    """A ~2 MB checkpoint whose config and layout declare `layers` layers (it stores 2)."""

    def change(config: dict, layout: dict) -> None:
        heads = config["heads_per_layer"]
        config["heads_per_layer"] = heads + [heads[0]] * (layers - len(heads))
        layout["num_heads"] = list(config["heads_per_layer"])
        layout["num_kv_heads"] = list(config["heads_per_layer"])

    _rewrite_metadata(folder / "model.safetensors", folder / "layers.safetensors", change)
    return ["score", folder / "layers.safetensors", "--data", folder / "data.jsonl"]


def wide_config(folder: Path) -> list:
    """The 566 KB demo model with a config that declares an MLP of 400,000 units per layer
    and a vocabulary of 2,000,000 (building it takes gigabytes)."""

    def change(config: dict, layout: dict) -> None:
        config["intermediate_size"] = 400_000
        config["vocab_size"] = 2_000_000

    _rewrite_metadata(folder / "model.safetensors", folder / "wide.safetensors", change)
    return ["score", folder / "wide.safetensors", "--data", folder / "data.jsonl"]


def long_line(folder: Path, megabytes: int = 50) -> list:
    """A JSONL data file whose one row holds `megabytes` MB of text."""
    word = "wonderful "
    text = word * (megabytes * 1024 * 1024 // len(word))
    (folder / "long.jsonl").write_text(json.dumps({"text": text, "label": 1}) + "\n")
    return ["score", folder / "model.safetensors", "--data", folder / "long.jsonl", "-o", folder / "long-scores.json"]


def alias_bomb(folder: Path) -> list:
    """The ~530-byte 'billion laughs' YAML: nine levels of nine aliases."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev}]")
    lines.append("model: *i\nstages: [{command: score}]")
    (folder / "bomb.yaml").write_text("\n".join(lines) + "\n")
    return ["run", folder / "bomb.yaml", "--out", folder / "out"]


BOMBS = {"many-layers": many_layers, "wide-config": wide_config, "long-line": long_line, "alias-bomb": alias_bomb}
