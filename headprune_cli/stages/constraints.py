"""The constraints every plan respects, whoever chooses it (select, prune, search, iterate,
learned gates), and the serving engines' shape rules that become constraints.

A value of its own below the stage packages: the shared option groups (options.py) build it
from the command line, the choosers (select/) read it, the plans record it. Nothing here
imports torch: `select --help` stays fast.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from headprune_cli.errors import UsageError, shorten

# What `--runtime` names; which plans each engine loads: select/runtime.py.
RUNTIMES = ("transformers", "vllm", "llama.cpp", "onnxruntime")


@dataclass(frozen=True)
class Constraints:
    min_heads: int = 1
    multiple_of: int = 1
    protect: tuple[tuple[int, int], ...] = ()  # (original layer, original head)
    drop_layers: int = 0
    layer_threshold: float | None = None
    gqa_unit: str = "group"  # group | head
    uniform: bool = False  # every kept layer keeps the same number of heads and KV groups (and FFN width)
    min_ffn: int | None = None  # FFN neurons every kept layer keeps at least (None: ffn_multiple_of)
    ffn_multiple_of: int = 8  # kept FFN widths are multiples of this (GPU matrix tiles want multiples of 8)
    uniform_heads: bool = False  # the same heads and KV groups in every kept layer, FFN widths free (vLLM)
    runtime: str | None = None  # the engine the plan is chosen for (select/runtime.py), recorded
    gguf_type: str | None = None  # with runtime llama.cpp: the GGUF type whose grid ffn_multiple_of keeps

    def to_dict(self, ffn: bool = False) -> dict:
        """As plans record them; the FFN keys only for plans that may cut FFN neurons, so
        head-only plans keep the bytes they always had."""
        out = asdict(self)
        out["protect"] = [f"{layer}:{head}" for layer, head in self.protect]
        if not ffn:
            del out["min_ffn"], out["ffn_multiple_of"]
        for key in ("uniform_heads", "runtime", "gguf_type"):  # recorded when set: plans keep their bytes
            if not out[key]:
                del out[key]
        return out


def parse_protect(text: str | None) -> tuple[tuple[int, int], ...]:
    """'0:3,2:1' -> ((0, 3), (2, 1))."""
    if not text:
        return ()
    out = []
    for item in text.split(","):
        parts = item.strip().split(":")
        # ASCII digits only: str.isdigit() also accepts "²", which int() refuses.
        if len(parts) != 2 or not all(re.fullmatch(r"[0-9]{1,9}", p.strip()) for p in parts):
            raise UsageError(f"--protect: {shorten(item.strip())} is not LAYER:HEAD (e.g. 0:3,2:1)")
        out.append((int(parts[0]), int(parts[1])))
    return tuple(sorted(set(out)))


def check_runtime(name: str | None) -> str | None:
    if name is not None and name not in RUNTIMES:
        raise UsageError(f"unknown --runtime {name!r}; available: {', '.join(RUNTIMES)}")
    return name


def shape_rules(runtime: str | None) -> dict[str, bool]:
    """The Constraints fields a runtime sets: uniform (heads and FFN) or uniform_heads (heads only).
    transformers loads one config for all layers; vLLM's nemotron-nas blocks one query-head count."""
    return {"uniform": runtime == "transformers", "uniform_heads": runtime == "vllm"}
