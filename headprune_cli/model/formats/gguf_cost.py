"""What one decoded token reads from a GGUF file in llama.cpp: the bytes model of decode speed.

Decode at batch 1 waits on memory: each step reads every weight matrix once and the KV cache of
the context. From the file itself (its tensors at their own types' bits per weight, and its
attention metadata):
- weights: every tensor's bytes, except the token embedding when the file has a separate output
  head (decoding gathers one row of it); a tied embedding is the output head and is read whole;
- KV: per kept layer, head_count_kv x (key_length + value_length) values at llama.cpp's default
  f16 cache, times the context, read once: llama.cpp writes a step's keys and values into its
  preallocated cache in place, where transformers' cache is copied whole each step (report's
  PyTorch model, model/cost.decode_cost, counts KV_CACHE_PASSES = 3 for that).
A prediction of decode tokens/s is a bandwidth (tokens/s x bytes of a file measured alongside)
over these bytes.
"""

from __future__ import annotations

import os

F16_BYTES = 2  # llama.cpp's default KV-cache type


def decode_bytes(path: str | os.PathLike, context: float, kv_bytes: int = F16_BYTES) -> dict:
    """Bytes one decode step reads from the GGUF file at `path` with `context` tokens cached:
    {"weights", "kv", "total"} (see the module docstring)."""
    import gguf  # noqa: PLC0415 (an optional extra)

    reader = gguf.GGUFReader(path)
    tensors = {t.name: int(t.n_bytes) for t in reader.tensors}
    separate_head = "output.weight" in tensors
    weights = sum(n for name, n in tensors.items() if not (name == "token_embd.weight" and separate_head))
    per_token = sum(kv * (k + v) for kv, k, v in _kv_shapes(reader)) * kv_bytes
    kv_read = per_token * context
    return {"weights": weights, "kv": kv_read, "total": weights + kv_read}


def _kv_shapes(reader) -> list[tuple[int, int, int]]:
    """(KV heads, key length, value length) per layer, from the architecture's metadata."""
    arch = _value(reader, "general.architecture")
    layers = int(_value(reader, f"{arch}.block_count"))
    kv = _value(reader, f"{arch}.attention.head_count_kv")
    kv = list(kv) if isinstance(kv, list) else [kv] * layers
    key = _value(reader, f"{arch}.attention.key_length")
    if key is None:  # llama.cpp's default: hidden / query heads of layer 0
        heads = _value(reader, f"{arch}.attention.head_count")
        key = _value(reader, f"{arch}.embedding_length") // (heads[0] if isinstance(heads, list) else heads)
    value = _value(reader, f"{arch}.attention.value_length") or key
    return [(int(n), int(key), int(value)) for n in kv]


def _value(reader, name: str):
    field = reader.get_field(name)
    return None if field is None else field.contents()
