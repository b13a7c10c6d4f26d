"""What a report measures and gates, and where: the options `build_report` reads.

The `report` stage's options are these plus its files (stage.py); the library receives the
options object itself. No torch here: the options read without it.
"""

from __future__ import annotations

from pathlib import Path

from headprune_cli.model.llama_cpp_env import ENGINE_PYTHON_HELP
from headprune_cli.stages.options import DeviceOptions, TimingOptions
from headprune_cli.stages.unit import option

# The report's `config` records these, in the order reports have always recorded them (so that
# a report's bytes stay), with the baseline; onnx and gguf only when given.
CONFIG_KEYS = (
    "batch_size",
    "seq_len",
    "threads",
    "repeats",
    "warmup",
    "max_drop",
    "max_rel_drop",
    "min_speedup",
    "device",
    "dtype",
    "decode_prompt",
    "decode_tokens",
    "decode_batch",
    "latency",
    "onnx",
    "gguf",
)


class ReportSettings(TimingOptions, DeviceOptions):
    max_drop: float | None = option(
        None,
        "Gate: largest allowed drop of the main metric, in points (accuracy/F1/fidelity x100) or in perplexity.",
        ge=0,
    )
    max_rel_drop: float | None = option(
        None, "Gate: largest allowed relative drop of the main metric (0.02 = 2%).", ge=0
    )
    min_speedup: float | None = option(
        None, "Gate: smallest allowed measured speedup (baseline median / pruned median).", ge=0
    )
    batch_size: int = option(8, "Batch size for evaluation and latency.", ge=1)
    seq_len: int | None = option(
        None,
        "Sequence length for FLOPs, latency, and the evaluation's max length (default: 128, "
        "or the model's maximum when smaller).",
        ge=1,
    )
    repeats: int = option(10, "Timed runs per model after warm-up; 0 skips latency.", ge=0)
    # Serving a causal LM (ignored for encoders): KV cache on, prefill then decode, timed like --repeats.
    decode_prompt: int | None = option(
        None,
        "Causal LMs: prompt tokens prefilled before decoding (default: 128, or fewer to fit the model's positions).",
        ge=1,
    )
    decode_tokens: int = option(
        32,
        "Causal LMs: tokens generated one by one with the KV cache, timed as decode throughput; 0 skips decode.",
        ge=0,
    )
    decode_batch: int = option(1, "Causal LMs: sequences decoded together.", ge=1)
    latency: Path | None = option(
        None,
        "The baseline's latency table (`headprune profile`): adds its predicted speedup beside "
        "the measured one (cost.latency).",
    )
    onnx: Path | None = option(
        None,
        "The shipped ONNX file exported from --model (`export --onnx`, int8 with --quantize): evaluated, timed and "
        "gated in onnxruntime (CPU) in place of the PyTorch model.",
    )
    gguf: Path | None = option(
        None,
        "The shipped GGUF file exported from --model (`export --gguf`, a causal LM): evaluated, timed and gated "
        "in llama.cpp (CPU, f32 KV cache) in place of the PyTorch model.",
    )
    engine_python: Path | None = option(None, "With --gguf: " + ENGINE_PYTHON_HELP)
