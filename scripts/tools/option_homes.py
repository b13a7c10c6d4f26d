"""How many places declare each shared option: the check that every option has one home.

Reads the source (no import), so it measures any checkout:

    python scripts/tools/option_homes.py [ROOT]

A *declaration* is a class field that states an option's help or its library default: a
field set by `option(...)` in an options model, or a field of a dataclass (the hand-mapped
twins that copied stage options). A field typed by a shared option type that only picks
its own default (`batch_size: BatchSize = 32`) is counted apart, as a default.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

SHARED = {
    "budget": ("ratio", "target_params", "target_flops"),
    "constraints": (
        "min_heads",
        "multiple_of",
        "protect",
        "uniform",
        "min_ffn",
        "ffn_multiple_of",
        "gqa_unit",
        "runtime",
    ),
    "seed": ("seed",),
    "device": ("device", "dtype"),
    "data/tokenization": ("max_length", "batch_size", "samples"),
    "lora": ("lora", "lora_rank", "lora_alpha", "lora_dropout", "lora_targets", "keep_adapter"),
    "recovery": (
        "epochs",
        "steps",
        "lr",
        "grad_accum",
        "warmup",
        "kd_weight",
        "kd_temperature",
        "hidden_weight",
        "state_dir",
        "save_every",
        "resume",
        "recompute",
        "autocast",
        "fsdp",
    ),
}


def _is_dataclass(node: ast.ClassDef) -> bool:
    return any(
        (isinstance(d, ast.Name) and d.id == "dataclass")
        or (isinstance(d, ast.Call) and getattr(d.func, "id", None) == "dataclass")
        for d in node.decorator_list
    )


def _is_option(value: ast.expr | None) -> bool:
    return isinstance(value, ast.Call) and str(getattr(value.func, "id", "")).endswith("option")


def homes(root: Path) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(option -> the classes that declare it, option -> the classes that only set its default)."""
    names = {n for group in SHARED.values() for n in group}
    declared: dict[str, list[str]] = defaultdict(list)
    defaults: dict[str, list[str]] = defaultdict(list)
    for path in sorted((root / "headprune_cli").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            twin = _is_dataclass(node)
            for item in node.body:
                if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                    continue
                name = item.target.id
                if name not in names:
                    continue
                where = f"{path.relative_to(root)}:{node.name}"
                if _is_option(item.value) or (twin and _twin_of_options(node)):
                    declared[name].append(where)
                elif not twin and item.value is not None:
                    defaults[name].append(where)
    return declared, defaults


def _twin_of_options(node: ast.ClassDef) -> bool:
    """Dataclasses that copy a stage's options (their names say so: *Config, *Settings, *Options)."""
    return node.name.endswith(("Config", "Settings", "Options"))


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else ".").resolve()
    declared, defaults = homes(root)
    print(f"{'group':<18} {'option':<16} declared  defaults-only")
    for group, options in SHARED.items():
        for name in options:
            print(f"{group:<18} {name:<16} {len(declared.get(name, [])):>8}  {len(defaults.get(name, [])):>13}")
    if "-v" in argv:
        for name in sorted(declared):
            print(name, *declared[name], sep="\n  ")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
