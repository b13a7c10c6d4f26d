"""`headprune inspect`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from headprune_cli.cli.common import console, print_json
from headprune_cli.model.checkpoint import read_layout_only
from headprune_cli.model.describe import describe
from headprune_cli.model.formats.engines import serving, serving_line
from headprune_cli.model.layout import info_of


def inspect(
    checkpoint: Annotated[Path, typer.Argument(help="A headprune checkpoint.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON object on stdout instead of a table.")] = False,
    seq_len: Annotated[int, typer.Option("--seq-len", min=1, help="Sequence length for FLOPs per token.")] = 128,
) -> None:
    """Show a checkpoint: family, layers, heads kept (original indices), params, FLOPs, KV cache, provenance,
    and the serving engines that load it (transformers, vllm, llama.cpp, onnxruntime) through which export.

    Examples:

      headprune inspect small.safetensors

      headprune inspect small.safetensors --json | jq .heads
    """
    # Header and metadata only: the model is built on the meta device, no weight is read.
    model = read_layout_only(checkpoint)
    facts = describe(model, seq_len)
    ways = serving(info_of(model))  # runs the exports' checks (and the GGUF vocabulary): once
    facts["engines"] = {s.engine: {"loads": s.loads, "export": s.export, "why": s.why} for s in ways}
    if as_json:
        print_json(facts)
        return
    table = Table(title=f"{checkpoint}", show_header=True)
    table.add_column("layer", justify="right")
    table.add_column("heads kept (original indices)")
    table.add_column("kv heads")
    table.add_column("FFN width", justify="right")
    kv = facts["kv_cache"]
    if kv:
        table.add_column(f"KV cache B/token ({kv['dtype']})", justify="right")
    for layer in facts["layers"]:
        row = [str(layer), _ints(facts["heads"][str(layer)]), _ints(facts["kv_heads"][str(layer)]), _ffn(facts, layer)]
        table.add_row(*row, *([f"{kv['per_layer'][str(layer)]:,}"] if kv else []))
    console.print(
        f"[bold]{facts['family']}[/] {facts['architecture']} ({facts['task']}), "
        f"{facts['num_layers']}/{facts['original_num_layers']} layers, "
        f"{facts['kept_heads']}/{facts['original_heads']} heads, {facts['params']:,} params, "
        f"{facts['flops_per_token'] / 1e6:,.2f} MFLOPs/token at seq {seq_len}"
    )
    console.print(table)
    console.print(
        f"KV cache: {kv['total']:,} bytes per token ({kv['dtype']})"
        if kv
        else "KV cache: n/a (an encoder keeps no KV cache)"
    )
    console.print(serving_line(ways), soft_wrap=True, markup=False)
    root = facts["provenance"].get("root")
    console.print(f"root: {root[:12] if root else '(this is a root model)'}")


def _ffn(facts: dict, layer: int) -> str:
    kept, original = facts["ffn"][str(layer)], facts["original_ffn"][str(layer)]
    return f"{kept:,}" if kept == original else f"{kept:,}/{original:,}"


def _ints(values: list[int]) -> str:
    return " ".join(str(v) for v in values)
