"""The 1.1 B LLaMA shape the LLM-scale benchmarks build from a config (TinyLlama's), as options."""

from __future__ import annotations

import argparse


def add_llama_shape(parser: argparse.ArgumentParser) -> None:
    """--layers, --hidden, --heads, --kv-heads, --head-dim, --intermediate, --vocab (1.1 B by default)."""
    parser.add_argument("--layers", type=int, default=22)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--intermediate", type=int, default=5632)
    parser.add_argument("--vocab", type=int, default=32000)
